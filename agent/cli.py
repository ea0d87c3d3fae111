"""Entry point: configuration, logging, enrollment, crash recovery, then the loop."""

from __future__ import annotations

import logging
import os
import sys

from agent import config as agent_config
from agent.apply import Applier, Commands
from agent.client import Client, ProtocolError, Unauthorized, Unreachable
from agent.runner import (
    EXIT_CONFIG,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
    Agent,
)
from agent.state import State, state_path

logger = logging.getLogger("agent")


def _token(config, client: Client, state: State, save) -> str:
    """The agent token: configured, kept from enrollment, or enrolled now."""
    if config.token:
        return config.token
    if state.token:
        return state.token
    if not config.enrollment_token:
        raise agent_config.ConfigError("no --token, --token-file or BELLWETHER_TOKEN, and no "
                                       "--enrollment-token to enroll with")
    answer = client.enroll(config.enrollment_token, config.name, config.labels)
    state.token = answer["token"]
    save(state)
    logger.info("enrolled as %s (agent %s) in %s", config.name, answer["agent_id"],
                answer["environment"])
    return state.token


def main(argv=None) -> int:
    try:
        config = agent_config.load(argv)
    except agent_config.ConfigError as exc:
        print(f"python -m agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    logging.basicConfig(level=config.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    os.makedirs(config.target_dir, exist_ok=True)
    path = state_path(config.state_dir)
    state = State.load(path)

    def save(current: State) -> None:
        current.save(path)

    client = Client(config.server, ca_bundle=config.ca_bundle)
    applier = Applier(
        target_dir=config.target_dir, state_dir=config.state_dir, save=save,
        commands=Commands(validate=config.validate_command, reload=config.reload_command,
                          start=config.start_command, timeout_s=config.command_timeout,
                          passthrough_env=config.command_env),
        secret_allow=config.secret_allow,
    )
    recovered = applier.recover_interrupted(state)
    if recovered:
        logger.warning(recovered)
    try:
        client.token = _token(config, client, state, save)
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
    logger.info("polling %s for %s (target %s)", config.server, config.name, config.target_dir)
    try:
        return agent.run_once() if config.once else agent.run()
    except KeyboardInterrupt:
        logger.info("stopped")
        return 0
