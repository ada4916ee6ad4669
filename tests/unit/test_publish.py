"""Publishing on a real file system: at most once, never over someone else's file."""

from __future__ import annotations

from pathlib import Path

from renderctl.publish import Published, is_ours, publish, tag_output, tmp_output_path


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
