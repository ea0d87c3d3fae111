"""manage.py load_demo: the demo the admin is shown with, idempotent."""

import html
import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.models import Publication, Snapshot
from apps.tenancy.models import Application, Membership, Tenant

PASSWORD = "demo-pw-7f3a"


@pytest.fixture
def load_demo(db, monkeypatch, django_capture_on_commit_callbacks):
    """load_demo() -> its output; publications render as the command's work commits."""
    monkeypatch.setenv("BELLWETHER_DEMO_PASSWORD", PASSWORD)

    def run() -> str:
        out = io.StringIO()
        with django_capture_on_commit_callbacks(execute=True):
            call_command("load_demo", stdout=out)
        return out.getvalue()

    return run


def counts() -> dict:
    return {model.__name__: model.objects.count() for model in (
        get_user_model(), Tenant, Membership, Application, Environment, Snapshot,
        Publication, AuditEvent)}


def test_load_demo_creates_shop_staging_and_prod_with_two_ready_snapshots_each(load_demo):
    load_demo()

    tenant = Tenant.objects.get()
    assert (tenant.slug, tenant.name) == ("shop-team", "Shop team")
    application = Application.objects.get()
    assert (application.name, application.tenant) == ("shop", tenant)
    environments = Environment.objects.order_by("name")
    assert [e.full_name for e in environments] == ["shop/prod", "shop/staging"]
    for environment in environments:
        snapshots = list(environment.snapshots.order_by("number"))
        assert [(s.number, s.state) for s in snapshots] == [(1, "ready"), (2, "ready")], [
            s.report for s in snapshots]
        assert snapshots[1].parent == snapshots[0]
        assert snapshots[0].checksum != snapshots[1].checksum
        assert environment.snapshot_counter == 2
        assert sorted(f["path"] for f in snapshots[1].files) == [
            "nginx/sites-enabled/shop.conf", "shop/config.json"]
        assert [f["path"] for f in snapshots[1].fallback_files] == [
            "nginx/sites-enabled/shop.conf"]
    dev = get_user_model().objects.get(username="dev")
    assert Membership.objects.get(tenant=tenant, user=dev).role == "deployer"
    assert get_user_model().objects.get(username="admin").is_superuser


def test_the_demo_prod_is_staged_with_its_second_snapshot_waiting_for_a_rollout(load_demo):
    load_demo()

    staging, prod = (Environment.objects.get(name=name) for name in ("staging", "prod"))
    assert (staging.release_policy, staging.active_snapshot.number) == ("direct", 2)
    assert (prod.release_policy, prod.active_snapshot.number) == ("staged", 1)
    assert AuditEvent.objects.filter(environment=prod, action="snapshot.activate").count() == 1


def test_load_demo_twice_changes_nothing(load_demo):
    load_demo()
    before = counts()

    output = load_demo()

    assert counts() == before
    assert "Environment shop/staging: 2 snapshot(s)" in output
    assert "Environment shop/prod: 2 snapshot(s)" in output


def _signed_in(client, username: str) -> bool:
    """Sign in through the sign-in form, as a person does (the sign-in lockout's
    backend needs the request, which `client.login` does not pass)."""
    response = client.post("/login/", {"username": username, "password": PASSWORD})
    return response.status_code == 302 and "_auth_user_id" in client.session


def test_load_demo_prints_credentials_that_work(load_demo, client):
    output = load_demo()

    assert f"admin / {PASSWORD}" in output
    assert f"dev   / {PASSWORD}" in output
    assert "/admin/" in output
    users = get_user_model().objects
    assert users.get(username="admin").check_password(PASSWORD)
    assert users.get(username="dev").check_password(PASSWORD)
    assert _signed_in(client, "admin")
    assert client.get("/admin/snapshots/snapshot/").status_code == 200


def test_demo_second_snapshot_shows_its_diff_in_the_admin(load_demo, client):
    load_demo()
    assert _signed_in(client, "admin")
    second = Snapshot.objects.get(environment__name="prod", number=2)

    response = client.get(f"/admin/snapshots/snapshot/{second.pk}/change/")

    assert response.status_code == 200
    text = html.unescape(response.content.decode())
    assert "Against #1:" in text
    assert '-  "workers": 4,' in text
    assert '+  "workers": 8,' in text


def test_load_demo_renders_its_snapshots_without_a_worker(db, monkeypatch):
    """Production mode: tasks go to a broker no worker reads; the demo still ends
    with two ready snapshots per environment (the queued renders find them done)."""
    from project.celery import app as celery_app

    monkeypatch.setenv("BELLWETHER_DEMO_PASSWORD", PASSWORD)
    out = io.StringIO()
    eager, celery_app.conf.task_always_eager = celery_app.conf.task_always_eager, False
    try:
        call_command("load_demo", stdout=out)  # inside the test's transaction: nothing sent
    finally:
        celery_app.conf.task_always_eager = eager

    assert "Environment shop/staging: 2 snapshot(s)" in out.getvalue()
    assert "Environment shop/prod: 2 snapshot(s)" in out.getvalue()
    assert sorted(Snapshot.objects.values_list("environment__name", "number", "state")) == [
        ("prod", 1, "ready"), ("prod", 2, "ready"), ("staging", 1, "ready"),
        ("staging", 2, "ready")]
    assert not Publication.objects.filter(state="rendering").exists()


def test_load_demo_again_signs_nobody_out(load_demo, client):
    load_demo()
    assert _signed_in(client, "dev")
    assert client.get("/").status_code == 200
    hashes = dict(get_user_model().objects.values_list("username", "password"))

    load_demo()

    assert dict(get_user_model().objects.values_list("username", "password")) == hashes
    assert client.get("/").status_code == 200  # the session still holds


def test_load_demo_with_a_new_password_sets_it(load_demo, monkeypatch):
    load_demo()
    monkeypatch.setenv("BELLWETHER_DEMO_PASSWORD", "another-pw-9c1d")

    load_demo()

    assert get_user_model().objects.get(username="dev").check_password("another-pw-9c1d")


def test_the_readmes_descriptor_changes_the_demo_apps_config(load_demo):
    """README "Release with a descriptor": its descriptor, dry-run by the demo's
    deployer, changes shop/config.json (the templates use the params)."""
    import re
    from pathlib import Path

    from tests.factories import api_client_for

    load_demo()
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    [printf] = re.findall(r"printf '([^']*)' > /tmp/rel-1.yaml", readme)
    body = printf.encode().decode("unicode_escape")
    dev = get_user_model().objects.get(username="dev")
    response = api_client_for(dev).post("/api/v1/descriptors?dry_run=1", body,
                                         content_type="application/yaml")
    assert response.status_code == 200, response.content
    app = {f["path"]: f["content"] for f in response.json()["files"]}["shop/config.json"]
    assert '"channel": "beta"' in app and '"version": "2.4.0"' in app
    changed = {d["path"]: d for d in response.json()["diff"]}
    assert changed["shop/config.json"]["status"] == "modified", changed
    assert '+    "channel": "beta",' in changed["shop/config.json"]["diff"]
