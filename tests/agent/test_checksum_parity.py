"""The agent's copy of content_checksum (agent/apply.py, standard library only) gives
exactly the server's (configlang/rendering.py): an agent refuses any bundle whose
files do not hash to the checksum the server announced, so the two must never drift."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.apply import content_checksum as agent_checksum
from apps.environments.services import environment_file_put
from configlang.rendering import content_checksum as server_checksum
from tests import factories


def files(*pairs) -> list[dict]:
    return [{"path": path, "content": content} for path, content in pairs]


FILE_LISTS = {
    "empty": [],
    "one file": files(("nginx.conf", "worker_processes 2;\n")),
    "empty content": files(("empty.conf", "")),
    "sorted": files(("a.conf", "a\n"), ("b.conf", "b\n"), ("c/d.conf", "d\n")),
    "unsorted": files(("z.conf", "z\n"), ("a.conf", "a\n"), ("m/n.conf", "n\n")),
    "unicode paths": files(("sites/café.conf", "x\n"), ("日本/設定.conf", "y\n"),
                           ("emoji-🚀.txt", "z\n")),
    "unicode content": files(("a.conf", "ünïcödé — “quotes” ✓\n"), ("b.conf", "中文\n"),
                             ("c.conf", "🙂 astral plane\n")),
    "newlines": files(("unix.conf", "a\nb\n"), ("windows.conf", "a\r\nb\r\n"),
                      ("old-mac.conf", "a\rb\r"), ("none.conf", "no newline at the end"),
                      ("only.conf", "\n\n\n")),
    "json-escaped characters": files(("q.conf", 'say "hi" \\ back\\slash\t tab'),
                                     ("ctl.conf", "\x00\x01\x1f\x7f"),
                                     ("sep.conf", "\u2028 line separator \u2029")),
    "prefix paths": files(("a", "1"), ("a/b", "2"), ("a.b", "3"), ("a-b", "4"), ("A", "5")),
    "same path twice": files(("dup.conf", "first\n"), ("dup.conf", "second\n")),
}


@pytest.mark.parametrize("entries", FILE_LISTS.values(), ids=FILE_LISTS.keys())
def test_the_agent_computes_the_servers_checksum(entries):
    assert agent_checksum(entries) == server_checksum(entries)


# A snapshot's paths are distinct; only then is the order of the files irrelevant.
DISTINCT_PATHS = {name: entries for name, entries in FILE_LISTS.items()
                  if len({f["path"] for f in entries}) == len(entries)}


@pytest.mark.parametrize("entries", DISTINCT_PATHS.values(), ids=DISTINCT_PATHS.keys())
def test_the_order_of_the_files_changes_neither_checksum(entries):
    reordered = list(reversed(entries))

    assert agent_checksum(reordered) == server_checksum(entries) == server_checksum(reordered)


def test_both_refuse_a_lone_surrogate_alike():
    entries = files(("a.conf", "\ud800"))

    with pytest.raises(UnicodeEncodeError):
        server_checksum(entries)
    with pytest.raises(UnicodeEncodeError):
        agent_checksum(entries)


# Any text UTF-8 can encode (no lone surrogates), control characters and astral
# planes included.
TEXT = st.text(st.characters(exclude_categories=["Cs"]))
FILE = st.fixed_dictionaries({"path": TEXT, "content": TEXT})


@given(st.lists(FILE, max_size=8))
def test_any_file_list_has_the_same_checksum_on_both_sides(entries):
    assert agent_checksum(entries) == server_checksum(entries)


@given(st.lists(FILE, max_size=8, unique_by=lambda f: f["path"]),
       st.randoms(use_true_random=False))
def test_any_order_of_distinct_paths_has_the_same_checksum_on_both_sides(entries, rng):
    shuffled = list(entries)
    rng.shuffle(shuffled)

    assert agent_checksum(shuffled) == server_checksum(entries)


@pytest.mark.usefixtures("empty_cache")
def test_a_served_bundle_hashes_to_the_checksum_the_server_announces(environment, superuser):
    """The whole way, as the agent goes: rendered and stored by the server, announced
    by the poll, served as JSON and decoded."""
    environment_file_put(environment=environment, kind="template", path="sites/café.conf",
                         text="ünïcödé {{ workers }} ✓\r\n🙂\n", actor=superuser)
    snapshot = factories.publish(environment, superuser)
    agent = factories.enrolled_agent(environment, actor=superuser)

    announced = factories.poll(agent.client).json()["snapshot"]
    bundle = agent.client.get(announced["bundle_url"]).json()

    assert "sites/café.conf" in [f["path"] for f in bundle["files"]]
    assert announced["checksum"] == snapshot.checksum == agent_checksum(bundle["files"])


def test_both_sides_write_sealed_placeholders_as_their_reference():
    from agent.references import PLACEHOLDER as AGENT_PLACEHOLDER
    from configlang.secrets import PLACEHOLDER

    token, other = "ab" * 16, "cd" * 16
    sealed = files(("a.conf", f"x=${{secret:sealed:{token}:env:SHOP_DB}}\n"),
                   ("b.conf", f"${{secret:sealed:{token}:file:/etc/shop/k}}"
                              "${secret:sealed:" + "ef" * 16 + ":nope}"))
    resealed = [{**f, "content": f["content"].replace(token, other)} for f in sealed]

    assert AGENT_PLACEHOLDER.pattern == PLACEHOLDER.pattern
    assert agent_checksum(sealed) == server_checksum(sealed) == server_checksum(resealed)
    assert server_checksum(sealed) == server_checksum(files(
        ("a.conf", "x=${secret:env:SHOP_DB}\n"),
        ("b.conf", "${secret:file:/etc/shop/k}${secret:sealed:" + "ef" * 16 + ":nope}")))


@pytest.mark.parametrize("entries", DISTINCT_PATHS.values(), ids=DISTINCT_PATHS.keys())
def test_a_declared_secret_file_mode_is_in_both_checksums_alike(entries):
    with_mode = server_checksum(entries, "0640")

    assert agent_checksum(entries, "0640") == with_mode
    assert with_mode not in {server_checksum(entries), server_checksum(entries, "0440")}
