"""The governance page of the dashboard (approve / reject with a comment, the
freeze banner and override, cancelling a schedule) and the admin (rule saved
through its service, windows refused for a bad timezone, approving the content
its page showed)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.governance import schedules, windows
from apps.governance.models import ApprovalRule, ReleaseWindow
from tests import factories

pytestmark = pytest.mark.django_db

PAGE = "/e/shop/prod/governance/"


def _htmx(client, url, data=None):
    return client.post(url, data or {}, HTTP_HX_REQUEST="true")


def test_the_page_lists_releases_and_an_owner_approves_with_a_comment(activation, alice):
    client = factories.session_client(alice)
    page = client.get(PAGE)
    assert page.status_code == 200 and f"release-{activation.pk}" in page.content.decode()
    response = _htmx(client, f"{PAGE}releases/{activation.pk}/approve/", {
        "checksum": activation.checksum, "plan_digest": activation.plan_digest,
        "comment": "looks right"})
    assert response.status_code == 200 and "1 of 2 approval(s)" in response.content.decode()
    assert activation.approvals.get().comment == "looks right"


def test_the_page_refuses_the_authors_approval_and_a_stale_checksum(activation, deployer,
                                                                    alice, first):
    response = _htmx(factories.session_client(deployer),
                     f"{PAGE}releases/{activation.pk}/approve/",
                     {"checksum": activation.checksum, "plan_digest": activation.plan_digest})
    assert response.status_code == 403 and "author" in response.content.decode()
    response = _htmx(factories.session_client(alice), f"{PAGE}releases/{activation.pk}/reject/",
                     {"checksum": first.checksum, "plan_digest": activation.plan_digest,
                      "comment": "no"})
    assert response.status_code == 409
    assert not activation.approvals.exists()


def test_the_page_shows_a_freeze_and_an_owner_overrides_it(environment, alice, deployer):
    now = timezone.now()
    windows.window_create(environment=environment, actor=alice, kind="freeze", name="sale",
                          starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=1))
    assert "the freeze “sale”" in factories.session_client(deployer).get(PAGE).content.decode()
    response = _htmx(factories.session_client(deployer), f"{PAGE}override/",
                     {"reason": "x", "minutes": "10"})
    assert response.status_code == 403
    response = _htmx(factories.session_client(alice), f"{PAGE}override/",
                     {"reason": "outage", "minutes": "10"})
    assert response.status_code == 200 and "No freeze holds" in response.content.decode()


def test_a_schedule_is_cancelled_from_the_page(activation, deployer, outsider):
    schedule = schedules.schedule_create(release=activation, actor=deployer,
                                         run_at=timezone.now() + timedelta(hours=1),
                                         expected_version=1)
    assert factories.session_client(outsider).get(PAGE).status_code == 404
    response = _htmx(factories.session_client(deployer), f"{PAGE}schedules/{schedule.pk}/cancel/")
    assert response.status_code == 200
    schedule.refresh_from_db()
    assert schedule.state == "cancelled"


def test_the_admin_saves_the_rule_through_its_service(environment, superuser):
    client = factories.session_client(superuser)
    response = client.post("/admin/governance/approvalrule/add/", {
        "environment": environment.pk, "required_approvals": 2, "owners_approve": "on"})
    assert response.status_code == 302, response.content[:2000]
    assert ApprovalRule.objects.get().required_approvals == 2
    assert AuditEvent.objects.filter(action="governance.rule").exists()


def test_the_admin_refuses_a_window_with_a_bad_timezone(environment, superuser):
    client = factories.session_client(superuser)
    form = {"environment": environment.pk, "kind": "freeze", "name": "sale",
            "timezone": "Mars/Base", "weekdays": "[4]", "start_time": "15:00",
            "end_time": "18:00"}
    response = client.post("/admin/governance/releasewindow/add/", form)
    assert response.status_code == 200 and "IANA timezone" in response.content.decode()
    response = client.post("/admin/governance/releasewindow/add/",
                           {**form, "timezone": "Europe/Rome"})
    assert response.status_code == 302
    assert ReleaseWindow.objects.get().timezone == "Europe/Rome"


def test_the_admin_approves_the_content_shown(activation, alice):
    alice.is_staff = True
    alice.save()
    client = factories.session_client(alice)
    page = client.post("/admin/governance/releaserequest/", {
        "action": "approve", "_selected_action": [activation.pk]})
    assert page.status_code == 200 and activation.plan_digest in page.content.decode()
    assert not activation.approvals.exists()  # shown, not approved yet
    response = client.post("/admin/governance/releaserequest/", {
        "action": "approve", "reviewed": "yes", "_selected_action": [activation.pk],
        f"release-{activation.pk}-checksum": activation.checksum,
        f"release-{activation.pk}-plan_digest": activation.plan_digest,
        "comment": "CHG-7"})
    assert response.status_code == 302
    approval = activation.approvals.get()
    assert (approval.checksum, approval.comment) == (activation.checksum, "CHG-7")
