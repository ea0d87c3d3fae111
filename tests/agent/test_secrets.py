"""The agent resolves only the placeholders its bundle's secrets manifest lists, within
its --secret-allow list, from regular files of a bounded size, into 0600 files."""

from __future__ import annotations

import os
import threading

import pytest

from agent.apply import FAILED, SUCCEEDED
from agent.health import Probe
from agent.references import (
    MAX_SECRET_FILE_BYTES,
    SecretError,
    allowed,
    read_secret_file,
    redact,
)
from tests.agent.support import LEGACY, make_bundle, manifest_of, sealed, tree

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHOP_DB": "db-pass",
       "AWS_SECRET_ACCESS_KEY": "aws-key"}


def apply(host, files, number=1, **kwargs):
    secrets = kwargs.pop("secrets", None)
    mode = kwargs.pop("secret_file_mode", None)
    applier = host.applier(environ=kwargs.pop("environ", ENV), **kwargs)
    return applier.apply(make_bundle(number, files, secrets=secrets, secret_file_mode=mode),
                         host.load_state())


# --- only manifest placeholders ----------------------------------------------------------


@pytest.mark.parametrize("text", [
    "${secret:env:AWS_SECRET_ACCESS_KEY}",
    "${secret:file:/etc/hostname}",
    "${secret:sealed:" + "5e" * 16 + ":env:AWS_SECRET_ACCESS_KEY}",  # not in the manifest
    "$" + "{secret:env:AWS_SECRET_ACCESS_KEY}",
    "\uff04{secret:env:AWS_SECRET_ACCESS_KEY}",  # a fullwidth dollar
])
def test_text_not_listed_in_the_manifest_is_written_as_text(host, text):
    outcome = apply(host, {"app.conf": f"k={text}\n"}, secrets=[])

    assert outcome.status == SUCCEEDED, outcome
    assert (host.target / "app.conf").read_text() == f"k={text}\n"
    assert "aws-key" not in (host.target / "app.conf").read_text()


def test_a_manifest_placeholder_is_substituted_and_its_file_is_0600(host):
    outcome = apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n", "plain.conf": "x\n"})

    assert outcome.status == SUCCEEDED
    assert (host.target / "app.conf").read_text() == "db=db-pass\n"
    assert os.stat(host.target / "app.conf").st_mode & 0o777 == 0o600
    assert os.stat(host.target / "plain.conf").st_mode & 0o777 == 0o644


def test_a_file_receiving_a_secret_is_0600_even_replacing_a_wider_older_file(host):
    (host.target / "app.conf").write_text("old\n")
    os.chmod(host.target / "app.conf", 0o666)

    assert apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"}).status == SUCCEEDED

    assert os.stat(host.target / "app.conf").st_mode & 0o777 == 0o600


# --- the environment's secret_file_mode ------------------------------------------------


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o7777


@pytest.mark.parametrize("declared", ["0640", "0440", "0400", "0750", "640"])
def test_a_declared_secret_file_mode_is_applied_also_replacing_a_wider_file(host, declared):
    (host.target / "app.conf").write_text("old\n")
    os.chmod(host.target / "app.conf", 0o666)
    (host.target / "plain.conf").write_text("old\n")
    os.chmod(host.target / "plain.conf", 0o664)

    outcome = apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n", "plain.conf": "x\n"},
                    secret_file_mode=declared)

    assert outcome.status == SUCCEEDED, outcome
    assert _mode(host.target / "app.conf") == int(declared, 8)
    assert _mode(host.target / "plain.conf") == 0o664  # no secret: its mode is kept


def test_a_declared_mode_holds_for_a_staged_validation_too(host, tmp_path):
    seen = tmp_path / "staged-mode"
    validate = f'stat -c %a "$BELLWETHER_STAGED_DIR/app.conf" > {seen}'

    outcome = apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"},
                    secret_file_mode="0640", validate=validate)

    assert outcome.status == SUCCEEDED, outcome
    assert seen.read_text().strip() == "640"
    assert _mode(host.target / "app.conf") == 0o640


@pytest.mark.parametrize("declared", ["0644", "0604", "0660", "0666", "0777", "0200",
                                      "0000", "4640", "00640", "0o640", "rw-r-----", "",
                                      416, ["0640"], {"mode": "0640"}])
def test_a_bundle_declaring_a_mode_that_exposes_a_secret_fails_and_writes_nothing(
        host, declared):
    outcome = apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"},
                    secret_file_mode=declared)

    assert outcome.status == FAILED, outcome
    assert "secret_file_mode" in outcome.message and "nothing was written" in outcome.message
    assert tree(host.target) == {}


