"""Opening a job's input file, refusing whatever is no longer a regular file.

Validation checked that each input was a regular file this user can read, but the job runs
later. Opened plainly, a FIFO put at the path since would block the renderer until its
timeout (and again on every retry), and a device such as ``/dev/zero`` would be read until
the memory ceiling killed the job. So the file is opened without blocking and judged by what
the open descriptor is, not by the path looked at before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from renderctl.errors import InvalidInput

# The memory ceiling of the job a worker runs (bytes; 0: none known): the worker sets it
# before each built-in renderer. A PDF is read whole into memory, so an input larger than
# the ceiling cannot be read within it: said as such at once, where each attempt read until
# the ceiling killed it (`memory`, retried, naming no file: audit AU, a 3 GiB input).
memory_ceiling_bytes = 0


def refuse_beyond_ceiling(label: str, size: int) -> None:
    """InvalidInput if a PDF of ``size`` bytes, read whole, cannot fit the ceiling."""
    ceiling = memory_ceiling_bytes
    if ceiling and size > ceiling:
        mb = 1 << 20
        raise InvalidInput(f"{label}: {size / mb:.0f} MB; a PDF is read whole, and this job's "
                           f"memory ceiling is {ceiling / mb:.0f} MB: give the job a larger "
                           "memory_mb")


class InputChanged(Exception):
    """The input was written to while the job read and judged it: what was read may be
    neither the old file nor the new one. Not InvalidInput: the attempt fails, and the
    retry reads the file as it is then."""


@contextmanager
def open_input(path: Path, label: str) -> Iterator[tuple[BinaryIO, int]]:
    """The input at ``path`` opened for reading, and its size; InvalidInput starting with
    ``label`` if it cannot be opened or is not a regular file (read errors inside the block
    are turned into InvalidInput too). InputChanged instead if the file changed while the
    block read it, whether the block ended well or judged it invalid: a PDF rewritten in
    place as jobs read it was dead-lettered as "truncated", never tried again (audit DU)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput(f"{label}: cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(f"{label}: not a regular file")
        with open(fd, "rb", closefd=False) as fh:
            try:
                yield fh, st.st_size
            except InvalidInput as exc:
                _unchanged(fd, st, label, exc)
                raise
        _unchanged(fd, st, label, None)
    except OSError as exc:
        raise InvalidInput(f"{label}: cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _unchanged(fd: int, before: os.stat_result, label: str,
               verdict: BaseException | None) -> None:
    """InputChanged if the file open as ``fd`` is not as it was (``before``): its size or
    its modification time (not its ctime, which a chmod, a new hard link or an atime set
    back also change, the bytes untouched: review DX)."""
    now = os.fstat(fd)
    if (now.st_size, now.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise InputChanged(f"{label}: changed while it was read ({before.st_size} bytes, then "
                           f"{now.st_size}; modified meanwhile)") from verdict


def read_input(path: Path, label: str, *, max_bytes: int) -> bytes:
    """The whole input at ``path``, refused (InvalidInput) beyond ``max_bytes``."""
    with open_input(path, label) as (fh, size):
        if size > max_bytes:
            raise InvalidInput(f"{label}: {size} bytes is more than {max_bytes}")
        # One byte past the limit tells a file that grew since fstat from one that fits.
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InvalidInput(f"{label}: more than {max_bytes} bytes")
    return data
