"""Everything renderctl does with multiprocessing's private fork-server and resource-tracker
state, in one place to check when CPython changes it (these attributes are not an API)."""

from __future__ import annotations

import contextlib
import os
from multiprocessing import forkserver, resource_tracker

from renderctl.proctree import pid_alive


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
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None and not pid_alive(pid):
        with contextlib.suppress(OSError, TypeError):
            os.close(server._forkserver_alive_fd)  # type: ignore[attr-defined]
        server._forkserver_pid = None  # type: ignore[attr-defined]
        server._forkserver_address = None  # type: ignore[attr-defined]
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]


def dead_fork_server() -> int | None:
    """The pid of this process's fork server if it has died (else None)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if pid is not None and not pid_alive(pid) else None


def helper_pids() -> list[int]:
    """The pids of this process's fork server and resource tracker, where they run."""
    pids = (getattr(forkserver._forkserver, "_forkserver_pid", None),
            getattr(resource_tracker._resource_tracker, "_pid", None))
    return [p for p in pids if isinstance(p, int)]
