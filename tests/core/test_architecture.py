"""The architecture holds: the import contracts pass, an upward import breaks them,
there is no import cycle, the CLI imports nothing of the server, the agent uses the
standard library alone, and no function in apps/ outgrows 60 lines (modules are
split by concept, not by size)."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("apps", "agentapi", "configlang", "agent", "project", "cli")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / ".importlinter"), "--no-cache"],
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120)


def _copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "upward", "contract"), [
    ("apps/fleet/services.py", "from apps.releases import services as releases",
     "Domain layers"),
    ("apps/core/errors.py", "from apps.environments.models import Environment",
     "Domain layers"),
    ("apps/snapshots/selectors.py", "from apps.snapshots import api",
     "Nothing below the interfaces"),
    ("configlang/merge.py", "from django.conf import settings", "The configuration language"),
    ("agent/files.py", "import yaml", "The agent imports nothing"),
    ("cli/client.py", "from apps.core import errors", "The CLI imports nothing"),
    ("cli/render.py", "import django", "The CLI imports nothing"),
    ("apps/fleet/services.py", "from agentapi import longpoll", "The domain never imports"),
])
def test_an_upward_import_breaks_a_contract(tmp_path, module, upward, contract):
    tree = _copy(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{upward}  # noqa\n")

    result = _lint_imports(tree)

    assert result.returncode == 1, result.stdout
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]
    assert len(broken) == 1 and broken[0].startswith(contract), result.stdout


def _graph():
    return grimp.build_graph(*PACKAGES, include_external_packages=True)


def test_no_module_imports_itself_through_others():
    graph = _graph()
    modules = [m for m in graph.modules if m.split(".")[0] in PACKAGES]
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(module):  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] not in PACKAGES:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in modules:
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_agent_imports_the_standard_library_only():
    graph = _graph()
    agent_modules = {m for m in graph.modules if m.split(".")[0] == "agent"}
    imported = {i.split(".")[0] for m in agent_modules
                for i in graph.find_modules_directly_imported_by(m)}
    assert imported - {"agent"} <= set(sys.stdlib_module_names)


def _sources():
    return [p for p in (ROOT / "apps").rglob("*.py") if "migrations" not in p.parts]


def test_no_function_in_apps_is_over_60_lines():
    long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    size := node.end_lineno - node.lineno + 1) > 60:
                long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert long == {}


def test_every_row_lock_goes_through_core_locks():
    locking = sorted(str(p.relative_to(ROOT)) for p in _sources()
                     if "select_for_update" in p.read_text())
    assert locking == ["apps/core/locks.py"]
