"""Waiting for the queue's lock files: bounded, interruptible, and saying whom we wait for.

A submit, a `dead retry`, a `prune`, a `cancel` and a starting runner each wait for a lock
another renderctl process holds for milliseconds or a few seconds (a big submit, a batch of
a retry). Waiting without a bound or a word turned a holder stopped by Ctrl-Z or SIGSTOP (or
a `flock` someone left running) into commands that hung with nothing said, a `run` that
SIGTERM could not stop, and cron jobs piling up behind it. Here a wait:

- says, after LOCK_NOTICE_S, which process holds the lock (pid and command line, from
  /proc/locks), and that it is stopped when it is;
- gives up with QueueBusy (exit 75, "try again later") once a holder has been stopped for
  STOPPED_PATIENCE_S, or after LOCK_MAX_WAIT_S in any case: a live holder that works (a
  20,000-job submit holds the lock for seconds, on a slow disk for a minute) is waited for;
- ends at once when ``stop_requested`` returns a signal number (`run`'s SIGTERM/SIGINT,
  which its handlers only record), raising Interrupted: nothing was done under the lock.

The wait blocks in flock(2) (in a helper thread: see flock_waiting); holders are read from
/proc/locks only when a wait goes on, never on the fast path.
"""

from __future__ import annotations

import _thread
import contextlib
import errno
import fcntl
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from renderctl.errors import Interrupted, QueueBusy, QueueIOError

LOCK_NOTICE_S = 1.0
STOPPED_PATIENCE_S = 5.0
LOCK_MAX_WAIT_S = 600.0
# Tests shorten the two bounds (a real stopped holder; a real outside flock).
STOPPED_PATIENCE_ENV = "RENDERCTL_TEST_LOCK_STOPPED_S"
MAX_WAIT_ENV = "RENDERCTL_TEST_LOCK_MAX_WAIT_S"
_TICK_S = 0.05  # how often a wait looks at its holders and at stop signals


def open_lock_file(path: Path, *, dir_fd: int | None = None, writable: bool = True) -> int:
    """Open (creating) the lock file ``path`` (a name in ``dir_fd`` if given), never through
    a symlink: a link there made renderctl lock, create or (runner.lock) empty whatever file
    it pointed to, and let two queues whose lock files pointed to one file lock each other
    out. QueueIOError (exit 74) naming it otherwise."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CREAT | os.O_CLOEXEC
    # O_NONBLOCK: a FIFO put there is opened without waiting for a writer.
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        return held(os.open(path if dir_fd is None else path.name, flags, 0o600,
                            dir_fd=dir_fd))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise QueueIOError(f"{path} is a symlink: renderctl's lock files are its own and "
                               "are never followed; remove it (renderctl makes it anew)"
                               ) from None
        raise QueueIOError(f"cannot open the lock file {path}: {exc.strerror}") from exc


# Lock descriptors open in this process (lock files, the journal/ folder, a waiter's dup):
# in a forked child they are pointed at /dev/null (see _blind_locks). An flock is the open
# file's, which a fork shares: a child (a multiprocessing worker forked while a thread was
# inside submit) held the submit lock for as long as it lived, and every submit to the
# queue, from any process, waited (audit FC).
_lock_fds: set[int] = set()


def held(fd: int) -> int:
    """Note ``fd`` as a lock descriptor of this process; returns it."""
    _lock_fds.add(fd)
    return fd


def close_lock(fd: int) -> None:
    """Close a lock descriptor noted by ``held`` (the lock, if ours, goes with it)."""
    _lock_fds.discard(fd)
    os.close(fd)


def _blind_locks() -> None:
    """In a forked child: the parent's lock descriptors point at /dev/null, not closed, so
    that their numbers stay taken and the parent's objects this child holds copies of
    never close a descriptor of the child's that reused one."""
    if not _lock_fds:
        return
    try:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for fd in list(_lock_fds):
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    _lock_fds.clear()


def holders(fd: int, *, exclusive: bool = False) -> list[int]:
    """The pids holding an flock on ``fd``'s file (only exclusive ones if ``exclusive``),
    ours left out, as /proc/locks shows them (one in another pid namespace shows as 0: left
    out)."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    me = os.getpid()
    found: list[int] = []
    try:
        with open("/proc/locks") as fh:
            for line in fh:
                # "1: FLOCK  ADVISORY  WRITE 8377 fe:00:2228581 0 EOF"; a waiter's line has
                # "->" after the number, and its fields shift by one: never matched here.
                f = line.split()
                if len(f) >= 6 and f[1] == "FLOCK" and f[5] == key \
                        and (f[3] == "WRITE" or not exclusive):
                    pid = int(f[4])
                    if pid and pid != me and pid not in found:
                        found.append(pid)
    except (OSError, ValueError):
        pass
    return found


def describe(pid: int) -> str:
    """"pid N (its command line)", the command line shortened."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode(errors="replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        argv = []
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith("renderctl"):
        argv = ["renderctl", *argv[3:]]  # `python -m renderctl.cli.app submit` as typed
    elif argv and os.path.basename(argv[0]).startswith("python") and len(argv) >= 2 \
            and os.path.basename(argv[1]) == "renderctl":
        argv = argv[1:]
    if argv:
        argv[0] = os.path.basename(argv[0])
    cmd = " ".join(argv)
    if len(cmd) > 80:
        cmd = cmd[:77] + "..."
    return f"pid {pid} ({cmd})" if cmd else f"pid {pid}"


