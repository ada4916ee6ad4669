"""One root exception, grouped by whose fault it is, and the exit codes of DESIGN.md.

- ``UserError``: the person at the keyboard gave us something wrong (manifest, option, id).
- ``QueueError``: the queue or output folder could not be used (I/O, busy, saturated).
- ``JobError``: raised *inside* a job by a renderer or a user callable; it decides the
  attempt's outcome (``InvalidInput`` and ``InvalidOutput`` dead-letter at once).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Process exit codes; scripts and cron rely on these (DESIGN.md, Exit codes)."""

    OK = 0
    JOBS_FAILED = 1
    USAGE = 2
    IO_ERROR = 74
    TEMPFAIL = 75
    SIGHUP = 129  # not in DESIGN.md's table: 128 + the signal, as for the two below
    SIGINT = 130
    SIGQUIT = 131  # not in DESIGN.md's table either
    SIGTERM = 143


class RenderctlError(Exception):
    """Root of every error renderctl raises on purpose."""

    exit_code: ExitCode = ExitCode.USAGE


def signal_exit_code(signum: int) -> ExitCode:
    """What a run stopped by ``signum`` (SIGTERM, SIGINT, SIGHUP or SIGQUIT) exits with."""
    import signal

    return {signal.SIGINT: ExitCode.SIGINT, signal.SIGHUP: ExitCode.SIGHUP,
            signal.SIGQUIT: ExitCode.SIGQUIT}.get(signal.Signals(signum), ExitCode.SIGTERM)


