"""The poll loop: conditional GET, apply what changed, report, back off on errors.

When the server advertises long-polling (`Bellwether-Long-Poll: <max seconds>` on
its desired answers), each poll asks it to hold the answer (`?wait=N`, N the poll
interval within the advertised maximum) and the next poll follows at once: a
change arrives as soon as it is made, and the cycle (drift checks included) keeps
its interval. A 304 much sooner than asked (a server that could not hold the
poll) is followed by the plain interval; after an error the agent polls plainly
until a server advertises long-polling again, and then starts holding at once."""

from __future__ import annotations

import logging
import random
import time

from agent.apply import FAILED, SUCCEEDED, Applier, Outcome
from agent.client import Client, ProtocolError, Unauthorized, Unreachable
from agent.drift import Watch
from agent.state import State

logger = logging.getLogger("agent")

EXIT_OK, EXIT_APPLY_FAILED, EXIT_CONFIG, EXIT_UNAUTHORIZED, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
EXIT_ERROR = 5  # an unexpected error in the agent itself
# --once only: the server answered, nothing was applied, and the host is not at the
# desired snapshot: it failed here before and is blocked; or nothing is desired yet.
EXIT_BLOCKED, EXIT_NOTHING_DESIRED = 6, 7
DEFAULT_INTERVAL = 30.0
MAX_BACKOFF = 300.0


def backoff(failures: int, rng=random.random) -> float:
    """Seconds to wait after `failures` failures in a row: exponential, jittered."""
    return min(MAX_BACKOFF, 2.0 ** failures) * (0.5 + 0.5 * rng())


def blocked_message(number) -> str:
    """What a blocked snapshot waits for, and how an operator retries it."""
    return (f"#{number} is blocked after it failed here: it is not applied again until "
            f"another snapshot is desired, or an operator pushes #{number} again (POST "
            f"/api/v1/environments/<app>/<env>/snapshots/{number}/deploy) to retry it")


