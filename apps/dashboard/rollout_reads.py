"""What the dashboard shows of rollouts: the panel of the active (else the latest)
rollout — per-wave bars of activated and acknowledged targets, the current wave's
clocks and evidence, a finished rollout's kept counts and failures — and the
rollout history, each rollout with the timeline of its audit events."""

from datetime import timedelta

from django.core.paginator import Paginator
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.scheduler import scheduler_late_since
from apps.environments.models import Environment
from apps.rollouts import rules as rollout_rules
from apps.rollouts import selectors as rollout_selectors
from apps.rollouts.models import Rollout

ACKNOWLEDGEMENTS_SHOWN = 50
ROLLOUTS_PER_PAGE = 10
EVIDENCE_KINDS = ("acknowledged", "waiting", "failed", "released", "changed")


def _waves(rollout: Rollout, reached: dict) -> list[dict]:
    """Each wave: its size, how many targets were activated and acknowledged — live
    while the rollout runs, as kept when it finished (its pins are gone since)."""
    progress = rollout_selectors.wave_progress([rollout]).get(rollout.pk, {})
    kept = {w["index"]: w for w in (rollout.final_summary or {}).get("waves", [])}
    waves = []
    for index, wave in enumerate(rollout.waves):
        counts = {"targets": 0, "activated": 0, "released": 0, **progress.get(index, {})}
        counts["acknowledged"] = len(reached[index].acknowledged) if index in reached else 0
        if index in kept:  # finished: activated means "ever activated" there
            counts.update({k: kept[index].get(k, 0) for k in ("targets", "activated",
                                                               "acknowledged", "failed")})
            counts["released"] = 0
        waves.append({"index": index, "name": rollout_rules.wave_name(index),
                      **wave, **counts,
                      "current": rollout.is_active and index == rollout.current_wave})
    return waves


def _clocks(rollout: Rollout) -> dict:
    """The current wave's clocks: when it started, until when it bakes, when it
    times out (a running rollout is paused then)."""
    if not rollout.is_active:
        return {}
    started = rollout.wave_started_at
    bake = rollout.waves[rollout.current_wave].get("bake_s", 0)
    return {"started": started, "now": timezone.now(),
            "bake_until": started + timedelta(seconds=bake) if bake else None,
            "timeout_at": started + timedelta(seconds=rollout.wave_timeout_s)}


def _failures(rollout: Rollout) -> list[dict]:
    """What the failed agents said: now, or as the rollout kept it when it finished
    (one that finished before it kept messages names its failed agents)."""
    if rollout.is_active:
        return rollout_selectors.failure_reports(rollout, ACKNOWLEDGEMENTS_SHOWN)
    summary = rollout.final_summary or {}
    named = (summary.get("final_evidence") or {}).get("failed", [])
    kept = summary.get("failures", [{"agent": name, "status": "failed", "message": ""}
                                     for name in named])
    return kept[:ACKNOWLEDGEMENTS_SHOWN]


def rollout_panel(environment: Environment) -> dict:
    """The active rollout (else the latest one) with per-wave progress and, for the
    current wave, who acknowledged and who is still awaited; a finished one with
    what it kept (the names of the agents that failed among them)."""
    rollout = (Rollout.objects.filter(environment=environment)
               .select_related("snapshot", "rollback_snapshot", "created_by", "environment")
               .order_by("-created_at").first())
    if rollout is None:
        return {"rollout": None}
    reached = (rollout_selectors.waves_evidence(rollout, range(rollout.current_wave + 1))
               if rollout.is_active else {})
    evidence = reached.get(rollout.current_wave)
    return {
        "rollout": rollout,
        "reason": rollout_rules.shown_reason(rollout, scheduler_late_since()),
        "waves": _waves(rollout, reached),
        "clocks": _clocks(rollout),
        "evidence": None if evidence is None else {
            key: getattr(evidence, key)[:ACKNOWLEDGEMENTS_SHOWN] for key in EVIDENCE_KINDS},
        "failures": _failures(rollout),
        "ready": evidence is not None and evidence.complete,
        "pins_held": rollout_selectors.pins_held(rollout),
    }


def rollout_history(environment: Environment, page) -> dict:
    """A page of the environment's rollouts, newest first, each with `timeline`: its
    audit events oldest first (three queries a page, whatever its length)."""
    paginator = Paginator(Rollout.objects.filter(environment=environment)
                          .select_related("snapshot", "rollback_snapshot", "created_by")
                          .order_by("-created_at", "-pk"), ROLLOUTS_PER_PAGE)
    current = paginator.get_page(page)
    rollouts = list(current.object_list)
    timelines: dict[str, list] = {str(r.pk): [] for r in rollouts}
    for event in (AuditEvent.objects.filter(environment=environment,
                                            object_type=Rollout._meta.label_lower,
                                            object_id__in=list(timelines))
                  .only("action", "actor_name", "summary", "created_at", "object_id")
                  .order_by("id")):
        timelines[event.object_id].append(event)
    for rollout in rollouts:
        rollout.timeline = timelines[str(rollout.pk)]
    return {"rollouts": rollouts, "page": current}
