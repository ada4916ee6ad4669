"""What an OSError's message adds to its reason: whose file refused us (real files, real
owners), which limit a shortage is."""

from __future__ import annotations

import errno
import os
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
    assert f"the limit on processes, `ulimit -u`, is {value}" in said, said
