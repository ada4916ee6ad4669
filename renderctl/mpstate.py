"""Everything renderctl does with multiprocessing's private fork-server and resource-tracker
state, in one place to check when CPython changes it (these attributes are not an API)."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import signal
import tempfile
from collections.abc import Iterator
from multiprocessing import forkserver, resource_tracker
from typing import Any

from renderctl.proctree import is_stopped, pid_alive

# The modules the fork server imports before it forks any worker, so that a worker starts in
# milliseconds with the renderers loaded (names only: importing this module loads none).
PRELOAD = (
    "renderctl.forkserver_init",  # first: the server ignores a group-wide SIGTERM
    "renderctl.worker",
    "renderctl.render.safety",
    "renderctl.render.invoice",
    "renderctl.render.report",
    "renderctl.render.pdfops",
    "pypdf",
)
# A unix socket's path holds 107 bytes (108 with its NUL); the fork server's is
# <base>/pymp-XXXXXXXX/listener-XXXXXXXX, 32 more than its base folder.
SUN_PATH_MAX = 107
MP_SOCKET_SUFFIX_LEN = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def drop_inherited_pipes() -> None:
    """Close the fork server's "alive" pipe end that CPython hands every forkserver child.

    The fork server exits when that pipe reaches EOF, i.e. when the runner dies, and its
    exit is what fires our parent-death signal. While any worker holds a copy of the write
    end, the EOF never comes and a SIGKILLed runner's workers would run on unsupervised.
    """
    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:  # (a fork server's child)
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]
    # And the resource tracker's descriptor (the runner's /dev/null: see
    # no_resource_tracker): a job's own multiprocessing starts a tracker of its own.
    tracker = resource_tracker._resource_tracker
    tfd = getattr(tracker, "_fd", None)
    if tfd is not None:
        with contextlib.suppress(OSError):
            os.close(tfd)
        tracker._fd = None  # type: ignore[attr-defined]


def no_resource_tracker() -> None:
    """Start no resource tracker for this process (the runner) and what it starts.

    multiprocessing starts one with the fork server, and for every spawn, to unlink named
    semaphores and shared memory a crash leaves. The runner makes neither (its workers talk
    over pipes), so the tracker was a process per run for nothing: an interpreter start
    (~0.2 s CPU here) and one more helper a SIGSTOP of the group could leave stopped. Given
    a descriptor it can write to, multiprocessing takes the tracker for running; /dev/null
    takes the probes. Left alone if one runs already or CPython keeps it otherwise."""
    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_fd", 0) is not None or not callable(
            getattr(tracker, "_check_alive", None)):
        return
    tracker._fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)  # type: ignore[attr-defined]


def forget_dead_helpers() -> None:
    """Forget the resource tracker and fork server a job's own multiprocessing started.

    They are this worker's children, so they were just killed with the job's other
    leftovers, but multiprocessing still holds their pipes and pids: the next job's use
    would write to a dead pipe (SIGPIPE: the worker dies) or wait for a reaped pid
    (ChildProcessError). Forgotten, they are started afresh when a job needs them."""
    tracker = resource_tracker._resource_tracker
    pid = getattr(tracker, "_pid", None)
    if pid is not None and not pid_alive(pid):
        with contextlib.suppress(OSError, TypeError):
            os.close(tracker._fd)  # type: ignore[attr-defined]
        tracker._fd = tracker._pid = None  # type: ignore[attr-defined]
    forget_dead_server()


def forget_dead_server() -> None:
    """Reap and forget this process's fork server if it has died (a job killed it; a
    runner's), so that it is no zombie child of ours until the next start, when CPython
    would, and a start makes a new one."""
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or pid_alive(pid):
        return  # (or not yet a zombie: the next worker start reaps it)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    with contextlib.suppress(OSError, TypeError):
        os.close(server._forkserver_alive_fd)  # type: ignore[attr-defined]
    server._forkserver_pid = None  # type: ignore[attr-defined]
    server._forkserver_address = None  # type: ignore[attr-defined]
    server._forkserver_alive_fd = None  # type: ignore[attr-defined]


def dead_fork_server() -> int | None:
    """The pid of this process's fork server if it has died (else None)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if pid is not None and not pid_alive(pid) else None