class Interrupted(RenderctlError):
    """A stop signal arrived before anything was enqueued: nothing was."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = signal_exit_code(signum)


# -- the user's fault ----------------------------------------------------------------------


class UserError(RenderctlError):
    """The command, an option or an id given by the user is wrong; nothing was changed."""

    exit_code = ExitCode.USAGE


@dataclass(frozen=True)
class Problem:
    """One validation finding: where (file, job, field) and what."""

    file: str
    job: str | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.job is not None:
            where += f": job {self.job}"
        if self.field:
            where += f": {self.field}"
        return f"{where}: {self.message}"


class ManifestError(UserError):
    """One or more manifests are invalid; every problem is listed, nothing was enqueued."""

    def __init__(self, problems: list[Problem], *, valid: Sequence[Any] = ()) -> None:
        self.problems = list(problems)
        # The jobs that validated (JobSpecs), for the checks that need a queue: a command
        # refused already lists their problems with the rest, in one round.
        self.valid = list(valid)
        super().__init__("\n".join(str(p) for p in self.problems))


class JobNotFound(UserError):
    """No job with this id exists in the queue. ``quarantined``: it did, and its record was
    found damaged and moved to corrupt/ (the message says where)."""

    def __init__(self, message: str, *, quarantined: bool = False) -> None:
        super().__init__(message)
        self.quarantined = quarantined


# -- the queue's or the machine's fault ----------------------------------------------------


class QueueError(RenderctlError):
    """The queue could not be used as asked."""

    exit_code = ExitCode.IO_ERROR


class QueueIOError(QueueError):
    """An I/O operation on the queue or output folder failed (a failed fsync is never retried)."""

    exit_code = ExitCode.IO_ERROR


class SubmitIncomplete(QueueIOError):
    """A submit's jobs were accepted (their batch's journal entry is committed, or the one
    job's record is in pending/), but the queue failed before every one of them was in
    pending/ for a runner to see.

    They are not refused: the queue's journal keeps them, and the next submit through the
    same ``Queue`` object (or the next open of the queue by any process, or a running
    runner's next poll) places them.
    Submitting the same jobs again is safe: it reports them as already accepted.
    ``accepted``: this call's job ids that are accepted; ``unplaced``: those of them not
    yet in pending/."""

    def __init__(self, message: str, *, accepted: tuple[str, ...],
                 unplaced: tuple[str, ...]) -> None:
        self.accepted = accepted
        self.unplaced = unplaced
        super().__init__(message)


class QueueBusy(QueueError):
    """Another runner holds this queue (cron overlap); try again later."""

    exit_code = ExitCode.TEMPFAIL

    def __init__(self, message: str, *, holder_pid: int | None = None) -> None:
        self.holder_pid = holder_pid
        super().__init__(message)


class Saturated(QueueError):
    """Admission refused: the submit would take the pending count above ``max_pending``."""

    exit_code = ExitCode.TEMPFAIL

    def __init__(self, *, requested: int, pending: int, max_pending: int) -> None:
        self.requested = requested
        self.pending = pending
        self.max_pending = max_pending
        self.would_fit = max(0, max_pending - pending)
        # Whether waiting can help: a submit larger than the limit never fits, however far
        # the queue drains, and "try again later" had a script retry it forever (audit EA).
        if max_pending == 0:
            hint = "; max_pending=0 admits no job at all (admission is closed)"
        elif requested > max_pending:
            hint = (f"; {requested} can never fit, however far the queue drains: submit at "
                    f"most {max_pending} at a time, or raise max_pending")
        else:
            hint = ""
        super().__init__(
            f"saturated: {requested} new job(s) would take pending from {pending} to "
            f"{pending + requested}, above max_pending={max_pending}; {self.would_fit} would "
            f"fit; nothing was enqueued{hint}"
        )


# -- raised inside a job ------------------------------------------------------------------


class JobError(Exception):
    """Raised inside a job to choose its attempt's outcome; the message is recorded."""


class InvalidInput(JobError):
    """The job's input cannot be used (unreadable, encrypted, wrong schema): dead-letter now."""


class InvalidOutput(JobError):
    """The job produced an output that is not acceptable (e.g. not a readable PDF)."""


def os_error_message(exc: OSError) -> str:
    """One line naming what failed: ``I/O error (<file>[ -> <file2>]): <reason>``."""
    where = f" ({exc.filename})" if exc.filename else ""
    if exc.filename2:
        where = f" ({exc.filename} -> {exc.filename2})"
    return f"I/O error{where}: {exc.strerror or exc}{_shortage(exc.errno)}{_whose(exc)}"


def _whose(exc: OSError) -> str:
    """Whose the file refused is (or, ours, its folder's), where that is not the user we
    run as: root's files in a user's queue were "Permission denied" with nothing to say
    why (audit FV)."""
    if exc.errno not in (errno.EACCES, errno.EPERM) \
            or not isinstance(exc.filename, str | bytes) or not exc.filename:
        return ""
    import pwd

    def named(n: int) -> str:
        try:
            return f"{pwd.getpwuid(n).pw_name} (uid {n})"
        except KeyError:
            return f"uid {n}"

    path = os.fsdecode(exc.filename)
    me = os.geteuid()
    for where in (path, os.path.dirname(path)):
        uid = _owner(where)  # (a symlink's target's: what was refused)
        if uid is None:
            continue
        if uid == me:
            continue  # (ours: its folder may be what refused a rename or an unlink)
        if uid == 0 and _owner(os.path.dirname(where)) == me:
            # (Root's file in a folder of ours: a root command wrote there. In a folder of
            # root's, a queue root owns on purpose, root is whom to run as: review FZ.)
            return (f" ({where} belongs to root, and this runs as {named(me)}: a command "
                    f"run as root made it; have root remove it or `chown` it to you)")
        return (f" ({where} belongs to {named(uid)}, and this runs as {named(me)}: run "
                "renderctl there as its owner, or give it back with `chown`)")
    return ""


def _owner(path: str) -> int | None:
    try:
        return os.stat(path).st_uid
    except (OSError, ValueError):
        return None


def _shortage(err: int | None) -> str:
    """What a shortage of the process's or the system's resources is, said where an error
    names it: "Too many open files" on a queue file read as the queue failing (audit FI)."""
    if err == errno.EMFILE:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return (f" (this process may have {soft} open at once: the open-files limit, "
                "`ulimit -n`; raise it or lower --workers)")
    if err == errno.ENFILE:
        return " (the system's table of open files is full: fs.file-max)"
    if err == errno.EAGAIN:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
        # (What reaches a command's end as EAGAIN is a fork: audit FV, a bare "I/O error:
        # Resource temporarily unavailable" under `ulimit -u 3`.)
        return (f" (if a process was being started: a limit on processes was reached, "
                f"`ulimit -u` ({limit}; not applied to root) or a pids cgroup's pids.max)")
    return ""


def text_lines(text: str) -> list[str]:
    """``text``'s lines as a terminal shows them, not as str.splitlines makes them: that
    also ends one at a form feed, VT, NEL or U+2028, and a tool writing a form feed between
    pages (pdftotext) had its last 20 lines come out as its last 5 (audit BJ). A line ends
    at LF (or CRLF); a lone CR goes back to its start, and what follows is what is seen of
    it: a progress counter (wget, curl, pv, ffmpeg) redrawn after the tool's error filled
    the 20 kept lines with its updates, the error gone (audit FU)."""
    lines = [_seen(line) for line in _LINE_ENDS.split(text)]
    return lines[:-1] if lines and not lines[-1] else lines


_LINE_ENDS = re.compile(r"\r*\n")


def _seen(line: str) -> str:
    """What a terminal shows of ``line`` redrawn after each CR: each part written over the
    start of what was there (a shorter redraw leaves the rest of the longer one), an
    erase-line escape (``ESC[K``, ``ESC[2K``: curl's, pip's) clearing the rest of the line
    (review FZ: "\x1b[Kerror: resetfile.tar 45%")."""
    if "\r" not in line:
        return line
    shown = ""
    for part in line.split("\r"):
        pieces = _ERASE_LINE.split(part)
        if len(pieces) == 1:
            shown = part + shown[len(part):]
            continue
        # Text and erases alternate: each text written at the cursor, each erase clearing
        # from it to the end of the line (ESC[K) or the whole line, the cursor staying
        # (ESC[2K: review GA, "error: bad input a long line" where a terminal shows
        # "error: bad input").
        at = 0
        for i, piece in enumerate(pieces):
            if i % 2:
                shown = " " * at if piece == "2" else shown[:at]
                continue
            shown = shown[:at] + piece + shown[at + len(piece):]
            at += len(piece)
        shown = shown.rstrip(" ")
    return shown


_ERASE_LINE = re.compile("\x1b\\[([02]?)K")


def displayable(text: str) -> str:
    """``text`` with each lone surrogate escaped: an undecodable byte of a file name (kept
    by Python as U+DC80-U+DCFF) as ``\\xff``, the byte it stands for, as a terminal would
    be shown it; any other as ``\\udxxx``. UTF-8 has no such characters, and JSON's escape
    for one (``\\udcff``) is refused by strict decoders (jq, Go). For what is printed
    (the command line) and what is stored (a job's error, the event log)."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\x{ord(m[0]) - 0xDC00:02x}"
                          if 0xDC80 <= ord(m[0]) <= 0xDCFF else f"\\u{ord(m[0]):04x}", text)


_SURROGATE = re.compile("[\ud800-\udfff]")  # (in a str, every one is lone)
