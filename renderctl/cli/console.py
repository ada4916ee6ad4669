"""Output helpers: rich on a terminal, plain text on a pipe or with NO_COLOR, JSON on request."""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import math
import os
import select
import signal
import stat
import sys
import termios
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from renderctl.errors import displayable

if TYPE_CHECKING:
    from rich.console import Console

# rich is imported where a table or a live display is drawn, not here: a command that only
# prints lines, JSON or an error (submit, cancel, wait, any --json) started ~40 ms sooner
# without it, of ~0.3 s (most of a cron loop's `renderctl submit`).


def is_tty() -> bool:
    return sys.stdout.isatty()


def no_color() -> bool:
    """NO_COLOR set and not empty (https://no-color.org), as rich's own Console reads it:
    ``NO_COLOR=`` is how a script unsets it for one command."""
    return os.environ.get("NO_COLOR", "") != ""


def plain() -> bool:
    """Plain text: not a terminal, or NO_COLOR, or a dumb terminal."""
    return not is_tty() or no_color() or os.environ.get("TERM") == "dumb"


def console(*, stderr: bool = False, file: Any = None) -> Console:
    """``file``: where to write instead of stdout or stderr (`run`'s Stdout)."""
    from rich.console import Console

    if plain():
        return Console(stderr=stderr, file=file, no_color=True, color_system=None,
                       highlight=False, force_terminal=False, soft_wrap=True, emoji=False)
    # emoji=False: a job's error or an output named ":smile:" is shown as written.
    return Console(stderr=stderr, file=file, highlight=False, emoji=False,
                   _environ=_terminal_environ(sys.stderr if stderr else file or sys.stdout))


def _terminal_environ(stream: Any) -> Mapping[str, str]:
    """The environment rich sizes a terminal's output by: without COLUMNS where it says the
    terminal is wider than it is. rich takes COLUMNS over the real size, for good: a
    COLUMNS=300 exported in an 80-column terminal drew each dashboard frame over ~25 rows
    of which rich erased 15, and stale frames piled up (audit CE). A narrower COLUMNS, a
    choice, stays."""
    env = os.environ
    given = {k: env[k] for k in ("COLUMNS", "LINES") if env.get(k, "").isdigit()}
    if not given:
        return env
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return env
    real = {"COLUMNS": size.columns, "LINES": size.lines}
    # (LINES too: taller than the terminal, frames are cut at its height, not the real.)
    over = {k for k, v in given.items() if real[k] and int(v) > real[k]}
    return {k: v for k, v in env.items() if k not in over} if over else env


def table_width(columns: Any) -> int:
    """The width a rich ``Table`` (its default box and padding) needs to show every cell
    whole: ``columns`` holds each column's header and cells as printed. Wider than the
    terminal, rich would cut ids and numbers to "inv-…" or drop whole columns; the caller
    prints lines instead."""
    from rich.cells import cell_len

    return sum(max(map(cell_len, col)) + 3 for col in columns) + 1


class Room:
    """Whether ``file`` takes a write now without waiting: not a terminal whose output is
    stopped (Ctrl-S, until Ctrl-Q: a pty then has no room), nor a full pipe whose reader is
    slow or paused, nor our terminal while we run in the background under `stty tostop`.
    One poll(2) (and one ioctl on a terminal); always True for what has no descriptor.

    ``foreground_only``: nor our terminal while we run in the background at all: a live
    display redrawn there (`renderctl run ... &`) would fight the shell for the screen,
    and is held back until `fg`, as pv(1) holds its progress."""

    def __init__(self, file: Any, *, foreground_only: bool = False, poll: bool = True) -> None:
        """``poll``: False where writes cannot wait (see Stdout): only the terminal's
        job control is asked then."""
        self._poll: select.poll | None = None
        self._tty: int | None = None
        self._foreground_only = foreground_only
        try:
            fd = file.fileno()
            self._tty = fd if os.isatty(fd) else None
            if poll:
                self._poll = select.poll()
                self._poll.register(fd, select.POLLOUT)
        except (AttributeError, OSError, ValueError):
            self._poll = None

    def stops_writer(self) -> bool:
        """Whether a write now would have the kernel stop us (see tostop_stops_us)."""
        return self._tty is not None and in_background(self._tty) \
            and tostop_stops_us(self._tty)

    def __call__(self) -> bool:
        if self._tty is not None and in_background(self._tty) and (
                self._foreground_only or tostop_stops_us(self._tty)):
            return False
        # (A hang-up or a reader gone is reported too: the write then says so.)
        return self._poll is None or bool(self._poll.poll(0))


