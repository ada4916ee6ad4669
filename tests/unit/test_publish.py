"""Publishing on a real file system: at most once, never over someone else's file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from renderctl.publish import (
    OutputEscapes,
    Published,
    check_confined,
    found_tmp_output_path,
    is_ours,
    make_folders,
    others_can_write,
    output_folder,
    publish,
    tag_output,
    tmp_output_path,
    tmp_outputs,
)


def staged(final: Path, job: str, attempt: int, data: bytes) -> Path:
    tmp = tmp_output_path(final, job, f"t:{job}:{attempt}")
    tmp.write_bytes(data)
    return tmp


def test_a_tagged_output_is_renamed_into_place_and_proves_itself_ours(tmp_path: Path) -> None:
    final = tmp_path / "a.pdf"
    tmp = staged(final, "a", 1, b"ours")
    assert tag_output(tmp, "t:a:1")
    assert publish(tmp, final, is_dir=False, token="t:a:1") is Published.PUBLISHED
    assert not tmp.exists() and final.read_bytes() == b"ours"
    # A crash after the rename, before the record: the tag still says whose it is
    assert is_ours(tmp, final, is_dir=False, job_id="a", token="t:a:1")
    assert not is_ours(tmp, final, is_dir=False, job_id="a", token="t:a:2")


def test_without_tags_the_temporary_link_is_the_proof(tmp_path: Path) -> None:
    final = tmp_path / "b.pdf"
    tmp = staged(final, "b", 1, b"ours")
    assert publish(tmp, final, is_dir=False) is Published.PUBLISHED
    assert tmp.exists() and final.read_bytes() == b"ours"  # same inode, two names
    # Publishing never judges ownership (recovery does, with is_ours): a second publish
    # finds something there
    assert publish(tmp, final, is_dir=False) is Published.EXISTS
    assert is_ours(tmp, final, is_dir=False, job_id="b")


def test_someone_elses_file_is_never_replaced(tmp_path: Path) -> None:
    final = tmp_path / "c.pdf"
    final.write_bytes(b"theirs")
    for token in ("t:c:1", None):
        tmp = staged(final, "c", 1, b"ours")
        if token:
            tag_output(tmp, token)
        assert publish(tmp, final, is_dir=False, token=token) is Published.EXISTS
        assert final.read_bytes() == b"theirs"
        tmp.unlink()


@pytest.mark.parametrize("token", [None, "t:a:1"])
def test_an_output_folder_opened_for_publishing_stays_the_one_checked_if_swapped_after(
        tmp_path: Path, token: str | None) -> None:
    # Given a folder in the output root, opened for publishing, then swapped for a symlink
    # out of the root before the publish itself
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (root / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    final = root / "sub" / "a.pdf"
    tmp = staged(final, "a", 1, b"ours")
    if token:
        assert tag_output(tmp, token)
    fd = output_folder(str(root), final)
    try:
        (root / "sub").rename(root / "sub.old")
        (root / "sub").symlink_to(elsewhere)

        # When it publishes through that folder
        assert publish(tmp, final, is_dir=False, token=token, dir_fd=fd) \
            is Published.PUBLISHED
    finally:
        os.close(fd)

    # Then the output is in the folder that was checked, nothing went out of the root
    assert (root / "sub.old" / "a.pdf").read_bytes() == b"ours"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("link", ["absolute", "relative-up"])
def test_an_output_folder_reached_through_a_symlink_out_of_the_root_escapes(
        tmp_path: Path, link: str) -> None:
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "sub").symlink_to(elsewhere if link == "absolute" else Path("..") / "elsewhere")
    with pytest.raises(OutputEscapes, match="outside the output root"):
        output_folder(str(root), root / "sub" / "a.pdf")


@pytest.mark.parametrize("link", ["relative", "absolute", "up-and-back"])
def test_a_symlink_that_stays_inside_the_root_is_followed(tmp_path: Path, link: str) -> None:
    root = tmp_path / "out"
    (root / "real").mkdir(parents=True)
    (root / "deep").mkdir()
    target = {"relative": Path("..") / "real", "absolute": root / "real",
              "up-and-back": Path("..") / ".." / "out" / "real"}[link]
    (root / "deep" / "alias").symlink_to(target)
    fd = output_folder(str(root), root / "deep" / "alias" / "a.pdf")
    try:
        assert os.path.samestat(os.stat(fd), os.stat(root / "real"))
    finally:
        os.close(fd)


def test_a_folder_removed_before_the_publish_is_gone_not_an_escape(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    (root / "sub").rmdir()
    with pytest.raises(FileNotFoundError):
        output_folder(str(root), root / "sub" / "a.pdf")


def test_a_symlink_loop_on_the_way_is_an_escape_not_a_crash(tmp_path: Path) -> None:
    # (Path.resolve raises RuntimeError on a loop in Python 3.11: the runner's claim-time
    # check catches OutputEscapes and OSError only, and would have stopped the run)
    root = tmp_path / "out"
    root.mkdir()
    (root / "loop").symlink_to(root / "loop")
    with pytest.raises(OutputEscapes, match="loop"):
        check_confined(root, root / "loop" / "x.pdf")


@pytest.mark.parametrize(("where", "mode", "owner", "shared"), [
    (None, None, None, False),          # 0755 ours all the way
    ("root", 0o777, None, True),        # the root itself writable by anyone
    ("mid", 0o1777, None, True),        # sticky: others still create names (a symlink)
    ("leaf", 0o770, None, True),        # a group that is not our private one (gid 12345)
    ("leaf", 0o755, 65534, True),       # owned by someone else (nobody)
    ("leaf", 0o775, "private", False),  # our own private group (umask 002)
])
def test_others_can_write_somewhere_on_the_way_to_an_output(
        tmp_path: Path, where: str | None, mode: int | None, owner: int | str | None,
        shared: bool) -> None:
    root, leaf = tmp_path / "out", tmp_path / "out" / "mid" / "leaf"
    leaf.mkdir(parents=True)
    for p in (tmp_path, root, root / "mid", leaf):
        p.chmod(0o755)
    if where is not None:
        target = {"root": root, "mid": root / "mid", "leaf": leaf}[where]
        if owner == "private":
            os.chown(target, -1, os.getegid())
        elif mode == 0o770:
            os.chown(target, -1, 12345)
        elif isinstance(owner, int):
            os.chown(target, owner, -1)
        assert mode is not None
        target.chmod(mode)
    assert others_can_write(os.path.realpath(root), leaf) is shared
    # and a folder reached through a symlink is judged where it really is
    (root / "mid" / "via").symlink_to(leaf)
    assert others_can_write(os.path.realpath(root), root / "mid" / "via") is shared


def test_folders_are_made_inside_the_root_through_symlinks_that_stay_inside(
        tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real")
    make_folders(str(root), root / "alias" / "a" / "b")
    assert (root / "real" / "a" / "b").is_dir()
    make_folders(str(root), root / "alias" / "a" / "b")  # and again: nothing to do


def test_no_folder_is_made_beyond_a_symlink_out_of_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "out", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "drop").symlink_to(outside)
    with pytest.raises(OutputEscapes, match="outside the output root"):
        make_folders(str(root), root / "drop" / "new" / "deeper")
    assert list(outside.iterdir()) == []


def _named_before_output_names_were_tagged(final: Path, job: str, token: str) -> Path:
    """Where builds before 2026-12-05 put an attempt's temporary: the job id alone tagged it."""
    tag = hashlib.sha256(job.encode()).hexdigest()[:16]
    return final.parent / f".rctl-{tag}-{hashlib.sha256(token.encode()).hexdigest()[:16]}.tmp"


