"""The project installs as the `bellwether` command (`make run` and `make test`
install it editable into .venv): the console script points at cli.main:main,
the distribution holds the `cli` package alone (never apps/ or tests/), and
`python -m cli` runs the same program."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools.config.pyprojecttoml import read_configuration

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]


# Older setuptools call [tool.setuptools] in pyproject.toml "beta" (a UserWarning).
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_console_script_and_the_only_package_are_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"bellwether": "cli.main:main"}
    assert project["tool"]["setuptools"]["packages"] == ["cli"]
    # setuptools reads it the same way (no automatic discovery of the tree).
    configuration = read_configuration(ROOT / "pyproject.toml")
    assert configuration["tool"]["setuptools"]["packages"] == ["cli"]


def test_the_cli_dependency_is_pinned_for_the_server_checkout():
    pinned = (ROOT / "requirements.txt").read_text().splitlines()
    assert any(line.startswith("rich==") for line in pinned)


def test_the_make_install_step_installs_the_project_after_its_requirements():
    makefile = (ROOT / "Makefile").read_text()
    requirements = makefile.index("pip install --quiet -r requirements.txt")
    project = makefile.index("pip install --quiet --no-deps -e .")
    assert requirements < project


def test_python_dash_m_cli_is_the_command(capsys):
    assert main(["--help"]) == 0
    assert "Exit codes:" in capsys.readouterr().out
    result = subprocess.run([sys.executable, "-m", "cli", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "usage: bellwether" in result.stdout
