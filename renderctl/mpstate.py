"""Everything renderctl does with multiprocessing's private fork-server and resource-tracker
state, in one place to check when CPython changes it (these attributes are not an API)."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import tempfile
from multiprocessing import forkserver, resource_tracker
from typing import Any

from renderctl.proctree import pid_alive

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


def prestart(method: str) -> Any:
    """The multiprocessing context for ``method``; for forkserver, start the server now.

    The server preloads the renderers in its own process; starting it before the submit
    and the recovery lets that overlap them instead of delaying the first job. Idempotent.
    """
    ctx = multiprocessing.get_context(method)
    mp_temp_dir()
    no_resource_tracker()
    if method == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))
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
