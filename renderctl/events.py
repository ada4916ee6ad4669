"""The append-only event log, ``QUEUE/events.jsonl``: one JSON object per line.

The state folders are the truth; the log is the story (for `top`, `--json` and post-mortems).
It is appended with O_APPEND, one write(2) per batch of lines so lines from concurrent
writers never interleave, and it is not fsynced: a crash may lose its last lines, never a job.

Each line: ``{"ts": <epoch s>, "event": <name>, "job": <id>, ...}``. Events: ``accepted``,
``claimed``, ``revived``, ``corrupt`` and the state changes ``completed``, ``retry``,
``dead``, ``cancelled``, ``expired``, ``released`` (README: the fields of each). What only
the runner sees (``started``, ``runner_started``, ...) goes to its reporter, not here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from renderctl.fsutil import NOT_REGULAR, open_regular, with_name


def parse_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The events on ``data``'s whole lines, and where the last of them ends (a half-written
    last line waits for the next read). A damaged line is skipped."""
    end = data.rfind(b"\n") + 1
    out: list[dict[str, Any]] = []
    for line in data[:end].splitlines():
        try:
            # NULs first: what a power loss leaves of appends whose data never reached
            # the disk (ext4 without a journal), with the next event appended after them.
            ev = json.loads(line.lstrip(b"\0"))
        except (ValueError, RecursionError):  # (nesting a job appended: a traceback)
            continue
        if isinstance(ev, dict):  # every reader takes events as objects
            out.append(ev)
    return out, end


class LogTail:
    """The job ids named by lines appended to the log since the last look (`wait`: every
    waited-for job looked up each time the log grew made waiting for a batch quadratic).

    ``news()`` returns them, or None when the log was rotated or replaced (what the old
    one gained since is unknown: look at everything). Whole lines only, as ``read``; at
    most ``read_max`` bytes a call (a huge backlog: over calls; a longer line is skipped,
    not read whole: a job can append one)."""

    def __init__(self, path: Path, *, read_max: int = 4 << 20) -> None:
        self.path = path
        self.read_max = read_max
        self.inode: int | None = None
        self.offset = 0
        with contextlib.suppress(OSError):
            st = path.stat()
            if stat.S_ISREG(st.st_mode):
                self.inode, self.offset = st.st_ino, st.st_size

    def news(self) -> set[str] | None:
        try:
            # (O_NONBLOCK: a FIFO put there by hand would hold open() for good)
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return self._gone()
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return self._gone()  # a folder or FIFO there is no log (see README)
            if st.st_ino != self.inode or st.st_size < self.offset:
                self._restart(st.st_ino)
                return None
            if st.st_size == self.offset:
                return set()
            data = os.pread(fd, min(st.st_size - self.offset, self.read_max), self.offset)
        except OSError:
            return set()  # (unreadable now: the caller's own rechecks look at every job)
        finally:
            os.close(fd)
        events, end = parse_lines(data)
        if not end and len(data) == self.read_max:
            end = len(data)  # one line longer than a read: skipped, not stuck
        self.offset += end
        return {ev["job"] for ev in events if isinstance(ev.get("job"), str)}

    def _restart(self, inode: int | None) -> None:
        self.inode, self.offset = inode, 0

    def _gone(self) -> set[str] | None:
        if self.inode is None:
            return set()  # none at the last look either
        self._restart(None)
        return None


