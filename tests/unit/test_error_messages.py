"""What an OSError's message adds to its reason: whose file refused us (real files, real
owners), which limit a shortage is."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from renderctl.errors import os_error_message

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to own files as another")


def refused(path: Path) -> str:
    return os_error_message(PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path)))


@as_root
def test_a_file_of_another_user_is_named_with_its_owner(tmp_path: Path) -> None:
    # Given a queue file root made in a queue of nobody's (a root `submit` there)
    record = tmp_path / "a.json"
    record.write_text("{}")
    os.chown(record, 65534, 65534)

    # Then its "Permission denied" says whose it is and what to do (audit FV: the path alone)
    said = refused(record)
    assert said.startswith(f"I/O error ({record}): Permission denied (")
    assert f"{record} belongs to nobody (uid 65534), and this runs as root (uid 0)" in said
    assert "chown" in said


@as_root
def test_a_missing_file_is_judged_by_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "pending"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    assert f"{folder} belongs to nobody (uid 65534)" in refused(folder / "new.json")


@contextlib.contextmanager
def as_nobody() -> Iterator[None]:
    """This process's effective user nobody for the block (the real and saved stay root)."""
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@as_root
def test_a_file_root_made_tells_the_user_to_have_root_remove_it() -> None:
    # Given root's record in a queue of nobody's, refused to nobody (in a folder nobody can
    # reach: pytest's are root's alone)
    folder = Path(tempfile.mkdtemp(prefix="rctl-whose-", dir="/tmp"))
    try:
        os.chmod(folder, 0o755)
        record = folder / "a.json"
        record.write_text("{}")
        os.chown(folder, 65534, 65534)
        with as_nobody():
            said = refused(record)
        # (In a folder of root's too, a queue root owns on purpose, root is whom to run
        # as: review FZ)
        os.chown(folder, 0, 0)
        with as_nobody():
            in_roots = refused(record)
    finally:
        shutil.rmtree(folder)
    assert f"{record} belongs to root (uid 0)" in in_roots, in_roots
    assert "run renderctl there as its owner" in in_roots, in_roots
    # Then it says a root command made it, not "run renderctl there as its owner" (root is
    # refused there: review FX)
    assert f"{record} belongs to root, and this runs as nobody (uid 65534)" in said, said
    assert "have root remove it" in said and "as its owner" not in said, said


@as_root
def test_a_symlink_is_judged_by_what_it_leads_to(tmp_path: Path) -> None:
    target = tmp_path / "target.json"
    target.write_text("{}")
    os.chown(target, 65534, 65534)
    link = tmp_path / "link.json"
    link.symlink_to(target)  # (root's link to nobody's file)
    said = refused(link)
    assert f"{link} belongs to nobody (uid 65534)" in said, said


@as_root
def test_our_own_file_in_a_folder_of_another_is_judged_by_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "done"
    folder.mkdir()
    mine = folder / "a.json"
    mine.write_text("{}")
    os.chown(folder, 65534, 65534)
    assert f"{folder} belongs to nobody (uid 65534)" in refused(mine)


def test_our_own_file_adds_nothing(tmp_path: Path) -> None:
    mine = tmp_path / "mine.json"
    mine.write_text("{}")
    assert refused(mine) == f"I/O error ({mine}): Permission denied"


def test_a_fork_refused_for_the_process_limit_names_the_limit() -> None:
    import resource

    # Given the error a fork meets at `ulimit -u` (audit FV: "I/O error: Resource
    # temporarily unavailable", nothing more)
    said = os_error_message(BlockingIOError(errno.EAGAIN, os.strerror(errno.EAGAIN)))

    # Then it names the limit and its value here
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    value = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    assert f"`ulimit -u` ({value}; not applied to root)" in said, said


def test_text_lines_are_what_a_terminal_shows() -> None:
    from renderctl.errors import text_lines

    # A lone CR goes back to the line's start: what follows is written over it, a shorter
    # redraw leaving the rest (review FX: the last part alone was kept); CRLF and CR CR LF
    # end a line as LF does; a form feed does not end one (audit BJ)
    assert text_lines("abcdef\rXY\n") == ["XYcdef"]
    assert text_lines("Error: bad\r   \n") == ["   or: bad"]
    assert text_lines("a\r\nb\r\r\nc\n") == ["a", "b", "c"]
    assert text_lines("p 1%\rp 2%\rp 3%") == ["p 3%"]
    assert text_lines("page 1\fpage 2\n") == ["page 1\fpage 2"]
    # (an erase-line escape clears the rest: review FZ)
    assert text_lines("Downloading big.tar 45%\r\x1b[Kerror: reset\n") == ["error: reset"]
    # (ESC[2K clears the whole line, the cursor staying: review GA)
    assert text_lines("progress 100% of a long line\x1b[2K\rerror: bad\n") == ["error: bad"]