class Agent:
    def __init__(self, *, client: Client, applier: Applier, state: State, save,
                 poll_interval: float | None = None, sleep=time.sleep, rng=random.random,
                 clock=time.monotonic):
        self.client = client
        self.applier = applier
        self.state = state
        self.save = save
        self.poll_interval = poll_interval
        self.sleep = sleep
        self.rng = rng
        self.clock = clock
        self.last_status: int | None = None
        # What the last cycle did, in a few words (--once prints it), and the exit
        # code it means when nothing was applied (EXIT_OK: in sync).
        self.summary = ""
        self.settled = EXIT_OK
        self.watch = Watch(client=client, applier=applier, persist=self._persist)

    def _persist(self) -> None:
        """Save the state; a state directory that cannot be written (full, read-only)
        is logged and the state kept in memory: reports still go out from there."""
        try:
            self.save(self.state)
        except OSError as exc:
            logger.error("cannot save the state (%s); keeping it in memory", exc)

    # --- reports ----------------------------------------------------------------

    def _send(self, report: dict) -> None:
        """Send `report`, keeping it in the state until the server has it."""
        self.state.unsent_report = report
        self._persist()
        try:
            answer = self.client.report(report)
        except ProtocolError as exc:
            if exc.status >= 500 or exc.status == 429 or isinstance(exc, Unauthorized):
                raise
            # The server will never accept this one (e.g. 409): keep going without it.
            logger.error("report for #%s refused: %s", report["snapshot"], exc)
        else:
            logger.info("reported #%s %s%s", report["snapshot"], report["status"],
                        " (already known)" if answer.get("duplicate") else "")
        self.state.unsent_report = None
        self._persist()

    def flush_unsent(self) -> None:
        if self.state.unsent_report is not None:
            logger.info("sending the report kept from before")
            self._send(self.state.unsent_report)

    # --- one cycle --------------------------------------------------------------

    def cycle(self, wait: int | None = None) -> Outcome | None:
        """Poll once (held up to `wait` seconds by a long-polling server) and act.
        Returns the apply outcome, or None if nothing was applied."""
        self.settled = EXIT_OK
        self.flush_unsent()
        status, etag, desired = self.client.desired(self.state.etag, wait)
        self.last_status = status
        if status == 304:
            logger.debug("desired state unchanged")
            self.summary = self._in_sync_summary()
            self.watch.check(self.state)
            return None
        self.state.poll_interval_s = float(desired.get("poll_interval_s") or DEFAULT_INTERVAL)
        self.state.drift_policy = desired.get("drift_policy") or "report"
        outcome = self._handle(desired)
        self.state.etag = etag  # only once handled: a crash before this polls afresh
        self._persist()
        if outcome is None:  # nothing applied: are the files still what was applied?
            self.watch.check(self.state)
        return outcome

    def _handle(self, desired: dict) -> Outcome | None:
        snapshot, deployment_id = desired.get("snapshot"), desired.get("deployment_id")
        if snapshot is None:
            logger.info("no snapshot desired yet")
            self.summary = "nothing to apply: no snapshot desired yet"
            self.settled = EXIT_NOTHING_DESIRED
            return None
        number, checksum = snapshot["number"], snapshot["checksum"]
        state = self.state
        if state.blocked and not state.is_blocked(number, checksum):
            logger.info("desired snapshot changed; unblocking #%s", state.blocked["number"])
            state.blocked = None
        if deployment_id and deployment_id in state.processed_deployments:
            logger.info("push %s was already applied; sending its report again", deployment_id)
            self._send(state.processed_deployments[deployment_id])
            self.summary = f"push {deployment_id} was already applied; report sent again"
            if state.is_blocked(number, checksum):  # it failed: the host is not at #number
                self.summary += "; " + blocked_message(number)
                self.settled = EXIT_BLOCKED
            return None
        if not deployment_id and (number, checksum) == (state.active_number,
                                                         state.active_checksum):
            logger.debug("in sync at #%s", number)
            self.summary = self._in_sync_summary()
            return None
        if state.is_blocked(number, checksum) and not deployment_id:
            logger.info("%s", blocked_message(number))
            self.summary = blocked_message(number)
            self.settled = EXIT_BLOCKED
            return None
        # A new push of a blocked snapshot is an operator's explicit retry.

        logger.info("applying #%s (%s)%s", number, snapshot.get("label"),
                    f" for push {deployment_id}" if deployment_id else "")
        def record(current: State, outcome: Outcome) -> None:
            if outcome.status != SUCCEEDED:
                current.blocked = {"number": number, "checksum": checksum}
            report = {"deployment_id": deployment_id, "snapshot": number, "checksum": checksum,
                      "status": outcome.status, "message": outcome.message[:4000]}
            if outcome.health is not None:  # a probe ran (docs/api.md)
                report["health"] = outcome.health
            if deployment_id:
                current.processed_deployments[deployment_id] = report
            current.unsent_report = report

        bundle = self.client.bundle(snapshot["bundle_url"])
        if not isinstance(bundle, dict) or (bundle.get("number"), bundle.get("checksum")) != (
                number, checksum):
            outcome = Outcome(FAILED, f"#{number}: the bundle is not the announced snapshot")
            record(state, outcome)
        else:
            outcome = self.applier.apply(bundle, state, record=record)
        log = logger.info if outcome.status == SUCCEEDED else logger.error
        log("#%s %s: %s", number, outcome.status, outcome.message)
        self.summary = (outcome.message if outcome.status == SUCCEEDED
                        else f"{outcome.status}: {outcome.message}")
        self._send(state.unsent_report)
        return outcome

    def _in_sync_summary(self) -> str:
        if self.state.blocked:  # unchanged since it failed (a 304)
            self.settled = EXIT_BLOCKED
            return blocked_message(self.state.blocked["number"])
        if self.state.active_number is None:  # unchanged since nothing was desired
            self.settled = EXIT_NOTHING_DESIRED
            return "nothing to apply: no snapshot desired yet"
        return f"in sync at #{self.state.active_number}"

    # --- the loop ---------------------------------------------------------------

    def _interval(self) -> float:
        base = self.poll_interval or self.state.poll_interval_s or DEFAULT_INTERVAL
        return base * (0.9 + 0.2 * self.rng())

    def _long_poll_wait(self) -> int | None:
        """Seconds to ask the server to hold the next poll, or None (plain polling)."""
        advertised = self.client.long_poll_s
        if not advertised or not self.state.etag:
            return None
        return max(1, min(advertised, int(self._interval())))

    def _delay_after(self, wait: int | None, took: float) -> float:
        if wait and (self.last_status != 304 or took >= wait / 2):
            return 0.0  # held as asked, or a change arrived: poll again at once
        if not wait and self._long_poll_wait():
            return 0.0  # the server has just advertised long-polling: start holding now
        return self._interval()

    def run(self) -> int:
        failures = 0
        while True:
            try:
                wait = self._long_poll_wait()
                started = self.clock()
                self.cycle(wait)
                failures = 0
                delay = self._delay_after(wait, self.clock() - started)
            except Unauthorized as exc:
                logger.error("the server refused this agent's token: %s", exc)
                return EXIT_UNAUTHORIZED
            except (Unreachable, ProtocolError) as exc:
                failures += 1
                delay = self._backoff(failures)
                logger.warning("server unavailable (%s); keeping the current config, "
                               "retrying in %.0fs", exc, delay)
            except Exception:
                failures += 1
                delay = self._backoff(failures)
                logger.exception("unexpected error; keeping the current config, retrying in "
                                 "%.0fs", delay)
            self.sleep(delay)

    def _backoff(self, failures: int) -> float:
        return backoff(failures, self.rng)

    def run_once(self) -> int:
        try:
            outcome = self.cycle()
        except Unauthorized as exc:
            logger.error("the server refused this agent's token: %s", exc)
            self.summary = f"failed: the server refused this agent's token: {exc}"
            return EXIT_UNAUTHORIZED
        except (Unreachable, ProtocolError) as exc:
            logger.error("server unavailable: %s", exc)
            if self.summary:  # applied, but the report could not be sent (kept)
                self.summary += "; the report could not be sent (kept, sent next time)"
            else:
                self.summary = f"failed: server unavailable: {exc}"
            return EXIT_UNREACHABLE
        except Exception as exc:
            logger.exception("unexpected error")
            self.summary = f"failed: unexpected error: {exc!r}"
            return EXIT_ERROR
        if outcome is not None:
            return EXIT_OK if outcome.status == SUCCEEDED else EXIT_APPLY_FAILED
        return self.settled