def test_a_jobs_temporaries_are_told_from_those_of_a_job_of_its_id_for_another_output(
        tmp_path: Path) -> None:
    # Given, in one folder, temporaries of job "daily" for a.pdf (one named by an earlier
    # build) and of another queue's job "daily" for b.pdf
    a, b = tmp_path / "a.pdf", tmp_path / "b.pdf"
    ours = staged(a, "daily", 1, b"a")
    old = _named_before_output_names_were_tagged(a, "daily", "t:daily:0")
    old.write_bytes(b"a, an attempt in flight across an upgrade")
    theirs = staged(b, "daily", 1, b"b")

    # When the temporaries of a.pdf's job are listed (for its sweep)
    # Then its own are, and not the other job's (its sweep removed the other queue's in
    # flight: audit FQ), nor one an earlier build named by the job id alone (it may be
    # another queue's under that build: review FR)
    assert tmp_outputs(a, "daily") == [ours]
    assert tmp_outputs(b, "daily") == [theirs]
    # and recovery finds the earlier build's temporary of an attempt, where only it exists
    assert found_tmp_output_path(a, "daily", "t:daily:0") == old
    assert found_tmp_output_path(a, "daily", "t:daily:1") == ours
    assert found_tmp_output_path(a, "daily", "t:daily:2") == tmp_output_path(
        a, "daily", "t:daily:2")
