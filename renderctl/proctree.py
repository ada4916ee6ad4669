"""Process groups, kills and liveness: the runner's view of a job's process tree.

A worker calls ``os.setpgid(0, 0)``, so a job's tree is the worker's process group and the
group id is the worker's pid. Everything here is non-blocking except ``stop_group``, the
escalation helper for shutdown paths and tests.

Who kills whom when the runner dies
-----------------------------------
* A worker calls ``set_parent_death_signal()`` first thing: when its parent dies the kernel
  sends it a signal whose handler kills its group. Under the *forkserver* start method the
  worker's parent is the fork server, not the runner; the fork server exits as soon as the
  runner's end of its "alive" pipe closes (which the kernel does when the runner dies,
  even by SIGKILL), so the chain runner -> fork server -> worker still ends in its death, a
  few ms later. (The runner is a child subreaper: should the fork server alone die, its
  workers become the runner's children, and the kernel sends them the signal again when
  the runner dies; the worker's handler lets them live while their parent is the runner.)
* PR_SET_PDEATHSIG is cleared in a forked child, so a ``command`` child of a worker is not
  covered by it (we set no preexec hook). Such a child outlives a SIGKILLed worker, but it
  stays (1) in the worker's process group, whose id the lease records as the holder pid:
  the next runner, having decided the holder is dead (``holder_alive``), calls
  ``kill_group(pgid, SIGKILL)`` — safe, because the kernel never hands out a pid that is
  still used as a process group id, so a live group with that id is the same group; and
  (2) in the worker's slot cgroup when a cgroup guard is in use: ``cleanup_stale`` of the
  next runner kills every task left in a dead runner's cgroups, even one that called
  setsid() and left the group.

Zombies
-------
``killpg(pgid, 0)`` succeeds while any member is an unreaped zombie. ``stop_group`` and
``group_alive`` therefore scan /proc and ignore members in state Z: a zombie holds no
memory and cannot run, and reaping it is its parent's business (reaping a multiprocessing
worker behind its ``Process`` object's back would make ``join()`` lose the exit code).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import select
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PROC = Path("/proc")


class ParentGone(RuntimeError):
    """The parent died before the parent-death signal was armed; the caller must exit."""


def set_parent_death_signal(
    sig: int = signal.SIGKILL, *, expected_parent: int | None = None
) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies."""
    # Read the parent before arming: if it dies in between we are reparented and the
    # check below sees a different ppid, closing the race prctl alone leaves open.
    parent = os.getppid() if expected_parent is None else expected_parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    if os.getppid() != parent or parent == 1:
        raise ParentGone(f"parent {parent} died before PR_SET_PDEATHSIG was set")


_PR_GET_PDEATHSIG = 2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def parent_death_signal() -> int:
    """The parent-death signal armed for this process (0: none). A change of effective
    user clears it (the kernel does, even for seteuid(65534) then seteuid(0))."""
    sig = ctypes.c_int(0)
    if _libc().prctl(_PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0) != 0:
        return 0
    return sig.value


def set_child_subreaper(on: bool = True) -> None:
    """Make orphaned descendants of this process its children instead of init's (or, with
    ``on=False``, stop doing so).

    A process that double-forks and calls setsid() leaves its parent's process group and,
    without this, its parent's tree: nothing but a cgroup could find it again."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(err)}")


def _check_pgid(pgid: int) -> None:
    # killpg(0) is our own group and killpg(1) is init's: a bug upstream must not
    # turn into killing the runner or the machine.
    if pgid <= 1:
        raise ValueError(f"refusing to signal process group {pgid}")


def suspend_self() -> None:
    """Stop this process as Ctrl-Z asks (SIGTSTP's default action, which a shell reports as
    such) and return once it is continued. In an orphaned process group (nothing could
    continue it: a service, a detached session) the kernel discards the signal instead, and
    this returns at once. The caller's handler and signal mask for SIGTSTP are kept."""
    prior = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTSTP})
    try:
        os.kill(os.getpid(), signal.SIGTSTP)  # delivered, and stops us, before this returns
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGTSTP, prior)


