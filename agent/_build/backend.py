"""A PEP 517 build backend for the agent, standard library only: building the
`bellwether-agent` wheel needs nothing installed (no setuptools, no wheel),
so `pip install ./agent` works offline on any host with pip.

The wheel holds the `agent` package (the .py files of agent/) and the
`bellwether-agent` console script; it declares no dependency.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

NAME = "bellwether-agent"
DIST = "bellwether_agent"
PACKAGE = "agent"
REQUIRES_PYTHON = ">=3.8"
SUMMARY = "Bellwether agent: applies this host's configuration snapshots safely"
SCRIPTS = {"bellwether-agent": "agent.cli:main"}
SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _version() -> str:
    with open(os.path.join(SOURCE, "__init__.py"), encoding="utf-8") as handle:
        match = re.search(r'^__version__ = "([^"]+)"', handle.read(), re.M)
    if match is None:
        raise RuntimeError("agent/__init__.py has no __version__")
    return match[1]


def _modules() -> list:
    return sorted(n for n in os.listdir(SOURCE) if n.endswith(".py"))


def _metadata(version: str) -> str:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            f"Summary: {SUMMARY}\nRequires-Python: {REQUIRES_PYTHON}\n")


def _dist_info(version: str) -> dict:
    info = f"{DIST}-{version}.dist-info"
    scripts = "".join(f"{name} = {target}\n" for name, target in SCRIPTS.items())
    return {
        f"{info}/METADATA": _metadata(version),
        f"{info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: agent/_build/backend.py\n"
                          "Root-Is-Purelib: true\nTag: py3-none-any\n"),
        f"{info}/entry_points.txt": f"[console_scripts]\n{scripts}",
    }


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{path},sha256={digest.decode()},{len(data)}\n"


def get_requires_for_build_wheel(config_settings=None) -> list:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list:
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    version = _version()
    files = {}
    for module in _modules():
        with open(os.path.join(SOURCE, module), "rb") as handle:
            files[f"{PACKAGE}/{module}"] = handle.read()
    for path, text in _dist_info(version).items():
        files[path] = text.encode()
    record = f"{DIST}-{version}.dist-info/RECORD"
    lines = "".join(_record_line(path, data) for path, data in files.items())
    files[record] = (lines + f"{record},,\n").encode()
    name = f"{DIST}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w",
                         zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data, zipfile.ZIP_DEFLATED)
    return name


def build_sdist(sdist_directory, config_settings=None) -> str:
    """The agent's directory as it is (its modules, pyproject.toml and this backend)."""
    version = _version()
    root = f"{DIST}-{version}"
    name = f"{root}.tar.gz"
    members = ([*_modules(), "pyproject.toml", "_build/backend.py"])
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as sdist:
        for member in members:
            sdist.add(os.path.join(SOURCE, member), arcname=f"{root}/{member}")
        pkg_info = _metadata(version).encode()
        info = tarfile.TarInfo(f"{root}/PKG-INFO")
        info.size = len(pkg_info)
        sdist.addfile(info, io.BytesIO(pkg_info))
    return name
