"""Entry point: configuration, logging, enrollment, crash recovery, then the loop."""

from __future__ import annotations

import logging
import sys
import time

from agent import config as agent_config
from agent import stopping
from agent.apply import Applier, Commands
from agent.client import Client, ProtocolError, Unauthorized, Unreachable
from agent.health import Probe
from agent.runner import (
    EXIT_CONFIG,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
    Agent,
    backoff,
)
from agent.state import Identity, InUse, State, StateLock, state_path

logger = logging.getLogger("agent")


def _token_retrying(config, client: Client, identity: Identity, sleep=time.sleep) -> str:
    """_token; a server that does not answer or fails (5xx, 429) is asked again with
    backoff, each failure logged, as the poll loop does, unless --once (raised)."""
    failures = 0
    while True:
        try:
            return _token(config, client, identity)
        except (Unreachable, ProtocolError) as exc:
            refused = isinstance(exc, ProtocolError) and exc.status < 500 and exc.status != 429
            if refused or config.once:
                raise
            failures += 1
            delay = backoff(failures)
            logger.warning("enrollment failed (%s); retrying in %.0fs", exc, delay)
            sleep(delay)


def _token(config, client: Client, identity: Identity) -> str:
    """The agent token: configured, kept from enrollment, or enrolled now."""
    if config.token:
        return config.token
    if identity.token:
        return identity.token
    if not config.enrollment_token:
        raise agent_config.ConfigError("no --token, --token-file or BELLWETHER_TOKEN, and no "
                                       "--enrollment-token to enroll with")
    answer = client.enroll(config.enrollment_token, config.name, config.labels)
    identity.token, identity.name = answer["token"], config.name
    try:
        identity.save(config.state_dir)
    except OSError as exc:
        logger.error("cannot keep the token in %s (%s): enrolled, but a restart will need "
                     "--token", config.state_dir, exc)
    logger.info("enrolled as %s (agent %s) in %s", config.name, answer["agent_id"],
                answer["environment"])
    return identity.token


class _AgentName(logging.Filter):
    """Puts the agent's name on every log line (the enrolled one once known)."""

    def __init__(self, name: str):
        super().__init__()
        self.agent = name

    def filter(self, record) -> bool:
        record.agent = self.agent
        return True


def _logging(config) -> _AgentName:
    handler = logging.StreamHandler(sys.stderr)
    named = _AgentName(config.name)
    handler.addFilter(named)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(agent)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())
    return named


def main(argv=None) -> int:
    """The agent, from its arguments to its exit code. SIGINT and SIGTERM stop it
    wherever it is (agent/stopping.py): 130 and 143."""
    restore_signals = stopping.install()
    config = None
    try:
        try:
            config = agent_config.load(argv)
            agent_config.check_directories(config)
            lock = _lock(config)
        except agent_config.ConfigError as exc:
            print(f"{agent_config.program_name()}: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            return _serve(config, lock)
        finally:
            lock.release()
    except stopping.Stopped as stop:
        stop.announce()
        logger.info("stopped (exit %d)", stop.exit_code)
        if config is not None and config.once:
            print(f"{config.name}: stopped by {stop.name}")
        return stop.exit_code
    finally:
        restore_signals()


def _lock(config) -> StateLock:
    """The state directory's lock, for as long as this process runs: two agents on
    one state directory would undo each other's applies."""
    try:
        return StateLock.acquire(config.state_dir, config.name)
    except InUse as exc:
        raise agent_config.ConfigError(
            f"--state-dir {config.state_dir} is in use by another agent ({exc}); each "
            "agent needs a state directory of its own") from None
    except OSError as exc:
        raise agent_config.ConfigError(f"--state-dir {config.state_dir} cannot be locked: "
                                       f"{exc.strerror}") from None


def _serve(config, lock: StateLock) -> int:
    named = _logging(config)
    if config.legacy_state_dir:
        logger.warning("using the state directory of an older agent, %s (the default is "
                       "now %s/<name>); give --state-dir to keep it", config.state_dir,
                       agent_config.STATE_ROOT)
    identity = Identity.load(config.state_dir)
    if not config.name_given and identity.name:
        config.name = named.agent = identity.name
        lock.name(config.name)
    path = state_path(config.state_dir)
    state = State.load(path)

    def save(current: State) -> None:
        current.save(path)

    client = Client(config.servers, ca_bundle=config.ca_bundle)
    applier = Applier(
        target_dir=config.target_dir, state_dir=config.state_dir, save=save,
        commands=Commands(validate=config.validate_command, reload=config.reload_command,
                          start=config.start_command, timeout_s=config.command_timeout,
                          passthrough_env=config.command_env),
        secret_allow=config.secret_allow,
        probe=Probe(command=config.health_command, url=config.health_url,
                    timeout_s=config.health_timeout, attempts=config.health_retries,
                    interval_s=config.health_interval),
    )
    try:
        return _poll(config, client, applier, state, identity, save)
    except stopping.Stopped:
        if state.in_progress is not None:
            logger.warning("the apply of #%s was interrupted: the next start restores the "
                           "previous files", state.in_progress["number"])
        raise


def _poll(config, client: Client, applier: Applier, state: State, identity: Identity,
          save) -> int:
    """Recover an interrupted apply, get the token (enrolling), then poll."""
    recovered = applier.recover_interrupted(state)
    if recovered:
        logger.warning(recovered)
    try:
        client.token = _token_retrying(config, client, identity)
    except agent_config.ConfigError as exc:
        logger.error("%s", exc)
        return EXIT_CONFIG
    except Unauthorized as exc:
        logger.error("enrollment refused: %s", exc)
        return EXIT_UNAUTHORIZED
    except ProtocolError as exc:
        if exc.status < 500 and exc.status != 429:
            # 400 bad name or labels, 409 name taken: the configuration must change.
            logger.error("enrollment refused: %s", exc)
            return EXIT_CONFIG
        logger.error("enrollment failed: %s", exc)
        return EXIT_UNREACHABLE
    except Unreachable as exc:
        logger.error("enrollment failed: %s", exc)
        return EXIT_UNREACHABLE
    agent = Agent(client=client, applier=applier, state=state, save=save,
                  poll_interval=config.poll_interval)
    logger.info("polling %s for %s (target %s)", ", ".join(config.servers), config.name,
                config.target_dir)
    if not config.once:
        return agent.run()
    code = agent.run_once()
    print(f"{config.name}: {agent.summary or 'nothing done'}")
    return code
