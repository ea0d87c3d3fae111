"""Fixtures for the end-to-end tests: a real server process on the test database,
real agent processes, and an environment to roll out to them.

The server runs with its own local-memory cache and tasks inline, so every change
the agents must notice (publish, push, mode) goes through its REST API: the
server invalidates its own cached poll answers. Environment inputs (config,
templates) are edited with the services from this process; they change no poll
answer until they are published.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from apps.environments.services import (
    environment_file_delete,
    environment_file_put,
)
from apps.releases.services import environment_update
from apps.tenancy.models import Role
from tests import factories
from tests.e2e.harness import (
    AgentProcess,
    Api,
    Nginx,
    RedisServer,
    Server,
    free_port,
    shared_database_url,
)


@pytest.fixture
def server_environ() -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    environ.update({
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": shared_database_url(),
        "DATABASE_POOL": "0",
        "SECRET_KEY": "e2e-server-secret",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DEBUG": "1",
        "CELERY_TASK_ALWAYS_EAGER": "1",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    })
    return environ


@pytest.fixture
def server(processes, server_environ, tmp_path) -> Server:
    """A running Bellwether server (Daphne's runserver) on a free port."""
    server = Server(port=free_port(), env=server_environ, log_path=tmp_path / "server.log")
    processes.append(server)
    return server.start().wait_ready()


@dataclass
class Fleet:
    """One environment, an operator with an API token, and agents started for it."""

    environment: object
    actor: object
    api: Api
    server: Server
    enrollment_token: str
    root: Path
    processes: list
    agents: dict = field(default_factory=dict)

    def start_agent(self, name: str, *extra_args: str) -> AgentProcess:
        agent = AgentProcess(name=name, server_url=self.server.url, root=self.root / name,
                             extra_args=extra_args, enrollment_token=self.enrollment_token)
        self.processes.append(agent)
        self.agents[name] = agent
        return agent.start()

    def change_config(self, config: str) -> None:
        environment_update(environment=self.environment, config=config, actor=self.actor)

    def put_template(self, path: str, text: str) -> None:
        environment_file_put(environment=self.environment, kind="template", path=path,
                             text=text, actor=self.actor)

    def remove_template(self, path: str) -> None:
        environment_file_delete(environment=self.environment, kind="template", path=path,
                                actor=self.actor)

    def logs(self) -> str:
        return "\n".join(p.dump() for p in self.processes)


@pytest.fixture
def make_fleet(server, processes, tenant, application, superuser, tmp_path):
    """make_fleet(config, templates) -> a Fleet for shop/<name> served by `server`."""

    def make(config: str, templates: dict[str, str], name: str = "prod") -> Fleet:
        environment = factories.environment(application, name, config=config,
                                            templates=templates, poll_interval_s=5,
                                            actor=superuser)
        operator = factories.member(tenant, Role.OWNER, username=f"operator-{name}",
                                    actor=superuser)
        _, api_secret = factories.api_token(operator, name="e2e")
        _, enrollment_secret = factories.enrollment_token(environment, uses=10,
                                                          actor=superuser)
        root = tmp_path / f"fleet-{name}"
        root.mkdir()
        return Fleet(environment=environment, actor=superuser,
                     api=Api(server, api_secret, application.name, environment.name),
                     server=server, enrollment_token=enrollment_secret, root=root,
                     processes=processes)

    return make


@pytest.fixture
def nginx_binary() -> str:
    """The nginx executable (Debian's package puts it in /usr/sbin, which a non-root
    PATH often lacks). Missing: skip, or fail with BELLWETHER_REQUIRE_SERVICES=1."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    found = shutil.which("nginx", path=path)
    if found is None:
        message = "needs nginx on PATH (apt-get install nginx)"
        if os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    return found


@pytest.fixture
def make_nginx(nginx_binary, tmp_path):
    """make_nginx(site, port) -> an Nginx of this test's own, serving `site` (a file
    the agent manages) on `port`; its master is stopped at teardown."""
    instances: list[Nginx] = []

    def make(site: Path, port: int) -> Nginx:
        instance = Nginx(binary=nginx_binary, prefix=tmp_path / f"nginx-{len(instances)}",
                         site=site, port=port)
        instances.append(instance)
        return instance

    yield make
    for instance in instances:
        instance.stop()
        print(instance.dump())


@pytest.fixture
def redis_server(processes, tmp_path) -> RedisServer:
    """A private redis-server: the broker, channel layer and cache of every process
    here, and of nothing else."""
    binary = shutil.which("redis-server", path=os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"]))
    if binary is None:
        message = "needs redis-server on PATH (apt-get install redis-server)"
        if os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    server = RedisServer(binary=binary, port=free_port(), directory=tmp_path / "redis")
    processes.append(server)
    return server.start().wait_ready()