def test_a_mode_a_bundle_adds_after_the_server_announced_it_fails_the_checksum(host):
    bundle = make_bundle(1, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"})
    bundle["secret_file_mode"] = "0640"  # not what the checksum covers

    outcome = host.applier(environ=ENV).apply(bundle, host.load_state())

    assert outcome.status == FAILED and "checksum" in outcome.message
    assert tree(host.target) == {}


def test_a_placeholder_is_substituted_only_in_the_files_the_manifest_names(host):
    placeholder = sealed("env:SHOP_DB")
    files = {"a.conf": placeholder, "b.conf": placeholder}
    manifest = [{"placeholder": placeholder, "reference": "env:SHOP_DB", "files": ["a.conf"]}]

    assert apply(host, files, secrets=manifest).status == SUCCEEDED

    assert (host.target / "a.conf").read_text() == "db-pass"
    assert (host.target / "b.conf").read_text() == placeholder


def test_a_secret_value_holding_a_placeholder_is_not_substituted_again(host):
    other = sealed("env:AWS_SECRET_ACCESS_KEY", token="ab" * 16)
    files = {"a.conf": f"{sealed('env:SHOP_DB')}|{other}"}
    environ = {**ENV, "SHOP_DB": other}

    assert apply(host, files, environ=environ).status == SUCCEEDED

    assert (host.target / "a.conf").read_text() == f"{other}|aws-key"


def test_a_bundle_without_a_manifest_holding_secret_text_fails_and_writes_nothing(host):
    outcome = apply(host, {"app.conf": "k=${secret:env:SHOP_DB}\n"}, secrets=LEGACY)

    assert outcome.status == FAILED
    assert "no secrets manifest" in outcome.message and "publish it again" in outcome.message
    assert tree(host.target) == {}


def test_a_bundle_without_a_manifest_and_without_secret_text_applies(host):
    assert apply(host, {"app.conf": "plain\n"}, secrets=LEGACY).status == SUCCEEDED


@pytest.mark.parametrize("manifest", [
    "env:SHOP_DB", [{"placeholder": 1, "reference": "env:SHOP_DB"}],
    [{"placeholder": "no-dollar", "reference": "env:SHOP_DB"}],
    [{"placeholder": "${secret:x}"}], [["${secret:x}", "env:X"]],
    [{"placeholder": sealed("env:SHOP_DB"), "reference": "env:SHOP_DB"}],  # no files
    [{"placeholder": sealed("env:SHOP_DB"), "reference": "env:AWS_SECRET_ACCESS_KEY",
      "files": ["app.conf"]}],  # a reference other than the placeholder's
    [{"placeholder": "${secret:env:SHOP_DB}", "reference": "env:SHOP_DB",
      "files": ["app.conf"]}],  # not a sealed placeholder
])
def test_a_malformed_manifest_fails_and_writes_nothing(host, manifest):
    outcome = apply(host, {"app.conf": "x\n"}, secrets=manifest)

    assert outcome.status == FAILED and "malformed" in outcome.message
    assert tree(host.target) == {}


# --- file: references --------------------------------------------------------------------


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "/dev/urandom", "/etc"])
def test_a_file_reference_to_a_device_or_directory_fails_naming_it(host, special):
    files = {"app.conf": sealed(f"file:{special}")}

    outcome = apply(host, files)

    assert outcome.status == FAILED
    assert f"file:{special}" in outcome.message and "not a regular file" in outcome.message
    assert tree(host.target) == {}


