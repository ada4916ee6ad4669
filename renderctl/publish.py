"""Publishing an output: at most once, atomically, never over a file we did not make.

The worker writes to a temporary name beside the final path (same folder, so same file
system). Publishing is ``link(tmp, final)`` for a file (fails if ``final`` exists) or
``renameat2(RENAME_NOREPLACE)`` for a folder. The temporary link is removed only after the
job's done record is durable, so a crash between the link and the record leaves the proof
that the published file is this job's own: ``tmp`` and ``final`` are the same inode (for a
folder, its marker names the job). Anything else at ``final`` is someone else's file: the
job dead-letters with ``output_exists`` and the file is left untouched.
"""

from __future__ import annotations

import hashlib
import os
from enum import StrEnum
from pathlib import Path

from renderctl.fsutil import rename_noreplace, unlink_quiet
from renderctl.manifest import RESERVED_PREFIX

DIR_MARKER = ".rctl-job"


class Published(StrEnum):
    """What a publish attempt found."""

    PUBLISHED = "published"  # we made the output visible now
    ALREADY_OURS = "already_ours"  # an earlier life of this attempt already did
    EXISTS = "exists"  # someone else's file is there: never touched


class OutputEscapes(Exception):
    """The output's folder resolves outside the output root (a symlink on the way)."""


def tmp_output_path(final: Path, job_id: str, attempt: int) -> Path:
    """The temporary name beside ``final`` for one attempt (deterministic, for recovery)."""
    tag = hashlib.sha256(job_id.encode()).hexdigest()[:16]
    return final.parent / f"{RESERVED_PREFIX}{tag}-{attempt}.tmp"


def tmp_outputs(final: Path, job_id: str) -> list[Path]:
    """Every temporary of this job beside ``final`` (any attempt)."""
    tag = hashlib.sha256(job_id.encode()).hexdigest()[:16]
    try:
        names = os.listdir(final.parent)
    except FileNotFoundError:
        return []
    prefix = f"{RESERVED_PREFIX}{tag}-"
    return [final.parent / n for n in names if n.startswith(prefix) and n.endswith(".tmp")]


def prepare_output_dir(out_root: Path, final: Path) -> None:
    """Create the output's folder; refuse if it resolves outside the output root."""
    root = out_root.resolve()
    os.makedirs(final.parent, mode=0o755, exist_ok=True)
    check_confined(root, final)


def check_confined(root: Path, final: Path) -> None:
    real = final.parent.resolve()
    if real != root and root not in real.parents:
        raise OutputEscapes(f"{final.parent} resolves to {real}, outside the output root {root}")
    if final.is_symlink():
        raise OutputEscapes(f"{final} is a symlink")


def publish(tmp: Path, final: Path, *, is_dir: bool, job_id: str) -> Published:
    """Make ``tmp`` visible as ``final`` unless something is already there."""
    try:
        if is_dir:
            rename_noreplace(tmp, final)
        else:
            os.link(tmp, final, follow_symlinks=False)
        return Published.PUBLISHED
    except FileExistsError:
        return Published.ALREADY_OURS if is_ours(tmp, final, is_dir=is_dir,
                                                 job_id=job_id) else Published.EXISTS


def is_ours(tmp: Path, final: Path, *, is_dir: bool, job_id: str) -> bool:
    """Whether ``final`` is this job's own earlier publication (see module docstring)."""
    try:
        if is_dir:
            marker = (final / DIR_MARKER).read_text().splitlines()
            return bool(marker) and marker[0] == job_id
        a, b = os.lstat(tmp), os.lstat(final)
        return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
    except (FileNotFoundError, NotADirectoryError):
        return False


def discard(tmp: Path) -> None:
    """Remove an attempt's temporary (file or folder)."""
    if tmp.is_dir() and not tmp.is_symlink():
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        unlink_quiet(tmp)
