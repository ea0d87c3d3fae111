"""The files of deploy/ as the tests run them: a unit's command line with its
placeholders filled in, the environment file's settings."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
INSTALLED_BIN = "/opt/bellwether/.venv/bin/"


def unit_section(unit: str, section: str = "Service") -> list[tuple[str, str]]:
    """(key, value) of each line in `section` of deploy/systemd/`unit`, in order."""
    lines, current = [], None
    for line in (DEPLOY / "systemd" / unit).read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            current = line.strip("[]")
        elif current == section and line and not line.startswith("#"):
            key, _, value = line.partition("=")
            lines.append((key, value))
    return lines


def unit_command(unit: str, specifiers: dict[str, str] | None = None,
                 **environ: str) -> list[str]:
    """The unit's ExecStart as it would run: its specifiers (%i, %S) as given,
    ${NAME} from the unit's Environment= lines overridden by `environ`, the
    installed virtualenv's executables as this interpreter's."""
    section = unit_section(unit)
    values = dict(value.split("=", 1) for key, value in section if key == "Environment")
    values.update(environ)
    [command] = [value for key, value in section if key == "ExecStart"]
    for specifier, value in (specifiers or {}).items():
        command = command.replace(specifier, value)
    command = re.sub(r"\$\{(\w+)\}", lambda m: values[m[1]], command)
    assert "%" not in command and "$" not in command, command
    bin_dir = str(Path(sys.executable).parent) + "/"
    return [word.replace(INSTALLED_BIN, bin_dir, 1) for word in shlex.split(command)]


def environment_file() -> dict[str, str]:
    """deploy/bellwether.env's settings (an empty value is left out: the operator's)."""
    settings = {}
    for line in (DEPLOY / "bellwether.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            if value:
                settings[name] = value
    return settings


def certificate(directory) -> tuple[str, str]:
    """(certificate, key) for 127.0.0.1, self-signed."""
    cert, key = directory / "fullchain.pem", directory / "privkey.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return str(cert), str(key)


def site_filled(*, https: int, http: int, agents: int, app: int, cert: str, key: str,
                log) -> str:
    """The shipped site with this test's addresses, certificate and log; IPv6
    listeners left out (the test binds loopback)."""
    site = (DEPLOY / "nginx" / "bellwether.conf").read_text()
    site = "\n".join(line for line in site.splitlines() if "listen [::]" not in line)
    upstreams = {"bellwether_web": app, "bellwether_agents": agents}
    for name, port in upstreams.items():
        site = re.sub(rf"(upstream {name} {{)(.*?)(\n    keepalive)",
                      rf"\1\n    server 127.0.0.1:{port};\3", site, flags=re.S)
    filled = {"listen 443 ssl;": f"listen 127.0.0.1:{https} ssl;",
              "listen 80;": f"listen 127.0.0.1:{http};",
              "/etc/ssl/bellwether/fullchain.pem": cert,
              "/etc/ssl/bellwether/privkey.pem": key,
              "/var/log/nginx/bellwether.access.log": str(log)}
    for placeholder, value in filled.items():
        assert placeholder in site, placeholder
        site = site.replace(placeholder, value)
    return site
