"""Builders for the objects the tests need, each written once.

Everything is made through the application's own services (tenant_create,
environment_create, agent_enroll, releases.snapshot_publish, report_intake,
rollout_create, ...), so the rows, counters and audit events are the ones a real
request would leave. Plain functions: the fixtures in tests/conftest.py (and in a
directory's conftest) call them with the shared defaults, and a test calls them for
anything else.

Several builders share their name with a fixture (`user`, `tenant`, `environment`,
...): use them as `factories.environment(...)` where the fixture is in scope.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from itertools import count

from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.environments.services import environment_create, environment_file_put
from apps.fleet import enrollment
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent
from apps.fleet.selectors import agents_with_desired, desired_snapshot_for
from apps.releases import services as releases
from apps.releases.publishing import publication_complete
from apps.rollouts import services as rollout_services
from apps.tenancy.services import (
    api_token_create,
    application_create,
    membership_set,
    tenant_create,
)

# --- the inputs of shop/prod ------------------------------------------------------------

NGINX_TEMPLATE = """server {
    listen {{ listen }};
    server_name {{ server_name }};
{% for upstream in upstreams %}    # upstream {{ upstream }}
{% endfor %}}
"""

APP_TEMPLATE = '{"log_level": {{ log_level | tojson }}, "workers": {{ workers }}}\n'

CONFIG = """listen: 80
server_name: shop.example.com
upstreams:
  - 10.0.0.1:8080
  - 10.0.0.2:8080
