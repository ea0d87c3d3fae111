"""agent/files.py: atomic writes, temp-file clean-up, path confinement, backup/restore."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from agent import files as fs
from tests.agent.support import temp_files, tree


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_write_atomic_creates_parent_directories_and_writes_exact_bytes(tmp_path):
    path = tmp_path / "a" / "b" / "site.conf"
    data = b"line 1\r\nzw\xc3\xb6lf \xe2\x82\xac\x00no trailing newline"

    fs.write_atomic(str(path), data)

    assert path.read_bytes() == data
    assert temp_files(tmp_path) == []


def test_write_atomic_replaces_the_file_whole_so_an_open_reader_keeps_the_old_content(
        tmp_path):
    path = tmp_path / "site.conf"
    path.write_bytes(b"old " * 1000)
    old_inode = path.stat().st_ino

    with open(path, "rb") as reader:
        fs.write_atomic(str(path), b"new")
        assert reader.read() == b"old " * 1000

    assert path.read_bytes() == b"new"
    assert path.stat().st_ino != old_inode  # renamed into place, not rewritten


def test_concurrent_readers_only_ever_see_a_complete_old_or_new_file(tmp_path):
    path = tmp_path / "big.conf"
    versions = [b"A" * 300_000, b"B" * 200_000]
    fs.write_atomic(str(path), versions[0])
    done = threading.Event()
    seen = []

    def read_constantly():
        while not done.is_set():
            seen.append(path.read_bytes())

    reader = threading.Thread(target=read_constantly)
    reader.start()
    try:
        for i in range(40):
            fs.write_atomic(str(path), versions[i % 2])
    finally:
        done.set()
        reader.join()

    assert seen, "the reader never ran"
    assert all(content in versions for content in seen), (
        {len(c) for c in seen if c not in versions})


def test_write_atomic_removes_its_temp_file_when_the_rename_fails(tmp_path):
    # The destination is a non-empty directory: the rename fails after the temp
    # file was written and fsynced.
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "keep").write_text("kept")

    with pytest.raises(OSError):
        fs.write_atomic(str(tmp_path / "conf.d"), b"a file now")

    assert temp_files(tmp_path) == []
    assert (tmp_path / "conf.d" / "keep").read_text() == "kept"


def test_write_atomic_removes_its_temp_file_when_writing_fails(tmp_path):
    path = tmp_path / "site.conf"
    path.write_bytes(b"before")

    with pytest.raises(TypeError):
        fs.write_atomic(str(path), "not bytes")  # type: ignore[arg-type]

    assert temp_files(tmp_path) == []
    assert path.read_bytes() == b"before"


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_write_atomic_gives_the_file_the_requested_mode(tmp_path, mode):
    path = tmp_path / "secret.pem"
    path.write_bytes(b"old")
    os.chmod(path, 0o666)

    fs.write_atomic(str(path), b"key", mode=mode)

    assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.usefixtures("umask_022")
def test_write_atomic_default_mode_is_world_readable_0644(tmp_path):
    fs.write_atomic(str(tmp_path / "a.conf"), b"x")

    assert stat.S_IMODE((tmp_path / "a.conf").stat().st_mode) == 0o644


def test_remove_temp_files_deletes_only_leftover_temp_files_in_every_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.conf").write_text("a")
    key = "0123456789abcdef"
    (tmp_path / f".a.conf{fs.TEMP_MARKER}{key}-0123abcd").write_text("half")
    (tmp_path / "sub" / f".b.conf{fs.TEMP_MARKER}{key}-deadbeef").write_text("half")
    (tmp_path / f".c.conf{fs.TEMP_MARKER}0123abcd").write_text("a snapshot's")

    assert fs.remove_temp_files(str(tmp_path), key) == 2

    assert tree(tmp_path) == {"a.conf": b"a", f".c.conf{fs.TEMP_MARKER}0123abcd": b"a snapshot's"}


def test_remove_file_ignores_a_missing_file(tmp_path):
    fs.remove_file(str(tmp_path / "absent"))
    (tmp_path / "present").write_text("x")

    fs.remove_file(str(tmp_path / "present"))

    assert not (tmp_path / "present").exists()


@pytest.mark.parametrize("relative", ["a.conf", "sub/dir/b.conf", ".hidden", "a..b/..c",
                                      "é" * 127 + "x", "/".join(["d" * 200] * 5)])
def test_inside_accepts_plain_relative_paths_under_the_root(tmp_path, relative):
    path = fs.inside(str(tmp_path), relative)

    assert path == os.path.join(os.path.realpath(tmp_path), relative)


@pytest.mark.parametrize("relative", ["../x", "sub/../../x", "/etc/passwd", ".", "", "./..",
                                      "sub/.."])
def test_inside_refuses_paths_leaving_the_root_or_naming_the_root(tmp_path, relative):
    with pytest.raises(ValueError, match="leaves the target directory"):
        fs.inside(str(tmp_path / "root"), relative)


@pytest.mark.parametrize(("relative", "problem"), [
    # `..` that comes back inside: from a directory one level deeper (the staged
    # tree), the same path would leave.
    ("../root/x.conf", "has an empty, '.' or '..' segment"),
    ("sub/../x.conf", "has an empty, '.' or '..' segment"),
    ("./x.conf", "has an empty, '.' or '..' segment"),
    ("sub//x.conf", "has an empty, '.' or '..' segment"),
    ("sub/x.conf/", "has an empty, '.' or '..' segment"),
    ("x\x00.conf", "contains a NUL character"),
    ("x\ud800.conf", "is not UTF-8 text"),
    ("n" * 256, "has a name longer than 255 bytes"),
    ("é" * 128, "has a name longer than 255 bytes"),
    ("/".join(["d" * 200] * 6), "is longer than 1024 bytes"),
])
def test_inside_refuses_paths_that_are_not_plain_relative_paths(tmp_path, relative, problem):
    (tmp_path / "root").mkdir()

    with pytest.raises(ValueError) as refused:
        fs.inside(str(tmp_path / "root"), relative)

    assert str(refused.value) == f"path {relative!r} {problem}"
    assert fs.path_problem(relative) == problem


def test_inside_names_the_directory_it_checks_in(tmp_path):
    (tmp_path / "staged").mkdir()
    (tmp_path / "staged" / "conf.d").symlink_to(tmp_path)

    with pytest.raises(fs.LinkLeaves, match="leaves the staged directory through a symbolic"):
        fs.inside(str(tmp_path / "staged"), "conf.d/x.conf", "the staged directory")


def test_make_directories_sets_exact_modes_on_what_it_makes_only(tmp_path):
    (tmp_path / "there").mkdir(mode=0o711)
    os.chmod(tmp_path / "there", 0o711)
    old = os.umask(0o000)
    try:
        fs.make_directories(str(tmp_path / "there" / "a" / "b"), 0o700, parents_mode=0o755)
    finally:
        os.umask(old)

    modes = {p: stat.S_IMODE(os.stat(tmp_path / p).st_mode) for p in ("there", "there/a",
                                                                       "there/a/b")}
    assert modes == {"there": 0o711, "there/a": 0o755, "there/a/b": 0o700}


def test_make_directories_refuses_a_file_on_the_way(tmp_path):
    (tmp_path / "file").write_text("x")

    with pytest.raises(FileExistsError):
        fs.make_directories(str(tmp_path / "file" / "sub"))


def test_a_temp_file_beside_a_255_byte_name_stays_within_255_bytes(tmp_path):
    name = "é" * 127 + "x"  # 255 bytes

    fs.write_atomic(str(tmp_path / name), b"data")

    assert (tmp_path / name).read_bytes() == b"data"
    assert len(os.path.basename(fs._temp_path(str(tmp_path), name)).encode()) <= 255


def test_inside_refuses_a_symlinked_directory_pointing_outside(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)

    with pytest.raises(ValueError, match="leaves the target directory"):
        fs.inside(str(root), "link/evil.conf")


def test_backup_then_restore_puts_back_old_bytes_and_removes_paths_that_did_not_exist(
        tmp_path):
    root, backup_dir = tmp_path / "root", tmp_path / "backup"
    (root / "sub").mkdir(parents=True)
    (root / "a.conf").write_bytes(b"\xff\xfeold a")
    (root / "sub" / "b.conf").write_bytes(b"old b")
    before = tree(root)

    manifest = fs.backup(str(root), ["a.conf", "sub/b.conf", "new.conf"], str(backup_dir))
    (root / "a.conf").write_bytes(b"new a")
    (root / "sub" / "b.conf").unlink()
    (root / "new.conf").write_bytes(b"new")
    fs.restore(str(root), manifest, str(backup_dir))

    assert manifest == {"existed": ["a.conf", "sub/b.conf"], "links": {},
                        "paths": ["a.conf", "new.conf", "sub/b.conf"]}
    assert tree(root) == before
    assert tree(backup_dir) == {"a.conf": b"\xff\xfeold a", "sub/b.conf": b"old b"}


def test_backup_replaces_the_previous_backup(tmp_path):
    root, backup_dir = tmp_path / "root", tmp_path / "backup"
    root.mkdir()
    (root / "a.conf").write_text("a")
    (root / "b.conf").write_text("b")
    fs.backup(str(root), ["a.conf"], str(backup_dir))

    fs.backup(str(root), ["b.conf"], str(backup_dir))

    assert tree(backup_dir) == {"b.conf": b"b"}


# --- symbolic links: a managed path is replaced, never followed ---------------------------


def test_write_atomic_replaces_a_symlink_at_the_path_and_never_writes_through_it(tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("unmanaged")
    os.chmod(other, 0o600)
    (tmp_path / "site.conf").symlink_to(other)

    fs.write_atomic(str(tmp_path / "site.conf"), b"managed", mode=0o644)

    assert not (tmp_path / "site.conf").is_symlink()
    assert (tmp_path / "site.conf").read_bytes() == b"managed"
    assert (other.read_text(), stat.S_IMODE(os.stat(other).st_mode)) == ("unmanaged", 0o600)


def test_inside_leaves_a_symlink_at_the_last_component_unresolved(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "leak.txt").write_text("x")
    (tmp_path / "site.conf").symlink_to(tmp_path / "sub" / "leak.txt")

    assert fs.inside(str(tmp_path), "site.conf") == os.path.join(
        os.path.realpath(tmp_path), "site.conf")


def test_inside_names_a_directory_link_leading_out_of_the_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "shop").symlink_to(outside)

    with pytest.raises(fs.LinkLeaves, match="through a symbolic link"):
        fs.inside(str(root), "shop/config.json")
    with pytest.raises(ValueError) as lexical:
        fs.inside(str(root), "../outside/config.json")
    assert not isinstance(lexical.value, fs.LinkLeaves)


def test_a_link_at_a_managed_path_is_backed_up_as_a_link_and_put_back(tmp_path):
    root, backup_dir = tmp_path / "root", tmp_path / "backup"
    root.mkdir()
    (root / "leak.txt").write_text("secret")
    (root / "site.conf").symlink_to("leak.txt")

    manifest = fs.backup(str(root), ["site.conf"], str(backup_dir))
    fs.write_atomic(str(root / "site.conf"), b"new")
    fs.restore(str(root), manifest, str(backup_dir))

    assert manifest == {"existed": [], "links": {"site.conf": "leak.txt"},
                        "paths": ["site.conf"]}
    assert tree(backup_dir) == {}  # the content it pointed to was not copied
    assert os.readlink(root / "site.conf") == "leak.txt"
    assert (root / "leak.txt").read_text() == "secret"
    assert temp_files(root) == []


def test_restore_removes_a_link_at_a_new_path_never_the_file_it_points_to(tmp_path):
    root, backup_dir = tmp_path / "root", tmp_path / "backup"
    root.mkdir()
    (root / "keep.txt").write_text("unmanaged")
    manifest = fs.backup(str(root), ["new.conf"], str(backup_dir))
    (root / "new.conf").symlink_to("keep.txt")

    fs.restore(str(root), manifest, str(backup_dir))

    assert not os.path.lexists(root / "new.conf")
    assert (root / "keep.txt").read_text() == "unmanaged"


def test_restore_of_an_older_agents_manifest_without_links(tmp_path):
    root, backup_dir = tmp_path / "root", tmp_path / "backup"
    root.mkdir()
    (root / "a.conf").write_text("old")
    manifest = fs.backup(str(root), ["a.conf"], str(backup_dir))
    del manifest["links"]
    (root / "a.conf").write_text("new")

    fs.restore(str(root), manifest, str(backup_dir))

    assert (root / "a.conf").read_text() == "old"


def test_an_apply_refuses_when_a_previous_snapshots_directory_now_leaves_the_target(
        host, tmp_path):
    from agent.apply import FAILED, SUCCEEDED
    from tests.agent.support import make_bundle

    state = host.load_state()
    applier = host.applier()
    assert applier.apply(make_bundle(1, {"old/a.conf": "a\n", "b.conf": "b\n"}),
                         state).status == SUCCEEDED
    outside = tmp_path / "outside"
    (outside / "old").mkdir(parents=True)
    (outside / "old" / "a.conf").write_text("not ours\n")
    (host.target / "old" / "a.conf").unlink()
    (host.target / "old").rmdir()
    (host.target / "old").symlink_to(outside / "old")

    outcome = applier.apply(make_bundle(2, {"b.conf": "b2\n"}), state)

    assert outcome.status == FAILED and "nothing was written" in outcome.message
    assert (outside / "old" / "a.conf").read_text() == "not ours\n"
    assert (host.target / "b.conf").read_text() == "b\n"


def test_a_file_replaced_by_a_link_lends_no_mode_to_the_next_apply(host, tmp_path):
    from agent.apply import SUCCEEDED
    from tests.agent.support import make_bundle

    secret_place = tmp_path / "private"
    secret_place.write_text("x\n")
    os.chmod(secret_place, 0o600)
    (host.target / "a.conf").symlink_to(secret_place)

    assert host.applier().apply(make_bundle(1, {"a.conf": "a\n"}),
                                host.load_state()).status == SUCCEEDED

    assert not os.path.islink(host.target / "a.conf")
    assert os.stat(host.target / "a.conf").st_mode & 0o777 == 0o644
    assert secret_place.read_text() == "x\n"