# What this command said, for a --json refusal that printed nothing on stdout (see
# json_refusal): its last error lines (bounded: a `run --follow` warns for days), and
# whether stdout was written at all.
_errors: collections.deque[str] = collections.deque(maxlen=20)
_stdout_used = False


class Stdout:
    """stdout for `run`, whose loop must never wait on its reader: a write that would wait
    keeps its bytes, in order, and a later ``drain`` writes them. The text API (``write``,
    ``flush``, ``isatty``) is what rich's Console writes a dashboard through.

    A poll that says there is room is not enough: Ctrl-S can stop a terminal between the
    poll and the write, and a terminal whose reader stalled (an SSH session on a network
    gone quiet) or a pipe can have room for less than a frame or a long line; a blocking
    write then waits, and the runner's loop with it (no timeout, cancel or memory check).
    So on a terminal or a pipe, writes go through a descriptor of our own, opened anew on
    the same file with O_NONBLOCK: setting O_NONBLOCK on fd 1 would set it on the file
    description the shell and everything else started from it share. A regular file (never
    waits on a reader), a socket or a stream without a descriptor is written as before,
    once ``Room`` says it has room."""

    CHUNK = 1 << 16

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.encoding: str = getattr(self.stream, "encoding", None) or "utf-8"
        self.pending = bytearray()
        self.gone = False  # the reader went away: what is written from here on is dropped
        self._fd: int | None = None
        self._own: int | None = None
        try:
            self.stream.flush()  # what it holds goes first: we write below its buffer
            self._fd = self.stream.fileno()
            self._own = _reopen_nonblocking(self._fd)
        except (AttributeError, OSError, ValueError):
            pass
        # (A write through our own descriptor cannot wait: no poll before it, one syscall
        # less per line of a --json run.)
        self.room = Room(self.stream, poll=self._own is None)

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def fileno(self) -> int:
        return int(self.stream.fileno())

    def write(self, text: str) -> int:
        global _stdout_used
        _stdout_used = True
        if not self.gone:
            self.pending += text.encode(self.encoding, "backslashreplace")
        return len(text)

    def flush(self) -> None:
        self.drain()

    def drain(self, *, wait: bool = False) -> bool:
        """Write what is kept, as far as the file takes it now (all of it: ``wait``);
        whether all of it went. An error other than a reader gone is raised."""
        try:
            while self.pending:
                # Even through our own descriptor: in the background under `stty tostop`
                # any write to the terminal has the kernel stop us (see tostop_stops_us).
                if not wait and not self.room():
                    return False
                try:
                    n = self._write(bytes(self.pending[:self.CHUNK]))
                except BlockingIOError:
                    if not wait:
                        return False
                    assert self._own is not None
                    # (a hang-up also ends the poll; the next write then says so)
                    select.select([], [self._own], [])
                    continue
                del self.pending[:n]
        except OSError as exc:
            if not reader_gone(exc):
                raise
            self.discard()
        return True

    def discard(self) -> None:
        """Drop what is kept and what comes, and point stdout at /dev/null (see
        silence_stdout): its reader is gone, or it cannot take more (a full disk)."""
        self.gone = True
        self.pending.clear()
        if self._own is not None:
            os.close(self._own)
            self._own = None
        if self._fd is not None:
            silence_stdout(self.stream)

    def _write(self, data: bytes) -> int:
        if self._own is not None:
            return os.write(self._own, data)
        if self._fd is not None:
            return os.write(self._fd, data)
        self.stream.write(data.decode(self.encoding, "replace"))
        self.stream.flush()
        return len(data)


