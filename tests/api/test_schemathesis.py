"""A bounded schemathesis run (coverage, fuzzing and stateful phases) against the
OpenAPI schema the server serves, on a live server holding the demo data: once
with a deployer's token over the operator API, once with an agent's token over
the agent API. It fails on any 5xx, an undocumented status code or content
type, or a response that does not match its schema. About 40 seconds (80 under
HYPOTHESIS_PROFILE=thorough).

It needs PostgreSQL and Redis (the production backends), so it is skipped
without them, and fails instead when BELLWETHER_REQUIRE_SERVICES=1 (CI).
SCHEMATHESIS_SEED picks another seed; the run prints the one it used."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.environments.models import Environment
from tests import factories
from tests.conftest import HYPOTHESIS_PROFILE

pytestmark = [pytest.mark.processes, pytest.mark.postgres, pytest.mark.redis,
              pytest.mark.django_db(transaction=True)]

ST = Path(sys.executable).with_name("st")
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")
AGENT_PATHS = r"^/api/v1/agent/"
# Real names, so most requests reach the views instead of answering 404.
CONFIG = """\
[parameters]
"path.application" = "shop"
"path.environment" = "staging"
"path.number" = 1
"path.agent_id" = {agent_id}
"""
SCALE = 2 if HYPOTHESIS_PROFILE == "thorough" else 1
RUNS = (  # (who, filter option, seconds)
    ("deployer", "--exclude-path-regex", 25 * SCALE),
    ("agent", "--include-path-regex", 10 * SCALE),
)


def _schema(token: str) -> dict:
    response = factories.bearer_client(token).get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


def _run(tmp_path: Path, base_url: str, token: str, filter_option: str, seconds: int) -> str:
    seed = os.environ.get("SCHEMATHESIS_SEED", "1")
    command = [str(ST), "--config-file", str(tmp_path / "schemathesis.toml"), "run",
               str(tmp_path / "schema.json"), "--url", base_url,
               "-H", f"Authorization: Bearer {token}", "--checks", CHECKS,
               "--phases", "coverage,fuzzing,stateful", filter_option, AGENT_PATHS,
               "--max-time", str(seconds), "--max-examples", "20", "--seed", seed,
               "--workers", "1", "--request-timeout", "15", "--no-color"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                            timeout=seconds + 60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def test_the_api_answers_as_its_schema_says(live_server, tmp_path):
    call_command("load_demo", stdout=open(os.devnull, "w"))  # noqa: SIM115
    dev = get_user_model().objects.get(username="dev")
    _, dev_token = factories.api_token(dev, name="schemathesis")
    staging = Environment.objects.get(application__name="shop", name="staging")
    agent = factories.enrolled_agent(staging, "schemathesis-agent")
    (tmp_path / "schema.json").write_text(json.dumps(_schema(dev_token)))
    (tmp_path / "schemathesis.toml").write_text(CONFIG.format(agent_id=agent.agent.pk))

    tokens = {"deployer": dev_token, "agent": agent.token}
    for who, filter_option, seconds in RUNS:
        output = _run(tmp_path, live_server.url, tokens[who], filter_option, seconds)
        assert "Tested:" in output, output[-2000:]
        print(f"--- schemathesis as {who}:", output[-1500:], sep="\n")  # shown with -s