def test_a_file_reference_to_a_fifo_fails_without_blocking(host, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(target=lambda: done.append(
        apply(host, {"app.conf": sealed(f"file:{fifo}")})), daemon=True)

    worker.start()
    worker.join(5)

    assert done, "reading a fifo blocked the agent"
    assert done[0].status == FAILED and "not a regular file" in done[0].message


def test_a_file_reference_through_a_symlink_to_dev_zero_fails(host, tmp_path):
    link = tmp_path / "innocent"
    link.symlink_to("/dev/zero")

    outcome = apply(host, {"app.conf": sealed(f"file:{link}")})

    assert outcome.status == FAILED and "not a regular file" in outcome.message


def test_a_file_reference_larger_than_the_limit_fails_naming_it(host, tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as handle:
        handle.truncate(MAX_SECRET_FILE_BYTES + 1)

    outcome = apply(host, {"app.conf": sealed(f"file:{big}")})

    assert outcome.status == FAILED
    assert f"file:{big}" in outcome.message and "larger than" in outcome.message


def test_a_file_of_exactly_the_limit_is_read(tmp_path):
    path = tmp_path / "edge"
    path.write_bytes(b"a" * MAX_SECRET_FILE_BYTES)

    assert len(read_secret_file(str(path))) == MAX_SECRET_FILE_BYTES


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8"])
def test_a_file_reference_that_is_not_text_fails(tmp_path, content):
    path = tmp_path / "binary"
    path.write_bytes(content)

    with pytest.raises(SecretError, match="not UTF-8"):
        read_secret_file(str(path))


def test_every_problem_is_reported_together(host, tmp_path):
    files = {"a.conf": sealed("file:/dev/zero") + sealed("env:MISSING")
             + sealed("vault:kv/x#y")}

    outcome = apply(host, files)

    for reference in ("file:/dev/zero", "env:MISSING", "vault:kv/x#y"):
        assert reference in outcome.message


# --- --secret-allow ---------------------------------------------------------------------


@pytest.mark.parametrize("reference, patterns, expected", [
    ("env:SHOP_DB", ["env:SHOP_*"], True),
    ("env:AWS_SECRET_ACCESS_KEY", ["env:SHOP_*"], False),
    ("file:/etc/shop/db", ["file:/etc/shop/"], True),
    ("file:/etc/shopping/db", ["file:/etc/shop/"], False),
    ("file:/etc/shop", ["file:/etc/shop/"], False),
    ("env:SHOP_DB", None, True),
])
def test_allowed_matches_prefixes_ending_in_a_slash_and_globs(reference, patterns, expected):
    assert allowed(reference, patterns) is expected


def test_a_reference_outside_secret_allow_fails_the_apply_naming_it(host):
    files = {"a.conf": sealed("env:SHOP_DB"), "b.conf": sealed("env:AWS_SECRET_ACCESS_KEY")}

    outcome = apply(host, files, secret_allow=["env:SHOP_*"])

    assert outcome.status == FAILED
    assert "env:AWS_SECRET_ACCESS_KEY is outside this agent's --secret-allow" in outcome.message
    assert "env:SHOP_DB" not in outcome.message
    assert tree(host.target) == {}


def test_a_file_reference_escaping_an_allowed_directory_is_refused(host, tmp_path):
    allowed_dir = tmp_path / "shop"
    allowed_dir.mkdir()
    (allowed_dir / "db").write_text("ok")
    (tmp_path / "private").write_text("host secret")
    (allowed_dir / "link").symlink_to(tmp_path / "private")
    allow = [f"file:{allowed_dir}/"]

    for escaping in (f"{allowed_dir}/../private", f"{allowed_dir}/link"):
        outcome = apply(host, {"a.conf": sealed(f"file:{escaping}")}, secret_allow=allow)
        assert outcome.status == FAILED and "--secret-allow" in outcome.message
    outcome = apply(host, {"a.conf": sealed(f"file:{allowed_dir}/db")}, secret_allow=allow)
    assert outcome.status == SUCCEEDED
    assert (host.target / "a.conf").read_text() == "ok"


def test_manifest_of_lists_each_placeholder_once_with_its_files():
    p = sealed("env:A")
    assert manifest_of({"x": p + p, "y": p}) == [
        {"placeholder": p, "reference": "env:A", "files": ["x", "y"]}]


@pytest.mark.parametrize("reference", [
    "vault:kv/shop/../blog#password", "vault:kv/shop/%2e%2e/blog#password",
    "vault:kv/shop//db#password", "vault:kv/shop/./db#password", "vault:/kv/shop#password",
    "vault:kv/shop/%2e%2e%2fblog#password", "vault:kv/shop/..%2fblog#password",
    "vault:kv/shop/%252e%252e/blog#password", "vault:kv/shop/a%5cb#password",
])
def test_a_vault_reference_with_dot_or_empty_segments_fails_before_the_allow_list(
        host, reference):
    outcome = apply(host, {"a.conf": sealed(reference)}, secret_allow=["vault:kv/shop/*"])

    assert outcome.status == FAILED
    assert f"{reference} has an empty, `.` or `..` path segment" in outcome.message
    assert tree(host.target) == {}


def test_a_plain_vault_reference_within_the_allow_list_is_still_a_kind_not_resolved(host):
    outcome = apply(host, {"a.conf": sealed("vault:kv/shop/db#password")},
                    secret_allow=["vault:kv/shop/*"])

    assert outcome.status == FAILED and "does not resolve (vault:)" in outcome.message


# --- resolved values never leave the host in reports or logs ---------------------------


def test_a_validate_command_echoing_a_secret_reports_it_redacted(host, caplog):
    validate = "cat {staged}/app.conf; exit 1"

    with caplog.at_level("DEBUG", logger="agent"):
        outcome = apply(host, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"}, validate=validate)

    assert outcome.status == FAILED
    assert "db=[secret]" in outcome.message
    assert "db-pass" not in outcome.message
    assert "db-pass" not in caplog.text


def test_a_health_probe_printing_a_secret_reports_it_redacted(host, tmp_path):
    secret_file = tmp_path / "key"
    secret_file.write_text("line-one-of-the-key\nline-two-of-the-key\n")
    probe = Probe(command=f"cat {host.target}/app.conf; exit 1", attempts=1)

    outcome = apply(host, {"app.conf": f"k={sealed('file:' + str(secret_file))}\n"},
                    probe=probe)

    assert outcome.health["ok"] is False
    for reported in (outcome.message, outcome.health["output"]):
        assert "line-one" not in reported and "line-two" not in reported
        assert "k=[secret]" in reported


def test_redact_takes_the_longest_value_first_and_leaves_short_ones():
    assert redact("a=abcdef b=abcd c=ab", {"abcd", "abcdef", "ab"}) == \
        "a=[secret] b=[secret] c=ab"