def kill_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process in group ``pgid``; False if the group is already gone."""
    _check_pgid(pgid)
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the comm, which may contain spaces and ')')."""
    try:
        data = (_PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data[data.rindex(b")") + 2 :].decode().split()


def pidfd_exited(pidfd: int | None, timeout_s: float = 0) -> bool:
    """Whether the process of ``pidfd`` has exited (True for none), waiting up to
    ``timeout_s`` for it. (poll, not select: a runner of a few hundred workers holds
    descriptors numbered past select's 1024.)"""
    if pidfd is None:
        return True
    p = select.poll()
    p.register(pidfd, select.POLLIN)
    return bool(p.poll(math.ceil(timeout_s * 1000)))


def reap_pidfd(pidfd: int) -> int | None:
    """Reap the exited process of ``pidfd`` if it is our child (a worker that outlived its
    fork server): its status as multiprocessing gives it; None if it has not exited or is
    another's (by the descriptor, not the pid: no pid reused meanwhile is mistaken)."""
    try:
        res = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    if res is None:
        return None
    return -res.si_status if res.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else res.si_status


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs. A zombie does not: where PID 1 does not reap orphans (some
    containers), a dead process stays a zombie for good and kill(pid, 0) still succeeds."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or Ctrl-Z's SIGTSTP): `ps` state T."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "T"


def group_members(pgid: int, *, include_zombies: bool = False) -> list[int]:
    """Pids whose process group is ``pgid`` (a /proc scan, about 10 µs per process)."""
    members: list[int] = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[0] is the state (stat field 3), fields[2] the pgrp (field 5).
        if fields is None or int(fields[2]) != pgid:
            continue
        if fields[0] == "Z" and not include_zombies:
            continue
        members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any non-zombie process remains in group ``pgid``."""
    _check_pgid(pgid)
    try:
        os.killpg(pgid, 0)  # one syscall settles the common "long gone" case
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return bool(group_members(pgid))


@dataclass(frozen=True)
class StopResult:
    """How ``stop_group`` ended: the last signal it needed and the time it took."""

    signal_used: int | None  # None: the group was already gone
    elapsed_s: float
    survivors: tuple[int, ...]  # non-empty only if the timeout passed


def _wait_members_gone(pgid: int, deadline: float, poll_s: float) -> list[int]:
    """Wait until no non-zombie member remains or ``deadline``; return those left."""
    while True:
        members = group_members(pgid)
        now = time.monotonic()
        if not members or now >= deadline:
            return members
        # A pidfd turns readable when its process exits, child of ours or not; the short
        # timeout only bounds how late we notice a member that appeared after the scan.
        fds = []
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
        try:
            if fds:
                select.select(fds, [], [], min(poll_s, deadline - now))
        finally:
            for fd in fds:
                os.close(fd)


def stop_group(
    pgid: int, *, grace_s: float, poll_s: float = 0.05, kill_timeout_s: float = 10.0
) -> StopResult:
    """Blocking escalation: SIGTERM, wait ``grace_s``, SIGKILL, wait until the group is empty."""
    start = time.monotonic()
    if not group_members(pgid) or not kill_group(pgid, signal.SIGTERM):
        return StopResult(None, time.monotonic() - start, ())
    if not _wait_members_gone(pgid, start + grace_s, poll_s):
        return StopResult(signal.SIGTERM, time.monotonic() - start, ())
    kill_group(pgid, signal.SIGKILL)
    left = _wait_members_gone(pgid, time.monotonic() + kill_timeout_s, poll_s)
    return StopResult(signal.SIGKILL, time.monotonic() - start, tuple(left))


def _read_boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def boot_id() -> str:
    """This boot's random id; a lease taken under another boot id has a dead holder."""
    return _read_boot_id()


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (stat field 22); None if gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def holder_alive(*, host: str, boot_id: str, pid: int, start_time: int) -> bool | None:
    """Whether a lease holder still runs; None when it ran on another host (cannot tell)."""
    if host != socket.gethostname():
        return None
    if boot_id != _read_boot_id():
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    # A recycled pid has a later start time: comparing it makes pid reuse harmless.
    return int(fields[19]) == start_time


def holder_dead_to_lock_holder(*, host: str, boot_id: str, pid: int,
                               start_time: int) -> bool:
    """For a caller holding the queue's runner lock: whether a lease holder is known dead.
    One of this kernel (its boot id) is, whatever its host name says: a runner in another
    container (UTS namespace) of this machine, alive, would hold the lock we hold (an
    flock is the kernel's). Its leases were left to expire, ~1 minute, before a new
    container's runner returned its jobs (audit FK)."""
    alive = holder_alive(host=host, boot_id=boot_id, pid=pid, start_time=start_time)
    return alive is False or (alive is None and boot_id == _read_boot_id())


def set_oom_score_adj(value: int, *, pid: int | None = None) -> bool:
    """Best effort: set the OOM killer bias of ``pid`` (default: self); True if it took."""
    path = _PROC / ("self" if pid is None else str(pid)) / "oom_score_adj"
    try:
        path.write_text(f"{value}\n")
        return int(path.read_text()) == value
    except (OSError, ValueError):
        # Lowering needs CAP_SYS_RESOURCE; a worker raising its own value never fails.
        return False


def descendants(pid: int) -> list[int]:
    """All living descendants of ``pid`` (children, grandchildren, ...); [] if it is gone."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


__all__ = [
    "ParentGone",
    "StopResult",
    "boot_id",
    "descendants",
    "group_alive",
    "group_members",
    "holder_alive",
    "holder_dead_to_lock_holder",
    "kill_group",
    "pid_alive",
    "pidfd_exited",
    "process_start_time",
    "reap_pidfd",
    "set_child_subreaper",
    "set_oom_score_adj",
    "set_parent_death_signal",
    "stop_group",
]