class EventLog:
    """Appends events; reads them back for `top` and tests."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        # False: a log that is not there is not made (root reading a user's queue: one made
        # would be root's, and the user's runner could not append to it; review FZ), and
        # what would have gone there is dropped.
        self._create = create
        self._fd = -1
        self._ident = (0, 0)  # (device, inode) of the file open as _fd
        self._torn = False  # whether the log ends in half a line (see _append)
        self._end = -1  # the log's size as our last append left it
        # A web tier's threads share one Queue and so one log: unlocked, a thread that found
        # the log rotated closed _fd while another was writing to it, and that number, by
        # then another thread's new file, got the other's close or its event line.
        self._mutex = threading.Lock()

    def append(self, events: Iterable[Mapping[str, Any]]) -> None:
        data = "".join(json.dumps(e, separators=(",", ":"), default=str) + "\n" for e in events)
        if not data:
            return
        with self._mutex:
            self._append(data)

    def _append(self, data: str) -> None:
        # Kept open (the runner appends after every claim batch and commit; an open per
        # call was a visible share of its per-job time). O_APPEND keeps lines from several
        # processes whole. One stat per append: a log removed, or renamed away by a
        # rotation, is reopened at its path (a --follow runner lives for days; kept on the
        # renamed file, its events never reached the log `metrics`, `top` and `wait` read).
        now = self._stat_if_still() if self._fd >= 0 else None
        if now is None:
            self._close()
            # Without blocking, and a regular file only: a job runs as the runner does, and a
            # FIFO it put at the log's path held the runner in this open() for good.
            try:
                fd, st = open_regular(self.path, os.O_WRONLY | os.O_APPEND
                                      | (os.O_CREAT if self._create else 0))
            except FileNotFoundError:
                if self._create:
                    raise
                return
            self._fd = fd
            self._ident = (st.st_dev, st.st_ino)
            self._torn = st.st_size > 0 and _last_byte(self.path, st.st_size) != b"\n"
        elif now.st_size != self._end:
            # Another writer appended since our last line (a submit, a web tier, a runner
            # killed mid-write on a full disk): it may have left half a line.
            self._torn = now.st_size > 0 and _last_byte(self.path, now.st_size) != b"\n"
        if self._torn:
            # The log ends in half a line (a power loss, a short write on a full disk): our
            # first line starts on a line of its own, or it was glued to that fragment and
            # lost with it to every reader (audit DF: an intact event written after the
            # crash was skipped; `jq` stopped there).
            data = "\n" + data
        raw = data.encode()
        try:
            written = os.write(self._fd, raw)
            # Where our line ended (O_APPEND: the end of the file as we wrote): a size that
            # differs next time means another writer came in between.
            self._end = os.lseek(self._fd, 0, os.SEEK_CUR)
        except OSError as exc:
            raise with_name(exc, self.path) from None
        self._torn = written < len(raw)  # (a short write leaves a half line: as above)

    def _stat_if_still(self) -> os.stat_result | None:
        """The log's stat, if the file at its path is still the one we have open."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st if (st.st_dev, st.st_ino) == self._ident else None

    def close(self) -> None:
        with self._mutex:
            self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()

    def read(self, *, offset: int = 0,
             max_bytes: int | None = None) -> tuple[list[dict[str, Any]], int]:
        """Complete lines from ``offset``; returns them and the offset to continue from.

        ``max_bytes`` bounds what one call reads (whole lines only; one line longer than it
        is read whole): a week's log is hundreds of MB, ~10x that as objects in memory."""
        try:
            with self._open_for_reading() as fh:
                fh.seek(offset)
                if max_bytes is None:
                    data = fh.read()
                else:
                    data = fh.read(max_bytes)
                    while b"\n" not in data and (more := fh.read(max_bytes)):
                        data += more
        except FileNotFoundError:
            return [], offset
        out, end = parse_lines(data)
        return out, offset + end

    def tail_offset(self, max_bytes: int) -> int:
        """Where the first whole line of the log's last ``max_bytes`` starts (0 if shorter):
        for readers that want recent events without reading a long log whole."""
        try:
            with self._open_for_reading() as fh:
                size = fh.seek(0, os.SEEK_END)
                if size <= max_bytes:
                    return 0
                fh.seek(size - max_bytes - 1)  # from the byte before: a line may start there
                chunk = fh.read(max_bytes + 1)
        except FileNotFoundError:
            return 0
        newline = chunk.find(b"\n")
        return size if newline < 0 else size - max_bytes + newline

    def _open_for_reading(self) -> BinaryIO:
        """The log, for reading; FileNotFoundError if it is anything but a regular file (a
        FIFO a job put there held `wait`, `top` and the metrics in open() for a writer)."""
        try:
            fd, _ = open_regular(self.path, os.O_RDONLY)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise FileNotFoundError(errno.ENOENT, NOT_REGULAR, str(self.path)) from None
            raise
        return os.fdopen(fd, "rb")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.read()[0])


def _last_byte(path: Path, size: int) -> bytes:
    """The last byte of the file at ``path`` (``size`` long); empty if it cannot be read."""
    try:
        # (O_NONBLOCK: a FIFO swapped in meanwhile would hold open() for good)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return b""
    try:
        return os.pread(fd, 1, size - 1)
    except OSError:
        return b""
    finally:
        os.close(fd)
