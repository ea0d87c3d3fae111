"""Helpers shared by the rollout tests: enrolling agents, acknowledging snapshots
the way an agent's report does, starting rollouts, and reading pins back."""

from dataclasses import dataclass
from datetime import timedelta
from itertools import count

from django.utils import timezone

from apps.environments.services import environment_create, environment_file_put
from apps.fleet import enrollment
from apps.fleet.models import Agent
from apps.fleet.selectors import agents_with_desired, desired_snapshot_for
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts import services
from apps.rollouts.models import Rollout, RolloutTarget
from tests.factories import APP_TEMPLATE, CONFIG
from tests.fleet.support import bearer, poll, publish, publish_variant

_messages = count(1)


@dataclass
class Node:
    """An enrolled agent and its own token."""

    agent: Agent
    token: str

    @property
    def pk(self) -> int:
        return self.agent.pk

    @property
    def client(self):
        return bearer(self.token)

    def fresh(self) -> Agent:
        return agents_with_desired(Agent.objects.filter(pk=self.agent.pk)).get()

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


# Renders to one short line, after ~0.3 s of loops (within the iteration budget): a
# real input whose render leaves a window other transactions can act in.
SLOW_TEMPLATE = ("{% for i in range(600) %}{% for j in range(1000) %}"
                 "{% if (i * j) % 7 == 9 %}x{% endif %}{% endfor %}{% endfor %}ready\n")


def staged_environment(application, name: str, actor, *, slow_render: bool = False):
    """Another environment of `application`, like shop/prod: #1 active, #2 ready and
    not activated. Returns (environment, first, second)."""
    env = environment_create(application=application, name=name, config=CONFIG, actor=actor)
    environment_file_put(environment=env, kind="template", path="shop/app.json",
                         text=APP_TEMPLATE, actor=actor)
    if slow_render:
        environment_file_put(environment=env, kind="template", path="shop/slow.txt",
                             text=SLOW_TEMPLATE, actor=actor)
    first = publish(env, actor)
    env = environment_update(environment=env, require_activation=True, actor=actor)
    second = publish_variant(env, actor, workers=8)
    env.refresh_from_db()
    return env, first, second


def enroll_many(environment, number: int, *, prefix: str = "web", labels=None,
                start: int = 1) -> list[Node]:
    _, secret = enrollment.enrollment_token_create(
        environment=environment, max_uses=number, actor=None,
        expires_at=timezone.now() + timedelta(hours=1))
    nodes = []
    for index in range(start, start + number):
        agent, token = enrollment.agent_enroll(enrollment_token=secret, name=f"{prefix}-{index}",
                                          labels=dict(labels or {}))
        nodes.append(Node(agent, token))
    return nodes


def ack(node_or_agent, snapshot, status: str = "succeeded", message: str | None = None):
    """The agent reports `snapshot` (exact number and checksum) with `status`. Every
    call carries a new message, so it is never taken for a duplicate."""
    agent = getattr(node_or_agent, "agent", node_or_agent)
    return releases.report_intake(
        agent=agent, deployment_id=None, number=snapshot.number, checksum=snapshot.checksum,
        status=status, message=message if message is not None else f"report {next(_messages)}")


def start(environment, snapshot, canaries, actor=None, **options) -> Rollout:
    """rollout_create over all enabled agents with `canaries` (nodes or ids) first."""
    ids = [getattr(c, "pk", c) for c in canaries]
    return services.rollout_create(environment=environment, snapshot=snapshot, actor=actor,
                                   canary_agents=ids, **options)


def fresh(rollout: Rollout) -> Rollout:
    return Rollout.objects.select_related("snapshot", "environment").get(pk=rollout.pk)


def confirm(rollout: Rollout, actor=None) -> Rollout:
    return services.rollout_confirm(rollout=rollout, actor=actor,
                                    expected_version=fresh(rollout).version)


def rollback(rollout: Rollout, actor=None, reason: str = "") -> Rollout:
    return services.rollout_rollback(rollout=rollout, actor=actor, reason=reason,
                                     expected_version=fresh(rollout).version)


def release(node_or_agent, rollout: Rollout, actor=None) -> Agent:
    agent = Agent.objects.get(pk=getattr(node_or_agent, "pk", node_or_agent))
    return services.rollout_pin_release(agent=agent, rollout=rollout, actor=actor,
                                        expected_generation=agent.generation)


def pins(nodes) -> dict[str, tuple[int | None, int | None]]:
    """agent name -> (pinned snapshot number, pinning rollout id)."""
    rows = Agent.objects.filter(pk__in=[n.pk for n in nodes]).values_list(
        "name", "pinned_snapshot__number", "pin_rollout_id")
    return {name: (number, rollout) for name, number, rollout in rows}


def target_states(rollout: Rollout) -> dict[str, str]:
    return dict(RolloutTarget.objects.filter(rollout=rollout)
                .values_list("agent__name", "state"))


def waves_of(rollout: Rollout) -> dict[int, list[str]]:
    waves: dict[int, list[str]] = {}
    for name, wave in (RolloutTarget.objects.filter(rollout=rollout)
                       .order_by("wave", "agent__name").values_list("agent__name", "wave")):
        waves.setdefault(wave, []).append(name)
    return waves