def _bound(env: str, default: float) -> float:
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


WAITER_THREAD = "renderctl-lock-wait"  # the helper thread that blocks in flock (tests)
# A waiter given up on stays blocked in flock, holding a descriptor, until the holder lets
# go: a web tier whose every request gave up on a stopped holder kept a thread and an fd
# per request (audit BD: 50 requests, 50 of each). So at most this many such threads block
# on one lock file at a time, waiting or given up on; past them a wait polls instead
# (LOCK_NB each tick), which leaves nothing behind. Counted while they live, not once
# given up: requests that began waiting together all saw none given up yet (audit BH: 30
# at once left 30).
MAX_BLOCKED_WAITERS = 4
_blocked: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) of the lock file: how many
_blocked_lock = _thread.allocate_lock()  # (_thread: threading is imported only to wait)


class _GiveUp(Exception):
    pass


def flock_waiting(fd: int, mode: int, check: Callable[[float], None]) -> None:
    """flock ``fd`` (``mode``), blocking until it is ours, calling ``check(seconds waited)``
    every tick meanwhile; an exception ``check`` raises abandons the wait and propagates.

    flock has no timeout, and an alarm signal to cut it short would need the main thread
    and take SIGALRM from the program: a helper thread blocks in it instead, on a dup of
    ``fd`` (a flock belongs to the open file, so once taken it is ``fd``'s). Blocking, not
    polling: the lock is ours the moment its holder lets go (a poller could wait out a whole
    `dead retry --all`, whose batches take the lock again at once), and /proc/locks shows
    the wait (a "->" line). Abandoned, the thread lets go of the lock as soon as it gets it.
    The thread is gone when this returns (a runner forks its workers later)."""
    import threading  # lazily: only a wait needs it

    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    start = time.monotonic()
    # Past the bound, poll, and block as soon as a slot frees: a poller that only polled
    # was overtaken by every later request taking the freed slot, and starved behind a
    # holder that lets go and takes the lock again at once (review BK).
    while not _take_slot(key):
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        check(time.monotonic() - start)
        time.sleep(_TICK_S)
    try:
        dup = held(os.dup(fd))
    except BaseException:
        _unblocked(key)
        raise
    cond = threading.Condition()
    state: dict[str, Any] = {"ended": False, "error": None, "abandoned": False}

    def wait() -> None:
        error: OSError | None = None
        try:
            fcntl.flock(dup, mode)
        except OSError as exc:
            error = exc
        try:
            with cond:
                if state["abandoned"] and error is None:
                    # (Failing, it goes when the caller, which gave up, closes its own
                    # descriptor: the lock is the open file's, which both name.)
                    with contextlib.suppress(OSError):
                        fcntl.flock(dup, fcntl.LOCK_UN)
                state.update(ended=True, error=error)
                cond.notify()
        finally:
            # A close that fails (EIO) has freed the descriptor all the same: nothing to
            # report, and a traceback from this thread was all the user saw (audit DN),
            # its slot among the waiters then lost for the process's life.
            with contextlib.suppress(OSError):
                close_lock(dup)
            _unblocked(key)

    thread = threading.Thread(target=wait, name=WAITER_THREAD, daemon=True)
    try:
        thread.start()
    except BaseException:
        close_lock(dup)
        _unblocked(key)
        raise
    with cond:
        while not state["ended"]:
            try:
                check(time.monotonic() - start)
            except BaseException:
                state["abandoned"] = True
                raise
            # (A signal's handler runs meanwhile: the wait resumes, at most a tick late.)
            cond.wait(timeout=_TICK_S)
    thread.join()
    if state["error"] is not None:
        raise state["error"]


def _take_slot(key: tuple[int, int]) -> bool:
    with _blocked_lock:
        if _blocked.get(key, 0) >= MAX_BLOCKED_WAITERS:
            return False
        _blocked[key] = _blocked.get(key, 0) + 1
        return True


def _forget_waiters() -> None:
    """In a forked child: the parent's waiter threads are not here (their slots would
    be taken for good), and its count's lock may have been held at the fork."""
    global _blocked_lock
    _blocked.clear()
    _blocked_lock = _thread.allocate_lock()


os.register_at_fork(after_in_child=_forget_waiters)
os.register_at_fork(after_in_child=_blind_locks)


def _unblocked(key: tuple[int, int]) -> None:
    with _blocked_lock:
        _blocked[key] -= 1
        if not _blocked[key]:
            del _blocked[key]


