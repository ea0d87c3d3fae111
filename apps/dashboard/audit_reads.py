"""The environment's audit log as the dashboard pages it: newest first, filtered by
kind (what an action is about: rollout, snapshot, agent...)."""

from django.core.paginator import Paginator

from apps.audit.models import Action
from apps.audit.selectors import audit_events_for
from apps.environments.models import Environment

EVENTS_PER_PAGE = 50
# The kinds of events, from the actions themselves ("rollout" of "rollout.pause").
KINDS = sorted({action.value.split(".")[0] for action in Action})


def audit_page(environment: Environment, kind: str, page) -> dict:
    """A page of events of `kind` (one of KINDS, or "" for every kind)."""
    events = audit_events_for(environment).only(
        "action", "actor_name", "object_type", "object_repr", "summary", "created_at")
    if kind:
        events = events.filter(action__startswith=f"{kind}.")
    current = Paginator(events, EVENTS_PER_PAGE).get_page(page)
    return {"events": list(current.object_list), "page": current}
