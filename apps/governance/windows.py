"""Freezes and allow windows, and an owner's emergency override: created and
deleted under the environment's lock, audited. The controller reads them at every
check (apps.governance.selectors.freeze_in_force), so a change holds the next step."""

from datetime import UTC, datetime, time, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.environments.models import Environment
from apps.governance import rules, selectors
from apps.governance.models import FreezeOverride, ReleaseWindow

MAX_ONE_OFF = timedelta(days=366)
YEARS = (2000, 2999)  # a one-off window's dates (and no arithmetic past datetime's range)
MAX_OVERRIDE_MINUTES = 24 * 60


def _invalid(field: str, message: str, code: str = "invalid"):
    return ValidationFailed(f"{field}: {message}", code=code, details={"field": field})


def window_checked(kind: str, name: str, tz: str, starts_at: datetime | None,
                    ends_at: datetime | None, weekdays: list[int] | None,
                    start_time: time | None, end_time: time | None) -> rules.Window:
    """The window as the rules read it, or 400 naming the field at fault."""
    if kind not in ReleaseWindow.Kind.values:
        raise _invalid("kind", "is freeze or allow")
    if rules.zone(tz) is None:
        raise _invalid("timezone", f"{tz!r} is not an IANA timezone (e.g. Europe/Rome)",
                       "bad_timezone")
    once = starts_at is not None or ends_at is not None
    weekly = start_time is not None or end_time is not None or bool(weekdays)
    if once == weekly:
        raise _invalid("starts_at", "give starts_at and ends_at (once), or weekdays, "
                                    "start_time and end_time (weekly)")
    if once:
        if starts_at is None or ends_at is None:
            raise _invalid("starts_at" if starts_at is None else "ends_at",
                           "a one-off window has both starts_at and ends_at")
        starts_at, ends_at = _moment("starts_at", starts_at, tz), _moment("ends_at", ends_at, tz)
        if ends_at <= starts_at:
            raise _invalid("ends_at", "a window ends after it starts")
        if ends_at - starts_at > MAX_ONE_OFF:
            raise _invalid("ends_at", "a one-off window lasts at most 366 days")
    else:
        if not weekdays or any(d not in range(7) for d in weekdays):
            raise _invalid("weekdays", "name days 0 (Monday) to 6 (Sunday)")
        if start_time is None or end_time is None or start_time == end_time:
            raise _invalid("end_time", "a weekly window has a start_time and another "
                                       "end_time (an end before the start runs past midnight)")
    return rules.Window(name=name, kind=kind, timezone=tz, starts_at=starts_at,
                        ends_at=ends_at, weekdays=tuple(sorted(set(weekdays or ()))),
                        start_time=start_time, end_time=end_time)


def _moment(field: str, moment: datetime, tz: str) -> datetime:
    """A one-off window's bound in UTC: as given with its offset, or a wall-clock time
    read in the window's timezone — refused when a DST change skips it there; the
    first of the two when a DST change repeats it (docs/governance.md)."""
    if not YEARS[0] <= moment.year <= YEARS[1]:
        raise _invalid(field, f"a year from {YEARS[0]} to {YEARS[1]}")
    if timezone.is_aware(moment):
        return moment.astimezone(UTC)
    aware = rules.local_moment(moment, rules.zone(tz))
    if aware is None:
        raise _invalid(field, f"{moment:%Y-%m-%d %H:%M} does not exist in {tz}: the clocks "
                              "skip it (a change to daylight saving time); give another "
                              "time or an offset", "nonexistent_time")
    return aware


def _refuse_overlap(environment: Environment, window: rules.Window) -> None:
    now = timezone.now()
    for other in selectors.windows_of(environment.pk):
        if other.kind != window.kind:
            continue
        span = rules.windows_overlap(window, other, now)
        if span is not None:
            raise Conflict(f"The {window.kind} window overlaps {other.name!r} from "
                           f"{span[0].isoformat()}; extend that one instead.",
                           code="overlapping_window",
                           details={"field": "name", "overlaps": other.name,
                                    "from": span[0].isoformat(), "to": span[1].isoformat()})


def window_create(*, environment: Environment, actor, kind: str, name: str,
                  timezone_name: str = "UTC", reason: str = "",
                  starts_at: datetime | None = None, ends_at: datetime | None = None,
                  weekdays: list[int] | None = None, start_time: time | None = None,
                  end_time: time | None = None) -> ReleaseWindow:
    """A freeze or an allow window of the environment; one that overlaps another of
    its kind is refused (409 overlapping_window, naming it)."""
    checked = window_checked(kind, name, timezone_name, starts_at, ends_at, weekdays,
                              start_time, end_time)
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        _refuse_overlap(env, checked)
        try:
            with transaction.atomic():
                window = ReleaseWindow.objects.create(
                    environment=env, kind=kind, name=name, reason=reason,
                    timezone=timezone_name, starts_at=checked.starts_at,
                    ends_at=checked.ends_at, weekdays=list(checked.weekdays),
                    start_time=start_time, end_time=end_time,
                    created_by=actor if getattr(actor, "is_authenticated", False) else None)
        except IntegrityError:
            raise Conflict(f"{env.full_name} already has a window named {name!r}.",
                           code="window_exists", details={"field": "name"}) from None
        audit_record(actor=actor, action=Action.WINDOW_CREATE, obj=window, environment=env,
                     tenant=env.application.tenant,
                     summary=f"{kind.capitalize()} window {name!r} of {env.full_name}"
                             + (f": {reason}" if reason else ""),
                     data={"kind": kind, "name": name, "timezone": timezone_name})
    return window


def window_delete(*, window: ReleaseWindow, actor) -> None:
    with transaction.atomic():
        env = Environment.objects.lock(window.environment_id)
        locked = ReleaseWindow.objects.filter(pk=window.pk, environment=env).first()
        if locked is None:
            raise NotFound(f"Window {window.pk} not found.")
        audit_record(actor=actor, action=Action.WINDOW_DELETE, obj=locked, environment=env,
                     tenant=env.application.tenant,
                     summary=f"Deleted the {locked.kind} window {locked.name!r}",
                     data={"kind": locked.kind, "name": locked.name})
        locked.delete()


def freeze_override(*, environment: Environment, actor, reason: str,
                    minutes: int = 60) -> FreezeOverride:
    """An owner's emergency override (the caller checks the role): freezes and allow
    windows hold nothing for `minutes`. Needs a reason; audited."""
    if not reason.strip():
        raise _invalid("reason", "an emergency override needs a reason", "reason_required")
    if not 1 <= minutes <= MAX_OVERRIDE_MINUTES:
        raise _invalid("minutes", f"1 to {MAX_OVERRIDE_MINUTES}")
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        now = timezone.now()
        hold = selectors.freeze_in_force(env, now)
        override = FreezeOverride.objects.create(
            environment=env, reason=reason.strip(), starts_at=now,
            ends_at=now + timedelta(minutes=minutes),
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        audit_record(actor=actor, action=Action.FREEZE_OVERRIDE, obj=override, environment=env,
                     tenant=env.application.tenant,
                     summary=f"Emergency override of {env.full_name}'s freezes for {minutes} "
                             f"min: {reason.strip()}",
                     data={"reason": reason.strip(), "minutes": minutes, "held_by": hold})
    return override