def flock_within(fd: int, mode: int, timeout_s: float) -> bool:
    """flock ``fd`` (``mode``), blocking at most ``timeout_s``; whether it is now held."""
    if timeout_s <= 0:
        return False

    def check(waited: float) -> None:
        if waited >= timeout_s:
            raise _GiveUp

    try:
        flock_waiting(fd, mode, check)
    except _GiveUp:
        return False
    return True


def wait_for_flock(fd: int, mode: int, path: Path, *, doing: str,
                   notice: Callable[[str], None] | None = None,
                   stop_requested: Callable[[], int | None] | None = None) -> None:
    """flock ``fd`` (``mode``: LOCK_SH or LOCK_EX) on the lock file ``path``, waiting as the
    module says; ``doing`` ends the messages ("nothing was enqueued"). An error of flock
    itself (EIO, ENOLCK) names ``path`` (audit DN: "I/O error: Input/output error")."""
    from renderctl.fsutil import with_name

    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    except OSError as exc:
        raise with_name(exc, path) from None
    stopped_patience = _bound(STOPPED_PATIENCE_ENV, STOPPED_PATIENCE_S)
    max_wait = _bound(MAX_WAIT_ENV, LOCK_MAX_WAIT_S)
    told: tuple[int, ...] | None = None  # the holders (and stopped ones) last named
    stopped_since: dict[int, float] = {}

    def check(waited: float) -> None:
        nonlocal told
        signum = stop_requested() if stop_requested is not None else None
        if signum is not None:
            raise Interrupted(f"stopped by {signal.Signals(signum).name} while waiting for "
                              f"{path}; {doing}", signum)
        if waited < LOCK_NOTICE_S and waited < max_wait:
            return
        from renderctl.proctree import is_stopped  # (psutil: only once a wait goes on)

        now = time.monotonic()
        pids = holders(fd)
        for pid in pids:
            if _stopped(is_stopped, pid):
                stopped_since.setdefault(pid, now)
            else:
                stopped_since.pop(pid, None)
        stuck = [p for p in pids if now - stopped_since.get(p, now) >= stopped_patience]
        if stuck or waited >= max_wait:
            named = stuck or pids
            raise QueueBusy(_busy_message(path, pids, stuck, waited, doing),
                            holder_pid=named[0] if named else None)
        key = (*sorted(pids), -1, *sorted(stopped_since))
        if notice is not None and key != told:
            told = key
            notice(_notice_message(path, pids, stopped_since, stopped_patience))

    try:
        flock_waiting(fd, mode, check)
    except OSError as exc:
        raise with_name(exc, path) from None


class HeldOff:
    """A lock found held on each try of a caller that never blocks on it (a runner's claim:
    it tries again on its next pass, and must not give up on a queue it serves). After
    LOCK_NOTICE_S of it, ``notice`` is told whom it waits for, once per set of holders
    (and again when one of them is stopped or continued)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.since: float | None = None
        self._told: tuple[int, ...] | None = None

    def held(self, fd: int, notice: Callable[[str], None] | None) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if notice is None or now - self.since < LOCK_NOTICE_S:
            return
        from renderctl.proctree import is_stopped

        pids = holders(fd, exclusive=True)
        halted = [p for p in pids if _stopped(is_stopped, p)]
        key = (*sorted(pids), -1, *sorted(halted))
        if key != self._told:
            self._told = key
            notice(_notice_message(self.path, pids, dict.fromkeys(halted, now), None))

    def free(self) -> None:
        self.since, self._told = None, None


def _stopped(is_stopped: Callable[[int], bool], pid: int) -> bool:
    try:
        return is_stopped(pid)
    except (OSError, ValueError):  # unreadable: judged running, waited for
        return False


def _who(pids: list[int]) -> str:
    return ", ".join(describe(p) for p in pids) if pids else "another process"


def _notice_message(path: Path, pids: list[int], stopped_since: dict[int, float],
                    patience: float | None) -> str:
    """What a wait says of its holders; ``patience`` None: it never gives up (a runner)."""
    msg = f"waiting for {path}, held by {_who(pids)}"
    halted = [p for p in pids if p in stopped_since]
    if halted:
        msg += (f"; pid {halted[0]} is stopped (Ctrl-Z or SIGSTOP): `kill -CONT {halted[0]}` "
                "lets it finish")
        if patience is not None:
            msg += f"; giving up if it stays stopped {patience:g} s"
    return msg


def _busy_message(path: Path, pids: list[int], stuck: list[int], waited: float,
                  doing: str) -> str:
    if stuck:
        why = (f"{describe(stuck[0])} holds {path} and is stopped (Ctrl-Z or SIGSTOP; "
               f"`kill -CONT {stuck[0]}` lets it finish)")
    else:
        why = f"{_who(pids)} has held {path} for {waited:.0f} s"
    return f"{why}; {doing}; try again later"