log_level: info
workers: 4
"""

# shop/prod's templates, in the order they are stored.
SHOP_TEMPLATES = {"nginx/shop.conf": NGINX_TEMPLATE, "shop/app.json": APP_TEMPLATE}

# Renders to one short line, after ~0.3 s of loops (within the iteration budget): a
# real input whose render leaves a window other transactions can act in.
SLOW_TEMPLATE = ("{% for i in range(300) %}{% for j in range(250) %}"
                 "{% if (i * j) % 7 == 9 %}x{% endif %}{% endfor %}{% endfor %}ready\n")


# --- people and tenants -----------------------------------------------------------------


def user(username: str, **fields):
    """A user whose password is "pw-<username>"; `fields` (is_staff=True, ...) are
    set on it."""
    return get_user_model().objects.create_user(username=username, password="pw-" + username,
                                                **fields)


def superuser(username: str = "root"):
    return get_user_model().objects.create_superuser(username, f"{username}@example.com",
                                                     "pw-" + username)


def tenant(*, actor, name: str = "Shop team", slug: str = "shop-team"):
    return tenant_create(name=name, slug=slug, actor=actor)


def membership(tenant, user, role: str, *, actor):
    """Give `user` `role` in `tenant` (creating or changing the membership)."""
    return membership_set(tenant=tenant, user=user, role=role, actor=actor)


def member(tenant, role: str, *, actor, username: str | None = None, **fields):
    """A new user (named after the role unless `username`) with `role` in `tenant`."""
    made = user(username or role, **fields)
    membership(tenant, made, role, actor=actor)
    return made


# --- applications and environments ------------------------------------------------------


def application(tenant, *, actor, name: str = "shop"):
    return application_create(tenant=tenant, name=name, actor=actor)


def environment(application, name: str = "prod", *, actor, config: str = CONFIG,
                templates: dict[str, str] | None = None,
                fallback_files: dict[str, str] | None = None, **fields):
    """An environment of `application` with `config`, then its templates and fallback
    files ({path: text}, stored in that order); `fields` go to environment_create
    (poll_interval_s, ...)."""
    env = environment_create(application=application, name=name, config=config, actor=actor,
                             **fields)
    for kind, files in (("template", templates), ("fallback", fallback_files)):
        for path, text in (files or {}).items():
            environment_file_put(environment=env, kind=kind, path=path, text=text, actor=actor)
    return env


def staged_environment(application, name: str, actor, *, slow_render: bool = False):
    """Another environment of `application`, like shop/prod: #1 active, #2 ready and
    not activated (it requires activation). With `slow_render`, a template that takes
    ~0.3 s to render. Returns (environment, first, second)."""
    templates = {"shop/app.json": APP_TEMPLATE}
    if slow_render:
        templates["shop/slow.txt"] = SLOW_TEMPLATE
    env = environment(application, name, templates=templates, actor=actor)
    first = publish(env, actor)
    env = releases.environment_update(environment=env, release_policy="staged", actor=actor)
    second = publish_variant(env, actor, workers=8)
    env.refresh_from_db()
    return env, first, second


# --- API tokens and clients -------------------------------------------------------------


def api_token(user, *, name: str = "test", actor=None, **options):
    """(ApiToken, secret) of `user`, created by `actor` (the user by default);
    `options` go to api_token_create (expires_at)."""
    return api_token_create(user=user, name=name, actor=user if actor is None else actor,
                            **options)


def bearer_client(secret: str, **options) -> APIClient:
    """An APIClient sending "Authorization: Bearer <secret>" (a user's, an agent's or
    any other string); `options` go to APIClient (enforce_csrf_checks)."""
    client = APIClient(**options)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def api_client_for(user=None) -> APIClient:
    """An APIClient authenticated with a new API token of `user` (named "test");
    anonymous without a user."""
    if user is None:
        return APIClient()
    _, secret = api_token(user)
    return bearer_client(secret)


def session_client(user, **options) -> Client:
    """A Django test Client signed in as `user` (a browser's session)."""
    client = Client(**options)
    client.force_login(user)
    return client


# --- snapshots --------------------------------------------------------------------------


def render(publication):
    """Render a queued publication now and finish it, as the Celery task does: a
    publish renders on commit, which never comes inside a test's transaction."""
    return publication_complete(publication_id=str(publication.pk))


def publication(environment, actor):
    """Publish the environment's current inputs and render them now: the Publication."""
    return render(releases.snapshot_publish(environment=environment, actor=actor))


def publish(environment, actor):
    """Publish the environment's current inputs and render them now: the Snapshot."""
    return publication(environment, actor).snapshot


def publish_variant(environment, actor, *, workers: int):
    """A new snapshot whose config differs from the current one by `workers`."""
    environment.refresh_from_db()
    config = re.sub(r"^workers: .*$", f"workers: {workers}", environment.config, flags=re.M)
    environment = releases.environment_update(environment=environment, config=config,
                                              actor=actor)
    return publish(environment, actor)


def rollback_publication(snapshot, actor, *, confirmed: bool = False):
    """Roll back to `snapshot` and render it now: the Publication of the new snapshot."""
    return render(releases.snapshot_rollback(snapshot=snapshot, actor=actor,
                                             confirmed=confirmed))


# --- agents -----------------------------------------------------------------------------

DESIRED = "/api/v1/agent/desired"


def poll(client, etag: str | None = None, method: str = "get"):
    """An agent's conditional GET (or HEAD) of its desired state."""
    headers = {"HTTP_IF_NONE_MATCH": etag} if etag is not None else {}
    return getattr(client, method)(DESIRED, **headers)


@dataclass
class EnrolledAgent:
    """An agent enrolled through the service, and its own token."""

    agent: Agent
    token: str

    @property
    def pk(self) -> int:
        return self.agent.pk

    @property
    def client(self) -> APIClient:
        return bearer_client(self.token)

    def fresh(self) -> Agent:
        """The agent as stored now, with its desired snapshot annotated (also kept as
        `self.agent`)."""
        self.agent = agents_with_desired(Agent.objects.filter(pk=self.agent.pk)).get()
        return self.agent

    def desired_number(self) -> int | None:
        snapshot = desired_snapshot_for(self.fresh())
        return None if snapshot is None else snapshot.number

    def etag(self) -> str:
        response = poll(self.client)
        assert response.status_code == 200, response.content[:300]
        return response["ETag"]

    def polled_number(self) -> int | None:
        body = poll(self.client).json()
        return None if body["snapshot"] is None else body["snapshot"]["number"]


def enrollment_token(environment, *, actor=None, uses: int = 1,
                     expires_in: timedelta = timedelta(hours=1), **options):
    """(EnrollmentToken, secret) for `environment`, created by `actor`; `options` go
    to enrollment_token_create (name)."""
    return enrollment.enrollment_token_create(
        environment=environment, max_uses=uses, expires_at=timezone.now() + expires_in,
        actor=actor, **options)


def enrolled_agent(environment, name: str = "web-1", *, actor=None, labels: dict | None = None,
                   mode: str | None = None) -> EnrolledAgent:
    """An agent of `environment` enrolled with a token of its own (made by `actor`),
    then switched to `mode` by `actor` when that is not the mode it enrolled in."""
    _, secret = enrollment_token(environment, actor=actor)
    agent, token = enrollment.agent_enroll(enrollment_token=secret, name=name,
                                           labels=dict(labels or {}))
    if mode is not None and mode != agent.mode:
        agent = fleet_services.agent_update(agent=agent, actor=actor, mode=mode)
    return EnrolledAgent(agent, token)


def enrolled_agents(environment, number: int, *, actor=None, prefix: str = "web",
                    labels: dict | None = None, start: int = 1) -> list[EnrolledAgent]:
    """`number` agents of `environment` named <prefix>-<start>..., enrolled with one
    enrollment token (made by `actor`)."""
    _, secret = enrollment_token(environment, actor=actor, uses=number)
    enrolled = []
    for index in range(start, start + number):
        agent, token = enrollment.agent_enroll(enrollment_token=secret,
                                               name=f"{prefix}-{index}",
                                               labels=dict(labels or {}))
        enrolled.append(EnrolledAgent(agent, token))
    return enrolled


_messages = count(1)


def ack(agent, snapshot, status: str = "succeeded", message: str | None = None):
    """The agent (an EnrolledAgent or an Agent) reports `snapshot`, its exact number
    and checksum, with `status`, as a pull, through the release intake (a new report
    queues its rollout's reconcile on commit). Every call carries a new message, so it
    is never taken for a duplicate. Returns (deployment, created)."""
    agent = getattr(agent, "agent", agent)
    return releases.report_intake(
        agent=agent, deployment_id=None, number=snapshot.number, checksum=snapshot.checksum,
        status=status, message=message if message is not None else f"report {next(_messages)}")


# --- rollouts ---------------------------------------------------------------------------


def start_rollout(environment, snapshot, canaries, actor=None, **options):
    """rollout_create over every enabled agent, with `canaries` (EnrolledAgents or
    ids) first; `options` go to rollout_create (waves, canary_gate, ...)."""
    ids = [getattr(canary, "pk", canary) for canary in canaries]
    return rollout_services.rollout_create(environment=environment, snapshot=snapshot,
                                           actor=actor, canary_agents=ids, **options)
