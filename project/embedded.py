"""The periodic loop of embedded mode: Celery beat's schedule, run in-process.

Production runs one `celery beat`; `make run` has no broker, so runserver
starts this thread instead and each due task runs inline.
"""

import logging
import threading
import time
from datetime import timedelta

from django.db import close_old_connections, connections

from apps.core.scheduler import scheduler_seen
from project.celery import app

logger = logging.getLogger(__name__)


def _interval(schedule) -> float:
    if isinstance(schedule, timedelta):
        return schedule.total_seconds()
    if isinstance(schedule, (int, float)):
        return float(schedule)
    raise ValueError(f"embedded mode runs interval schedules only, not {schedule!r}")


def run_due(schedule: dict, next_run: dict[str, float], now: float) -> list[str]:
    """Run every entry of `schedule` that is due at `now`; return their names."""
    ran = []
    for name, entry in schedule.items():
        if next_run.setdefault(name, now) > now:
            continue
        next_run[name] = now + _interval(entry["schedule"])
        try:
            app.tasks[entry["task"]].apply(args=entry.get("args", ()),
                                           kwargs=entry.get("kwargs", {}))
        except Exception:
            logger.exception("periodic task %s failed", name)
        ran.append(name)
    return ran


class PeriodicLoop:
    """The schedule running in a daemon thread; `stop()` ends it."""

    def __init__(self, schedule: dict, tick: float):
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(schedule, tick), name="bellwether-periodic", daemon=True
        )

    def _run(self, schedule: dict, tick: float) -> None:
        logger.info("embedded periodic loop running: %s", ", ".join(schedule) or "nothing")
        next_run: dict[str, float] = {}
        try:
            while not self._stop.is_set():
                close_old_connections()
                run_due(schedule, next_run, time.monotonic())
                scheduler_seen()
                self._stop.wait(tick)
        finally:
            connections.close_all()

    def start(self) -> "PeriodicLoop":
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)


def start_periodic_loop(schedule: dict | None = None, tick: float = 1.0) -> PeriodicLoop:
    schedule = app.conf.beat_schedule if schedule is None else schedule
    app.loader.import_default_modules()  # runs the (lazy) task autodiscovery
    return PeriodicLoop(schedule, tick).start()