def forkserver_pid() -> int | None:
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def helper_pids() -> list[int]:
    """The pids of this process's fork server and resource tracker, where they run."""
    pids = (getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None))
    return [p for p in pids if isinstance(p, int)]


def continue_helpers() -> None:
    """SIGCONT our fork server and resource tracker where they are stopped. A job can stop
    the server (it is its worker's parent), and a SIGSTOP of the runner's whole process
    group, then a `kill -CONT` of the runner alone, left both stopped. The fork server
    reports its children's deaths: stopped, it left every worker's end unheard, the drain
    never ended, and the exit waited on it for good (multiprocessing joins its children at
    exit). ~20 us: a stat of each."""
    for helper in helper_pids():
        if is_stopped(helper):
            with contextlib.suppress(OSError):
                os.kill(helper, signal.SIGCONT)


# How often a start that waits on the fork server resumes it: a job stopping the server
# again and again still lets each start through within about this long.
START_WATCH_S = 0.05


@contextlib.contextmanager
def helpers_kept_running() -> Iterator[None]:
    """Resume the fork server every START_WATCH_S while the block runs (a worker's start).

    The start sends the server a request and blocks reading its answer (the new pid); a job
    in another worker that SIGSTOPs the server in between (after our check just before)
    left that read, and so the whole run, waiting for good. SIGALRM interrupts the read;
    its handler resumes the server, and the read (retried by Python, PEP 475) gets the
    answer. Main thread only (signal.signal); ~9 us a start (of 2-20 ms)."""
    def resume(signum: int, frame: object) -> None:
        # An error raised here would come out of the start instead (out of descriptors,
        # say: the read of /proc failed): the next tick, or the runner's loop, tries again.
        with contextlib.suppress(OSError):
            continue_helpers()

    prior = signal.signal(signal.SIGALRM, resume)
    # Unblocked for the while: a mask inherited from whatever started us (exec keeps it)
    # held every tick pending, and the start waited on the stopped server for good (audit
    # AS: 3 of 3 runs hung with SIGALRM blocked).
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    signal.setitimer(signal.ITIMER_REAL, START_WATCH_S, START_WATCH_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGALRM, prior)


def prestart(method: str) -> Any:
    """The multiprocessing context for ``method``; for forkserver, start the server now.

    The server preloads the renderers in its own process; starting it before the submit
    and the recovery lets that overlap them instead of delaying the first job. Idempotent.
    """
    ctx = multiprocessing.get_context(method)
    mp_temp_dir()
    no_resource_tracker()
    if method == "forkserver":
        # Only the first: it imports the rest itself, each failure skipped whatever it
        # raises (multiprocessing skips an ImportError only; any other error at import
        # killed the server, and the run said "the fork server keeps failing (EOFError)":
        # audit BQ). A worker then imports what is missing and names what fails.
        ctx.set_forkserver_preload(list(PRELOAD[:1]))
        forkserver.ensure_running()
    return ctx


def mp_temp_dir() -> str:
    """multiprocessing's folder for this process (the fork server's socket), made on first
    use: in TMPDIR when the socket's path fits there, else in the first short system folder
    that will hold it. A TMPDIR of more than ~75 characters (CI runners, nested builds,
    pytest's own) made every forkserver run exit 74, "AF_UNIX path too long"; Python 3.14
    falls back to /tmp the same way (cpython gh-132124), 3.11 does not."""
    if len(os.fsencode(tempfile.gettempdir())) + MP_SOCKET_SUFFIX_LEN > SUN_PATH_MAX:
        for short in ("/tmp", "/var/tmp", "/dev/shm"):
            if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
                saved = tempfile.tempdir
                tempfile.tempdir = short  # read once: get_temp_dir keeps what it made
                try:
                    return multiprocessing.util.get_temp_dir()
                finally:
                    tempfile.tempdir = saved
    return multiprocessing.util.get_temp_dir()