def _reopen_nonblocking(fd: int) -> int | None:
    """A new, non-blocking descriptor of the terminal or pipe open on ``fd``; None for
    anything else, or where it cannot be opened (a terminal owned by another user)."""
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or (stat.S_ISCHR(mode) and os.isatty(fd))):
            return None
        # (Linux opens a pipe's other end anew through /proc, as it does a named pipe's.)
        return os.open(f"/proc/self/fd/{fd}",
                       os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None


def tostop_stops_us(fd: int) -> bool:
    """Whether, in the background (`renderctl run ... &`), a write to terminal ``fd`` would
    stop us: it has `stty tostop` set, so the kernel stops a background writer with SIGTTOU.
    Stopped so, the runner would leave its jobs unwatched (no timeout, cancel or sampled
    ceiling) until `fg`, and a run started so would never begin; its lines wait instead,
    and are written once it is in the foreground (or at the end, where that stop costs
    nothing: the queue is let go by then)."""
    if signal.getsignal(signal.SIGTTOU) == signal.SIG_IGN:
        return False  # the kernel lets a writer that ignores SIGTTOU write
    try:
        return bool(termios.tcgetattr(fd)[3] & termios.TOSTOP)
    except termios.error:
        return False


def in_background(fd: int) -> bool:
    """Whether terminal ``fd`` is our controlling terminal and we are not in its foreground
    process group (`cmd &`, or `bg` after Ctrl-Z)."""
    try:
        return os.tcgetpgrp(fd) != os.getpgrp()
    except OSError:  # not our controlling terminal (ENOTTY): nothing to be behind
        return False


def write_out(text: str) -> None:
    """Write to stdout now. A reader that went away (`renderctl run ... | head -3`) is not an
    error: the rest of the output goes to /dev/null and the command carries on (a run still
    runs every job, and exits with the code its jobs earn)."""
    global _stdout_used
    _stdout_used = True
    try:
        _write_whole(sys.stdout, text)
    except OSError as exc:
        if not reader_gone(exc):
            raise
        silence_stdout()


def _write_whole(stream: Any, text: str) -> None:
    """``text`` to ``stream`` whole, below its buffer where it has a descriptor. A stop
    signal that a command records (not obeys) while its write to a slow pipe waits made
    CPython's buffered writer return having passed on only what the pipe held: `cancel
    --all --json` stopped by SIGTERM wrote 64 KB of its 224 KB, invalid JSON, and said
    nothing (review DE). os.write() returns what went; the rest is written after it."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation: a test's)
        stream.write(text)
        stream.flush()
        return
    stream.flush()  # what it holds goes first
    data = memoryview(text.encode(stream.encoding or "utf-8", stream.errors or "strict"))
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            # A stdout its parent left non-blocking (a pipe shared with a Node or Go
            # parent): wait for room rather than end with "cannot write stdout" (exit 74)
            # having written part of the answer (review DG).
            select.select([], [fd], [])


# A pipe whose reader left (EPIPE), and a terminal that hung up (EIO, ENXIO: its window
# closed, the SSH session dropped; the runner drains on the SIGHUP that came with it).
_GONE = (errno.EPIPE, errno.EIO, errno.ENXIO)


def reader_gone(exc: OSError) -> bool:
    """Whether a failed write to stdout or stderr means nobody reads it any more."""
    return exc.errno in _GONE


def silence_stdout(stream: Any = None) -> None:
    """Point stdout (or ``stream``) at /dev/null: later writes, and the interpreter's final
    flush of what is still buffered, then succeed instead of failing again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, (stream or sys.stdout).fileno())
    os.close(devnull)


def print_json(data: Any) -> None:
    write_out(dumps(data, separators=(",", ":")) + "\n")


def dumps(data: Any, **kwargs: Any) -> str:
    """``json.dumps`` (ASCII, anything else as ``str``) that strict decoders accept: an
    undecodable byte of a file name is a lone surrogate in Python, which ``json.dumps``
    writes as ``\\udcff``; jq, Go and Rust reject that, so such text is shown escaped
    (``displayable``). NaN and infinities (a hand-edited record: Python's json reads
    ``NaN`` and ``1e400``) are null: ``json.dumps`` writes them as ``NaN``/``Infinity``,
    which no strict decoder reads. Checked on the output: the walk is paid only when it is
    needed."""
    try:
        text: str | None = json.dumps(data, default=_as_text, allow_nan=False, **kwargs)
    except ValueError:  # a number JSON has no words for
        text = None
    if text is None or "\\ud" in text:  # a surrogate escape, lone or in a pair: look closer
        text = json.dumps(_displayable_data(data), default=_as_text, allow_nan=False,
                          **kwargs)
    return text


def _as_text(obj: object) -> str:
    return displayable(str(obj))


def _displayable_data(data: Any) -> Any:
    if isinstance(data, str):
        return displayable(data)
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {displayable(k) if isinstance(k, str) else k: _displayable_data(v)
                for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_displayable_data(v) for v in data]
    return data


