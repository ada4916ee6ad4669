"""The durable primitives on a real file system."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from renderctl.fsutil import (
    atomic_write,
    fill_file,
    rename_noreplace,
    replace_beside,
    syncfs,
    unlink_quiet,
    write_file,
)


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    target = tmp_path / "state.json"
    atomic_write(target, b"one", tmp_dir=tmp)
    atomic_write(target, b"two", tmp_dir=tmp)
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp) == []


def test_fill_file_replaces_content_in_the_same_inode(tmp_path: Path) -> None:
    p = tmp_path / "slot"
    write_file(p, b"x" * 3000, fsync=False)
    ino = p.stat().st_ino
    fill_file(p, b"short")  # shorter: the old tail must not survive
    assert p.read_bytes() == b"short"
    fill_file(p, b"y" * 5000)  # longer than the block it had
    assert p.read_bytes() == b"y" * 5000
    assert p.stat().st_ino == ino
    with pytest.raises(FileNotFoundError):
        fill_file(tmp_path / "missing", b"z")  # never creates


def test_write_file_refuses_to_overwrite(tmp_path: Path) -> None:
    p = tmp_path / "x"
    write_file(p, b"a", fsync=True)
    with pytest.raises(FileExistsError):
        write_file(p, b"b", fsync=False)
    assert p.read_bytes() == b"a"


WRITE_PAST_LIMIT = """
import resource, signal, sys
from renderctl.fsutil import write_file
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    write_file(sys.argv[1], bytes(100_000), fsync=True)
except OSError as exc:
    print(exc.filename, exc.errno)
"""


def test_a_write_file_that_fails_names_the_file_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    # A real write error from the kernel (the file-size limit), in a child process.
    target = tmp_path / "record.json"
    r = subprocess.run([sys.executable, "-c", WRITE_PAST_LIMIT, str(target)],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == [str(target), str(errno.EFBIG)], r.stderr
    assert not target.exists()


def test_rename_noreplace_never_overwrites_files_or_folders(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"new")
    (tmp_path / "dst").write_bytes(b"old")
    with pytest.raises(FileExistsError):
        rename_noreplace(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "dst").read_bytes() == b"old"
    (tmp_path / "dir-src").mkdir()
    (tmp_path / "dir-src" / "part").write_bytes(b"p")
    rename_noreplace(tmp_path / "dir-src", tmp_path / "dir-dst")
    assert (tmp_path / "dir-dst" / "part").read_bytes() == b"p"
    with pytest.raises(FileNotFoundError):
        rename_noreplace(tmp_path / "dir-src", tmp_path / "elsewhere")


def test_syncfs_and_unlink_quiet(tmp_path: Path) -> None:
    syncfs(tmp_path)
    assert unlink_quiet(tmp_path / "missing") is False
    (tmp_path / "f").write_bytes(b"")
    assert unlink_quiet(tmp_path / "f") is True


def test_a_failed_fsync_is_fatal_and_names_what_failed(tmp_path: Path) -> None:
    # A real failing fsync: on a descriptor that is not open (EBADF). The error is the
    # queue's I/O error (exit 74), never retried.
    from renderctl.errors import ExitCode, QueueIOError
    from renderctl.fsutil import fsync_fd

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    os.close(fd)
    with pytest.raises(QueueIOError, match="fsync failed for the record") as info:
        fsync_fd(fd, what="the record")
    assert info.value.exit_code == ExitCode.IO_ERROR


def test_a_tmp_cleaner_running_mid_write_keeps_a_live_writers_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl import fsutil
    from renderctl.store import Queue

    # Given a queue, and an atomic_write into its control/ (as the runner writes its holder
    # file) interrupted right after its temporary is written
    q = Queue(tmp_path / "q")
    cleaned: list[int] = []
    real_write = fsutil.write_file

    def write_then_let_a_cli_open(path: str | os.PathLike[str], data: bytes, **kw: bool) -> None:
        real_write(path, data, **kw)
        # When another process opens the queue then (any CLI command cleans tmp/)
        cleaned.append(Queue(tmp_path / "q").clean_tmp())

    monkeypatch.setattr(fsutil, "write_file", write_then_let_a_cli_open)
    atomic_write(q.dir("control") / "holder.x.json", b"{}", tmp_dir=q.dir("tmp"))

    # Then the cleaner saw a live writer's file and left it; the write completed
    assert cleaned == [0]
    assert (q.dir("control") / "holder.x.json").read_bytes() == b"{}"
    assert os.listdir(q.dir("tmp")) == []


def test_a_report_replaced_under_a_strict_umask_keeps_its_mode(tmp_path: Path) -> None:
    # Given a metrics textfile made readable to a collector running as another user
    report = tmp_path / "renderctl.prom"
    report.write_text("old\n")
    report.chmod(0o644)

    # When it is replaced by a process under cron's umask 077
    old = os.umask(0o077)
    try:
        replace_beside(report, b"new\n")
    finally:
        os.umask(old)

    # Then it is still 0644 (it became 0600: node_exporter lost it silently; audit EA),
    # and a new report gets the umask's mode as before
    assert report.read_bytes() == b"new\n" and report.stat().st_mode & 0o777 == 0o644
    fresh = tmp_path / "new.prom"
    old = os.umask(0o077)
    try:
        replace_beside(fresh, b"x")
    finally:
        os.umask(old)
    assert fresh.stat().st_mode & 0o777 == 0o600
    # (its read and write bits only: no setuid or execute bit is carried; review EB)
    report.chmod(0o4755)
    replace_beside(report, b"again\n")
    assert report.stat().st_mode & 0o7777 == 0o644


def test_a_report_replaced_keeps_its_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the report a group of another")
    # Given a report a collector reads through its group (root:<group> 0640)
    report = tmp_path / "renderctl.prom"
    report.write_text("old\n")
    os.chown(report, -1, 65534)
    report.chmod(0o640)

    # When it is replaced, then its group and mode stay (review EE: the group was the
    # writer's, and the collector lost the report)
    replace_beside(report, b"new\n")
    st = report.stat()
    assert (st.st_gid, st.st_mode & 0o777) == (65534, 0o640)


def test_makedirs_makes_any_depth_and_fails_as_os_makedirs_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from renderctl.fsutil import makedirs, remove_tree

    # Any depth (os.makedirs' recursion raised RecursionError at ~1,000 levels: audit ES)
    deep = tmp_path.joinpath(*["d"] * 1500)
    makedirs(deep, 0o700)
    assert deep.is_dir() and deep.stat().st_mode & 0o777 == 0o700
    makedirs(deep)  # (there already: fine)
    remove_tree(tmp_path / "d")  # (and so does remove_tree; pytest's own rmtree recurses)
    assert not (tmp_path / "d").exists()
    # A file at the end, a file on the way, a dangling link on the way: named as makedirs
    # names them
    (tmp_path / "f").write_text("")
    for path, code in ((tmp_path / "f", errno.EEXIST), (tmp_path / "f" / "g", errno.ENOTDIR)):
        with pytest.raises(OSError) as exc:
            makedirs(path)
        assert exc.value.errno == code and exc.value.filename == str(path)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError) as missing:
        makedirs(tmp_path / "link" / "out")
    assert missing.value.filename == str(tmp_path / "link" / "out")
    monkeypatch.chdir(tmp_path)
    makedirs("rel/a/")
    assert (tmp_path / "rel" / "a").is_dir()