def err(message: str) -> None:
    """A user-facing error on stderr, no traceback."""
    if not message.startswith(("note: ", "warning: ")):
        # (What a refusal's JSON says: a note said on the way is not its reason; audit CE.)
        _errors.append(one_line(message))
    try:
        # Every control character escaped (one_line): an id, a file name or a record's
        # field holding ESC or BEL reached the terminal raw, and a newline in a manifest's
        # name split one problem's line in two.
        sys.stderr.write(f"renderctl: {one_line(message)}\n")
        sys.stderr.flush()
    except BlockingIOError:
        pass  # a non-blocking stderr, full for now: this message is lost, not the next
    except OSError:
        # Gone, full (cron's `>>log 2>&1` on a full disk) or read-only (a shim's fd 2):
        # nothing can be said there, and raising made every message a failure (exit 1; a
        # `run` left its jobs pending after a warning; audit CE). Said on stdout's side
        # where the command says anything (--json's objects and exit codes stand).
        with contextlib.suppress(OSError):
            silence_stdout(sys.stderr)


# A refusal's exit code, as --json names it (DESIGN.md's 2, 74 and 75).
REFUSALS = {2: "usage", 74: "io_error", 75: "unavailable"}


def json_refusal(code: object, command: str) -> None:
    """The JSON a ``--json`` command owes a script when it was refused (``code`` 2, 74 or
    75) before it printed anything on stdout: a bad option or queue path, an unreadable
    queue, a lock held. Without it `renderctl submit --out FILE --json | jq` read an empty
    document, and the refusals that do print one (a manifest's problems) have the same
    shape: ``{"error", "message"}``, with ``accepted: []`` (`submit`, `run`) or ``valid:
    false`` (`validate`) as their other refusals have. ``message``: what stderr said."""
    if _stdout_used or not isinstance(code, int) or code not in REFUSALS:
        return
    doc: dict[str, Any] = {"accepted": []} if command in ("submit", "run") else (
        {"valid": False} if command == "validate" else {})
    doc.update(error=REFUSALS[code], message="; ".join(_errors) or "see stderr")
    print_json(doc)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROL = {c: _ESCAPES.get(chr(c), f"\\x{c:02x}") for c in [*range(32), *range(127, 160)]}
_CONTROL.update({0x2028: "\\u2028", 0x2029: "\\u2029"})  # line breaks to str.splitlines
# Bidirectional overrides and isolates: a job's message holding U+202E would show the rest
# of its line (and what the runner printed after it) reversed on a terminal.
_CONTROL.update({c: f"\\u{c:04x}" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]})
# Invisible: "inv\u200b.pdf" and "inv.pdf" were shown alike (audit CF).
_CONTROL.update({c: f"\\u{c:04x}" for c in (0x200B, 0x2060, 0xFEFF)})
# Lone surrogates: a file name's bytes that are not UTF-8 (decoded with surrogateescape)
# would go out as those raw bytes, and the line would not be valid UTF-8 for a reader.
_CONTROL.update({c: f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c < 0xDD00 else f"\\u{c:04x}"
                 for c in range(0xD800, 0xE000)})


def one_line(text: object) -> str:
    """``text`` fit for one line of plain output: a newline, tab or other control character
    (a job's multi-line exception, an ANSI code in its stderr) becomes a visible escape
    (``\\n``, ``\\t``, ``\\x1b``), so that one event stays one line and one ``dead list`` row
    keeps its tab-separated columns. JSON output keeps the text as it was."""
    return str(text).strip().translate(_CONTROL)


def no_controls(text: str) -> str:
    """``text`` with control characters escaped as ``one_line`` does, its indentation kept."""
    return text.translate(_CONTROL)


def _number(value: object) -> float | str:
    """A value read from a record where a number belongs, as a float; or, if it is not
    one, how to show it (a hand-edited record: shown as it is rather than a traceback)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return one_line(repr(value))
    try:
        return float(value)
    except OverflowError:  # an int of 400 digits
        return one_line(repr(value))


def human_duration(seconds: object) -> str:
    if isinstance(seconds := _number(seconds), str):
        return seconds
    if seconds < 0.9995:  # 0.9996 s would round to "1000ms"
        return f"{seconds * 1000:.0f}ms"
    if seconds < 119.95:
        return f"{seconds:.1f}s"
    if seconds < 7197:
        return f"{seconds / 60:.1f}m"
    if seconds < 172_620:  # 47.95 h
        return f"{seconds / 3600:.1f}h"
    # Days; a retry `--backoff-max 1e300` away read as a 300-digit number of hours
    days = seconds / 86400
    return f"{days:.1f}d" if days < 99_999.95 else f"{days:.3g}d"


def human_bytes(n: object) -> str:
    if isinstance(value := _number(n), str):
        return value
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"
