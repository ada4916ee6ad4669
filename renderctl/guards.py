"""Per-job memory ceilings on a whole process tree: cgroups when we can, sampling when not.

::

    runner                               worker (own process group, in slot cgroup)
    ------                               ------
    guard = detect_memory_guard()
    slot = guard.open_slot("w0")
    slot.adopt(worker_pid)   ---path--->  set_job_limit(path, job.memory_limit_bytes)
    mark = slot.mark()                    run the job (the kernel enforces the ceiling)
    ... worker dies ...
    slot.oom_killed_since(mark) -> outcome "memory", slot.peak_bytes()
      (unless not slot.ceiling_reached_since(mark): a limit above the slot ran out)
    slot.close(); guard.close()

Without a writable cgroup the runner calls ``TreeSampler.sample()`` every <= 50 ms and kills
the group itself when a sample says ``exceeded``.

What cgroup v1 does here (kernel 6.18, measured while writing this module)
----------------------------------------------------------------------------
* The memory controller is mounted at /sys/fs/cgroup/memory; the process's own group
  (from /proc/self/cgroup) accepts child groups as root; ``use_hierarchy`` is 1.
* On crossing ``memory.limit_in_bytes`` the kernel OOM-kills ONE task of the group, the
  largest (oom_badness), with SIGKILL: "Memory cgroup out of memory: Killed process ...".
  v1 has no ``memory.oom.group``, so a worker whose command child was killed keeps running:
  the runner must still ``kill_group`` the slot's process group after an OOM kill.
* ``memory.oom_control`` has an ``oom_kill`` counter (kernel >= 4.13). It is local to the
  group: a child group's OOM kills do not show in the parent's counter, so per-slot
  attribution works. It cannot be reset, hence the ``mark()`` snapshot API.
  ``memory.failcnt`` also counts every time the limit was hit while reclaiming page cache
  (113 hits for one kill of a 10 MB-chunk allocator), so it is a weak fallback only.
* ``memory.max_usage_in_bytes`` after the kill read exactly the limit (314572800 for
  300 MiB): the cgroup charge never exceeds the limit, so the documented margin is 0 for the
  charge; RSS-based figures may differ by the page tables and kernel memory (< 1 MiB).
* tests/bench/bench_guards.py, 300 MiB ceiling: cgroup v1 overshoot 0 MB at 100 MB/s and
  1 GB/s, crossing -> reaped 30-38 ms at 1 GB/s and ~75 ms at 100 MB/s; sampling at 50 ms
  overshoot median 2 / 12 MB, max 4 / 29 MB. A runner should document "peak <= ceiling"
  for cgroups and "ceiling + one interval of allocation" for sampling.
* Lowering the limit below current usage fails at once with EBUSY (0.2 ms; no swap here so
  reclaim has nothing to do): ``set_job_limit`` raises ``LimitBelowUsage``.
* ``memory.memsw.limit_in_bytes`` exists (swap accounting on, though there is no swap);
  it must stay >= ``limit_in_bytes`` (EINVAL otherwise), so the two are written in the
  order that keeps that true.
* Writing 0 to ``memory.max_usage_in_bytes`` resets it to the current usage.
* ``move_charge_at_immigrate`` is left at 0: pages a forkserver worker shares with the
  server stay charged where they were, so the slot is charged for what the job allocates
  (close to USS, not RSS).

cgroup v2 (``memory.max``) is supported on the same interface but untested here: the v2
hierarchy on this machine has no memory controller. There a write of ``memory.max`` below
usage does not fail but reclaims and then OOM-kills, so ``set_job_limit`` checks
``memory.current`` first; ``memory.oom.group`` is set so the kernel kills the whole slot;
``memory.peak`` cannot be reset globally, so the peak is the slot's lifetime peak.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import psutil

from renderctl.errors import ExitCode, RenderctlError
from renderctl.fsutil import with_name

GuardName = Literal["cgroup-v1", "cgroup-v2", "sampling"]
# Tasks (processes and threads) one worker slot may hold: the worker, its job and all the
# job starts. A fork bomb under a large memory ceiling reaches the machine's pid_max first
# (32768 here: ~150 KB a process under a 4 GB ceiling), and then no process anywhere can
# fork, the runner's next worker included; under the default 400 MB it was the ceiling that
# stopped one, at 400 Python forks. Far above a render's needs (a worker is ~3 tasks; a
# job's tool with a thread per core a few dozen), like systemd's default TasksMax (4915).
PIDS_MAX_PER_SLOT = 4096
_SLOT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_RUNNER_DIR = re.compile(r"renderctl-(\d+)")


# -- errors ------------------------------------------------------------------------------


class GuardError(RenderctlError):
    """A memory guard could not be set up or used: the machine's fault, not the job's."""

    exit_code = ExitCode.IO_ERROR


class GuardUnavailable(GuardError):
    """The mechanism asked for (``prefer=``) is not usable on this machine."""

    # Only an explicit choice raises it, so it is the configuration that is wrong: another
    # try on this machine fails the same way, while `auto` or `sampling` would work.
    exit_code = ExitCode.USAGE


class LimitBelowUsage(GuardError):
    """The slot already uses more than the new ceiling; the worker should be recycled."""

    def __init__(self, *, slot_path: str, limit_bytes: int, usage_bytes: int | None) -> None:
        self.slot_path = slot_path
        self.limit_bytes = limit_bytes
        self.usage_bytes = usage_bytes
        super().__init__(
            f"cannot set memory limit {limit_bytes} on {slot_path}: usage {usage_bytes} is above it"
        )


# -- the interface -----------------------------------------------------------------------


# How far below its ceiling a v1 slot's peak may stay when the kill was at the ceiling: a
# charge that fails is at most a batch (64 pages) past the last one that succeeded.
CEILING_SLACK_BYTES = 2 << 20


@dataclass(frozen=True)
class OomMark:
    """A snapshot of a slot's OOM counters, taken before a job, compared after it."""

    oom_kills: int | None  # None: the kernel has no oom_kill counter
    failcnt: int
    own_ooms: int | None = None  # v2: OOMs this slot's own memory.max caused ("oom")


class Slot(Protocol):
    """One worker's memory slot: the runner adopts the worker into it and reads verdicts."""

    @property
    def path(self) -> str: ...
    def adopt(self, pid: int) -> None: ...
    def mark(self) -> OomMark: ...
    def oom_killed_since(self, mark: OomMark) -> bool: ...
    def ceiling_reached_since(self, mark: OomMark) -> bool: ...
    def peak_bytes(self) -> int | None: ...
    def usage_bytes(self) -> int | None: ...
    def held_bytes(self) -> int | None: ...
    def pids(self) -> list[int]: ...
    def release_limit(self) -> None: ...
    def close(self) -> None: ...


class MemoryGuard(Protocol):
    """A mechanism that enforces per-job memory ceilings; ``name`` is shown by ``status``."""

    @property
    def name(self) -> GuardName: ...
    def open_slot(self, slot_name: str) -> Slot: ...
    def close(self) -> None: ...
    def cleanup_stale(self) -> list[str]: ...


# -- small file helpers ------------------------------------------------------------------


# Counter files read or reset once per job stay open: pread/pwrite on a kept fd costs ~1 us,
# open + read + close through pathlib ~12 us, and that was paid several times per job on the
# runner's single thread. Keyed by (path, flags); closed when the cgroup is removed.
_KEPT: dict[tuple[str, int], int] = {}


def _kept_fd(path: str | Path, flags: int) -> int:
    key = (path if isinstance(path, str) else str(path), flags)
    fd = _KEPT.get(key)
    if fd is None:
        fd = _KEPT[key] = os.open(path, flags | os.O_CLOEXEC)
    return fd


def kept_fds() -> tuple[int, ...]:
    """The descriptors kept open on counter files (a worker checks a job left them alone)."""
    return tuple(_KEPT.values())


def drop_inherited_kept() -> None:
    """Forget, without closing, the counter files a forked process inherited from its parent
    (worker._blind_runner_fds points those descriptors at /dev/null): reopened by path."""
    _KEPT.clear()


def _forget_kept(prefix: str) -> None:
    for key in [k for k in _KEPT if k[0].startswith(prefix)]:
        with contextlib.suppress(OSError):
            os.close(_KEPT.pop(key))


def _read_text(path: str | Path) -> str:
    try:
        return os.pread(_kept_fd(path, os.O_RDONLY), 4096, 0).decode()
    except OSError as e:
        # The cgroup was removed under a kept fd (ENODEV): report it as a missing file.
        _forget_kept(str(path))
        if isinstance(e, FileNotFoundError):
            raise
        raise FileNotFoundError(e.errno, e.strerror, str(path)) from e


def _reset_counter(path: Path) -> None:
    # cgroup files want one write() of the whole value; no buffering, no truncation dance.
    try:
        os.pwrite(_kept_fd(path, os.O_WRONLY), b"0", 0)
    except OSError as e:
        # Named (a write on a kept fd names no file), and not kept: a try after this one
        # opens the file afresh (a kept fd on a cgroup removed since answers ENODEV).
        _forget_kept(str(path))
        raise with_name(e, path) from None


def _read_int(path: str | Path) -> int:
    text = _read_text(path).strip()
    return 2**63 - 1 if text == "max" else int(text)


def _read_keyed(path: str | Path, key: str) -> int | None:
    """The value of ``key`` in a flat-keyed file such as memory.oom_control or memory.events."""
    for line in _read_text(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def _write(path: Path, value: str) -> None:
    # cgroup files want one write() of the whole value; no buffering, no truncation dance.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise with_name(e, path) from None  # (EIO alone does not say which cgroup file)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=64)
def _is_v1(path: Path) -> bool:
    return (path / "memory.limit_in_bytes").exists()


# -- worker side -------------------------------------------------------------------------


def set_job_limit(slot_path: str, limit_bytes: int) -> None:
    """Worker side: set this job's ceiling on its slot and reset the peak; no-op for sampling.

    Raises ``LimitBelowUsage`` (the slot holds more than the ceiling), ``GuardError`` (the
    slot is no memory cgroup, e.g. removed), or an ``OSError`` naming the cgroup file that
    could not be read or written: the ceiling is then in no known state, and the caller
    must not run the job until a later call succeeds."""
    if not slot_path:
        return
    if limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be positive, got {limit_bytes}")
    path = Path(slot_path)
    if _is_v1(path):
        _set_limit_v1(path, limit_bytes)
    elif (path / "memory.max").exists():
        _set_limit_v2(path, limit_bytes)
    else:
        raise GuardError(f"{slot_path} is not a memory cgroup")


def slot_peak_bytes(slot_path: str) -> int | None:
    """Worker side: this job's peak charge, read before the next job resets it."""
    if not slot_path:
        return None
    path = Path(slot_path)
    return CgroupSlot(path, _is_v1(path)).peak_bytes()


def slot_usage_bytes(slot_path: str) -> int | None:
    """Worker side: the slot's charge now (one pread on a kept descriptor, ~2 us)."""
    if not slot_path:
        return None
    name = "memory.usage_in_bytes" if _is_v1(Path(slot_path)) else "memory.current"
    return _read_int(f"{slot_path}/{name}")


def slot_held_bytes(slot_path: str) -> int | None:
    """Worker side: the slot's charge less its file page cache, which the kernel reclaims
    before it would kill anything: what a job's ceiling really competes with (processes'
    own memory, and files in tmpfs, which count as shared memory and stay charged to the
    slot after the job). Reads memory.stat (~16 us with the usage read)."""
    charge = slot_charge(slot_path)
    return None if charge is None else max(0, charge[0] - charge[1])


def slot_charge(slot_path: str) -> tuple[int, int] | None:
    """Worker side: (the slot's charge, of which file page cache), as slot_held_bytes."""
    usage = slot_usage_bytes(slot_path)
    if usage is None:
        return None
    cache = 0
    for line in _read_text(f"{slot_path}/memory.stat").splitlines():
        name, _, value = line.partition(" ")
        if name in ("active_file", "inactive_file"):
            cache += int(value)
    return usage, min(cache, usage)


def slot_anon_bytes(slot_path: str) -> int | None:
    """Worker side: the slot's anonymous memory (processes' heaps; not tmpfs, not kernel
    memory): what a dead worker's jobs cannot have left it, as it went with them."""
    if not slot_path:
        return None
    key = "rss" if _is_v1(Path(slot_path)) else "anon"
    for line in _read_text(f"{slot_path}/memory.stat").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


def slot_limit_hits(slot_path: str) -> int | None:
    """Worker side, v1: how often the slot's charge met its ceiling since the job started
    (``memory.failcnt``, reset with the peak; each hit reclaims page cache first)."""
    if not slot_path or not _is_v1(Path(slot_path)):
        return None
    try:
        return _read_int(f"{slot_path}/memory.failcnt")
    except (OSError, ValueError):  # (unknown: it only refines a record; not the job's fault)
        return None


def ceiling_lifted(slot_path: str, limit_bytes: int) -> bool:
    """Worker side, after a job: whether the slot's ceiling is no longer ``limit_bytes``.

    A job running as root can write its own cgroup's files (``-1``: no limit). One or two
    preads on kept descriptors (~2 us in all), against 5-7 ms for rewriting the limit
    before every job."""
    return any(_read_int(f) != limit_bytes for f in _limit_files(slot_path))


def _controller_cgroup(proc_cgroup: str, controller: str) -> str:
    """A controller's path in a /proc/PID/cgroup text (its v1 line, else v2's)."""
    for line in proc_cgroup.splitlines():
        _, controllers, cg_path = line.split(":", 2)
        if controller in controllers.split(",") or controllers == "":
            return cg_path
    return "\0"  # never a suffix of a real path


def _memory_cgroup(proc_cgroup: str) -> str:
    """The memory controller's path in a /proc/PID/cgroup text (v1 line, else v2's)."""
    return _controller_cgroup(proc_cgroup, "memory")


def own_memory_cgroup() -> str:
    """Worker side: this process's memory cgroup as /proc shows it, to compare with what it
    showed once the runner adopted it into its slot (not with the slot's path: inside a
    container the two differ by the mount's root).

    A job running as root can move its worker into another cgroup (write our pid to that
    cgroup's ``cgroup.procs``): its ceiling and its peak would no longer apply, to it or to
    any later job of this worker. One pread on a kept descriptor (~5-13 us); named by pid,
    not /proc/self, because kept descriptors are inherited by a fork."""
    return _memory_cgroup(_read_text(f"/proc/{os.getpid()}/cgroup"))


def peak_is_per_job(slot_path: str) -> bool:
    """Whether ``slot_peak_bytes`` is the last job's own peak (v1) or the slot's (v2)."""
    return bool(slot_path) and _is_v1(Path(slot_path))


@functools.lru_cache(maxsize=64)
def _limit_files(slot_path: str) -> tuple[str, ...]:
    """The files holding a slot's ceiling (none for sampling), by str: asked once per job."""
    if not slot_path:
        return ()
    if not _is_v1(Path(slot_path)):
        return (f"{slot_path}/memory.max",)
    memsw = f"{slot_path}/memory.memsw.limit_in_bytes"
    return (f"{slot_path}/memory.limit_in_bytes",) + ((memsw,) if os.path.exists(memsw) else ())


def reset_job_peak(slot_path: str) -> None:
    """Worker side, between jobs with the same ceiling: reset only the peak counters.

    Rewriting ``memory.limit_in_bytes`` costs 5-7 ms here even when unchanged (the kernel
    drains every CPU's charge cache on a resize), which is more than a whole small render.
    Raises an ``OSError`` naming the counter file that could not be written."""
    if not slot_path:
        return
    path = Path(slot_path)
    if not _is_v1(path):
        return  # v2: memory.peak cannot be reset; the runner reads the slot's lifetime peak
    _reset_peak_v1(path)


def _reset_peak_v1(path: Path) -> None:
    for name in ("memory.max_usage_in_bytes", "memory.failcnt"):
        _reset_counter(path / name)


def _set_limit_v1(path: Path, limit_bytes: int) -> None:
    mem = path / "memory.limit_in_bytes"
    memsw = path / "memory.memsw.limit_in_bytes"
    # memsw (memory + swap) must stay >= the memory limit at every step, else EINVAL:
    # lower memory first, raise memsw first. Equal limits leave no room to escape into swap.
    files = [mem]
    if memsw.exists():
        files = [mem, memsw] if limit_bytes < _read_int(mem) else [memsw, mem]
    for f in files:
        try:
            _write(f, str(limit_bytes))
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            raise LimitBelowUsage(
                slot_path=str(path),
                limit_bytes=limit_bytes,
                usage_bytes=_read_int(path / "memory.usage_in_bytes"),
            ) from e
    _reset_peak_v1(path)
    for name in ("memory.memsw.max_usage_in_bytes", "memory.memsw.failcnt"):
        with contextlib.suppress(FileNotFoundError):
            _write(path / name, "0")


def _set_limit_v2(path: Path, limit_bytes: int) -> None:
    # v2 never answers EBUSY: it reclaims and then OOM-kills inside the group, which would
    # be the worker asking. Refuse first instead (usage can still grow between the two).
    usage = _read_int(path / "memory.current")
    if usage > limit_bytes:
        raise LimitBelowUsage(slot_path=str(path), limit_bytes=limit_bytes, usage_bytes=usage)
    with contextlib.suppress(FileNotFoundError):
        _write(path / "memory.swap.max", "0")
    _write(path / "memory.max", str(limit_bytes))


# -- cgroup slots ------------------------------------------------------------------------


def _signal_members(procs_file: Path, sig: int, controller: str = "memory") -> list[int]:
    """Signal every task listed in a cgroup (of ``controller``'s v1 hierarchy, or v2's)
    without a pid-reuse race; return the pids."""
    pids = [int(p) for p in procs_file.read_text().split()]
    cgroup_dir = str(procs_file.parent)
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            # With the pidfd held the pid cannot be recycled; re-check membership, then
            # signal through the pidfd so the signal reaches exactly that process.
            if cgroup_dir.endswith(_cgroup_of(pid, controller)):
                signal.pidfd_send_signal(pidfd, sig)
        except (ProcessLookupError, FileNotFoundError):
            pass
        finally:
            os.close(pidfd)
    return pids


def _cgroup_of(pid: int, controller: str = "memory") -> str:
    return _controller_cgroup(Path(f"/proc/{pid}/cgroup").read_text(), controller)


def _wait_pids_gone(pids: list[int], deadline: float) -> None:
    fds: list[int] = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        pending = list(fds)
        while pending and time.monotonic() < deadline:
            ready, _, _ = select.select(pending, [], [], max(0.0, deadline - time.monotonic()))
            pending = [fd for fd in pending if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def _remove_cgroup(path: Path, *, timeout_s: float = 5.0, controller: str = "memory") -> None:
    """SIGKILL whatever is left in ``path``, wait for it, and remove the directory."""
    deadline = time.monotonic() + timeout_s
    _forget_kept(f"{path}/")
    while True:
        try:
            pids = _signal_members(path / "cgroup.procs", signal.SIGKILL, controller)
        except OSError as e:
            # Removed meanwhile, by another runner's start-up cleaning the same dead
            # runner's folders: ENOENT, or ENODEV when it went between open and read.
            if e.errno in (errno.ENOENT, errno.ENODEV):
                return
            raise
        if pids:
            _wait_pids_gone(pids, min(deadline, time.monotonic() + 0.5))
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            # EBUSY while a killed task is still tearing down its address space.
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                raise GuardError(f"cannot remove cgroup {path}: {e}") from e


@dataclass(frozen=True)
class CgroupSlot:
    """A slot backed by one memory cgroup (v1 or v2), and on v1 a pids cgroup beside it
    (``pids_dir``; on v2 ``pids.max`` is in ``dir`` itself, when the controller is there)."""

    dir: Path
    v1: bool
    pids_dir: Path | None = None

    @property
    def path(self) -> str:
        """The slot's cgroup directory, handed to the worker for ``set_job_limit``."""
        return str(self.dir)

    def adopt(self, pid: int) -> None:
        """Move ``pid`` (all its threads) into this slot; raises ProcessLookupError if gone."""
        if self.pids_dir is not None:
            # First, so that nothing it forks meanwhile is outside the task limit; a
            # failure costs only that limit (the memory ceiling is what a slot is for).
            with contextlib.suppress(OSError):
                _write(self.pids_dir / "cgroup.procs", str(pid))
        _write(self.dir / "cgroup.procs", str(pid))

    def mark(self) -> OomMark:
        """Snapshot the OOM counters; compare with ``oom_killed_since`` after the job."""
        if self.v1:
            # Read once or twice per job on the runner's thread: str paths and kept fds, and
            # failcnt only where the kernel has no oom_kill counter (it is the fallback).
            d = str(self.dir)
            kills = _read_keyed(f"{d}/memory.oom_control", "oom_kill")
            return OomMark(kills, 0 if kills is not None else _read_int(f"{d}/memory.failcnt"))
        events = self.dir / "memory.events.local"
        if not events.exists():
            events = self.dir / "memory.events"
        return OomMark(_read_keyed(events, "oom_kill"), _read_keyed(events, "max") or 0,
                       _read_keyed(events, "oom"))

    def oom_killed_since(self, mark: OomMark) -> bool:
        """Whether the kernel OOM-killed a task in this slot after ``mark`` was taken."""
        now = self.mark()
        if now.oom_kills is not None and mark.oom_kills is not None:
            return now.oom_kills > mark.oom_kills
        # Old kernels: the limit was hit at least once; combined with a SIGKILL death that
        # nobody sent, this is the best evidence there is.
        return now.failcnt > mark.failcnt

    def ceiling_reached_since(self, mark: OomMark) -> bool:
        """Whether what ran out, for an OOM kill seen in this slot since ``mark``, was the
        slot's own ceiling, not the memory of a cgroup above it (a container's limit, the
        one renderctl was started in) or of the machine: the kernel counts the victim's
        kill in the slot either way (audit FI: jobs of 1 MB dead-lettered as having
        crossed their 200 MB ceilings, under a runner in an 80 MB cgroup).

        v2: the slot's own ``oom`` events (OOMs its memory.max caused; ``max`` counts a
        reclaim of page cache at the ceiling too). v1 keeps no such count (failcnt stays 0
        where memsw is limited too, as here, kernel 6.18): the job's peak (reset at its
        start) against the ceiling, which a kill there reaches to within a charge batch.
        So on v1 a job whose page cache filled its slot to the ceiling, killed for an
        enclosing limit, is still said to have crossed its ceiling (review FJ)."""
        if not self.v1:
            now = self.mark()
            if now.own_ooms is not None and mark.own_ooms is not None:
                return now.own_ooms > mark.own_ooms
            return now.failcnt > mark.failcnt
        d = str(self.dir)
        try:
            peak = _read_int(f"{d}/memory.max_usage_in_bytes")
            limit = _read_int(f"{d}/memory.limit_in_bytes")
        except (OSError, ValueError):
            return True  # (unknown: the ceiling, as before)
        return peak >= limit - CEILING_SLACK_BYTES

    def peak_bytes(self) -> int | None:
        """The highest charge since the worker last called ``set_job_limit`` (v2: ever)."""
        name = "memory.max_usage_in_bytes" if self.v1 else "memory.peak"
        try:
            return _read_int(self.dir / name)
        except FileNotFoundError:
            return None

    def usage_bytes(self) -> int | None:
        """The slot's current charge."""
        return _read_int(self.dir / ("memory.usage_in_bytes" if self.v1 else "memory.current"))

    def held_bytes(self) -> int | None:
        """The charge a job's ceiling competes with (see ``slot_held_bytes``)."""
        return slot_held_bytes(self.path)

    def pids(self) -> list[int]:
        """Pids of the processes in this slot."""
        return [int(p) for p in (self.dir / "cgroup.procs").read_text().split()]

    def release_limit(self) -> None:
        """Lift the last job's ceiling before a new worker starts in this slot: a worker
        starting under a tiny ceiling (a 5 MB job's) dies before it is ready."""
        if self.v1:
            # memsw must stay >= memory at every step: raise it first.
            for name in ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes"):
                with contextlib.suppress(FileNotFoundError):
                    _write(self.dir / name, "-1")
        else:
            _write(self.dir / "memory.max", "max")

    def close(self) -> None:
        """Kill whatever is still in the slot and remove its cgroup (and pids cgroup)."""
        _remove_cgroup(self.dir)
        if self.pids_dir is not None:
            _remove_cgroup(self.pids_dir, controller="pids")


@dataclass(frozen=True)
class CgroupGuard:
    """Ceilings enforced by the kernel: one cgroup per slot under ``renderctl-<runner pid>``."""

    own_dir: Path  # the cgroup this process was started in
    v1: bool
    runner_pid: int = field(default_factory=os.getpid)
    # v1: this process's cgroup in the pids hierarchy, if writable (None: no task limit)
    own_pids_dir: Path | None = None
    pids_max: int = PIDS_MAX_PER_SLOT

    @property
    def name(self) -> GuardName:
        """``cgroup-v1`` or ``cgroup-v2``."""
        return "cgroup-v1" if self.v1 else "cgroup-v2"

    @property
    def parent_dir(self) -> Path:
        """This runner's parent cgroup, holding its slots."""
        return self.own_dir / f"renderctl-{self.runner_pid}"

    @property
    def pids_parent_dir(self) -> Path | None:
        """v1: this runner's parent cgroup in the pids hierarchy."""
        return None if self.own_pids_dir is None \
            else self.own_pids_dir / f"renderctl-{self.runner_pid}"

    def open_slot(self, slot_name: str) -> CgroupSlot:
        """Create (or reuse) the slot cgroup ``slot_name`` under this runner's parent."""
        if not _SLOT_NAME.fullmatch(slot_name):
            raise ValueError(f"bad slot name {slot_name!r}")
        self.parent_dir.mkdir(exist_ok=True)
        if not self.v1:
            _write(self.parent_dir / "cgroup.subtree_control", "+memory")
            with contextlib.suppress(OSError):  # the task limit, where the controller is
                for d in (self.own_dir, self.parent_dir):
                    _write(d / "cgroup.subtree_control", "+pids")
        slot_dir = self.parent_dir / slot_name
        slot_dir.mkdir(exist_ok=True)
        pids_dir = None
        if not self.v1:
            # v2 can kill the whole slot at once; v1 kills one task (see module docstring).
            _write(slot_dir / "memory.oom.group", "1")
            with contextlib.suppress(OSError):
                _write(slot_dir / "pids.max", str(self.pids_max))
        elif (parent := self.pids_parent_dir) is not None:
            try:
                parent.mkdir(exist_ok=True)
                pids_dir = parent / slot_name
                pids_dir.mkdir(exist_ok=True)
                _write(pids_dir / "pids.max", str(self.pids_max))
            except OSError:
                pids_dir = None  # no task limit; the memory ceiling still holds
        return CgroupSlot(slot_dir, self.v1, pids_dir)

    def close(self) -> None:
        """Kill and remove every slot of this runner, then its parent cgroup."""
        _remove_runner_dir(self.parent_dir)
        if (pids_parent := self.pids_parent_dir) is not None:
            with contextlib.suppress(GuardError, OSError):
                _remove_runner_dir(pids_parent, controller="pids")

    def cleanup_stale(self) -> list[str]:
        """Remove ``renderctl-<pid>`` cgroups of runners that no longer exist; return them."""
        removed: list[str] = []
        for own, controller in ((self.own_dir, "memory"), (self.own_pids_dir, "pids")):
            if own is None:
                continue
            for entry in own.iterdir():
                m = _RUNNER_DIR.fullmatch(entry.name)
                if not m or not entry.is_dir() or int(m.group(1)) == self.runner_pid:
                    continue
                # A live pid may be a recycled one; leaving its dir is the safe mistake.
                if psutil.pid_exists(int(m.group(1))):
                    continue
                _remove_runner_dir(entry, controller=controller)
                removed.append(str(entry))
        return removed


def _remove_runner_dir(parent: Path, *, controller: str = "memory") -> None:
    try:
        slots = [slot for slot in parent.iterdir() if slot.is_dir()]
    except FileNotFoundError:
        return  # gone already (another runner's start-up removed it)
    for slot in slots:
        _remove_cgroup(slot, controller=controller)
    _remove_cgroup(parent, controller=controller)


# -- sampling ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingSlot:
    """The no-op slot of the sampling guard: the runner watches the tree with TreeSampler."""

    name: str

    @property
    def path(self) -> str:
        """Empty: ``set_job_limit`` treats it as "nothing to set"."""
        return ""

    def adopt(self, pid: int) -> None:
        """Nothing to do: sampling follows the worker's process tree instead."""

    def mark(self) -> OomMark:
        """No kernel counters; the runner knows when it killed for memory."""
        return OomMark(None, 0)

    def oom_killed_since(self, mark: OomMark) -> bool:
        """Always False: with sampling, memory kills are the runner's own decision."""
        return False

    def ceiling_reached_since(self, mark: OomMark) -> bool:
        """Never asked (no kernel kill is seen here)."""
        return True

    def peak_bytes(self) -> int | None:
        """Unknown here; read ``TreeSampler.peak_bytes``."""
        return None

    def usage_bytes(self) -> int | None:
        """Unknown here; read ``TreeSampler.sample()``."""
        return None

    def held_bytes(self) -> int | None:
        """Unknown: nothing is charged to a sampling slot."""
        return None

    def pids(self) -> list[int]:
        """Unknown here; the runner knows its workers."""
        return []

    def release_limit(self) -> None:
        """No limit to lift."""

    def close(self) -> None:
        """Nothing to remove."""


@dataclass(frozen=True)
class SamplingGuard:
    """Fallback: the runner samples each job tree every ``interval_s`` and kills it itself."""

    interval_s: float = 0.05

    @property
    def name(self) -> GuardName:
        """``sampling``."""
        return "sampling"

    def open_slot(self, slot_name: str) -> SamplingSlot:
        """A no-op slot."""
        return SamplingSlot(slot_name)

    def close(self) -> None:
        """Nothing to remove."""

    def cleanup_stale(self) -> list[str]:
        """Nothing is ever left behind."""
        return []


@dataclass(frozen=True)
class Sample:
    """One reading of a job tree: summed RSS, summed USS when RSS crossed the ceiling."""

    rss_bytes: int
    uss_bytes: int | None
    exceeded: bool
    processes: int


class TreeSampler:
    """Samples the memory of a process, its descendants and its process group."""

    def __init__(self, pid: int, limit_bytes: int, *, full_scan_every: int = 10) -> None:
        self.pid = pid
        self.limit_bytes = limit_bytes
        self.full_scan_every = full_scan_every
        self.peak_bytes = 0  # RSS while under the ceiling, USS above it (see sample())
        self.peak_rss_bytes = 0
        self._samples = 0
        self._procs: dict[int, psutil.Process] = {}
        self._pgid = os.getpgid(pid)

    def known_processes(self) -> list[psutil.Process]:
        """Processes of the tree seen by the last samples (pid-reuse safe psutil handles)."""
        return list(self._procs.values())

    def _full_scan(self) -> set[int]:
        """Descendants of the root and members of its group, from one pass over /proc."""
        parent_of: dict[int, int] = {}
        members: set[int] = {self.pid}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                data = Path(entry.path, "stat").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            fields = data[data.rindex(b")") + 2 :].split()
            pid = int(entry.name)
            parent_of[pid] = int(fields[1])
            if int(fields[2]) == self._pgid:
                members.add(pid)
        for pid in parent_of:
            p = pid
            while p in parent_of and p not in members and p > 1:
                p = parent_of[p]
            if p in members:
                members.add(pid)
        return members

    def _children_of_tracked(self) -> set[int]:
        """New children via /proc/PID/task/PID/children: one small read per tracked process."""
        found: set[int] = set()
        for pid in list(self._procs):
            try:
                text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
                found.update(int(c) for c in text.split())
            except (FileNotFoundError, ProcessLookupError):
                continue
        return found

    def _track(self, pids: set[int]) -> None:
        for pid in pids - self._procs.keys():
            with contextlib.suppress(psutil.Error):
                self._procs[pid] = psutil.Process(pid)

    def sample(self) -> Sample:
        """Read the tree's RSS; read USS only when RSS crosses the ceiling (USS is ~100x dearer)."""
        if self._samples % self.full_scan_every == 0:
            self._track(self._full_scan())
        else:
            self._track(self._children_of_tracked())
        self._samples += 1
        rss = self._sum(lambda p: p.memory_info().rss)
        uss: int | None = None
        if rss > self.limit_bytes:
            # Forked workers share pages with their parent: RSS over-counts. Confirm before
            # anyone kills. Pick up children a full scan would have found first.
            self._track(self._full_scan())
            uss = self._sum(lambda p: p.memory_full_info().uss)
        seen = rss if uss is None else uss
        self.peak_bytes = max(self.peak_bytes, seen)
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        exceeded = uss is not None and uss > self.limit_bytes
        return Sample(rss, uss, exceeded, len(self._procs))

    def _sum(self, read: Callable[[psutil.Process], int]) -> int:
        total = 0
        for pid, proc in list(self._procs.items()):
            try:
                total += read(proc)
            except psutil.Error:
                del self._procs[pid]
        return total


# -- choosing a guard --------------------------------------------------------------------


def _mount_point(fstype: str, option: str | None) -> tuple[Path, str] | None:
    """Mount point and mount root of a cgroup filesystem, from /proc/self/mountinfo: the
    first whose root our cgroup namespace can name (not "/.."), else the first. After
    `unshare --cgroup --mount` and a fresh mount of the hierarchy, the copied host's
    mount (root "/../..") is listed first, the namespace's own after it: the first match
    cost the guard and the container's budget (review FL). Not the last: a bind mount of
    some cgroup elsewhere, listed later, was taken for the hierarchy (review FM: slots
    made in that cgroup, the budget its limit)."""
    found: list[tuple[Path, str]] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if rparts[0] != fstype:
            continue
        if option is None or option in rparts[2].split(","):
            found.append((Path(parts[4]), parts[3]))
    named = [m for m in found if not _above_namespace(m[1])]
    return (named or found)[0] if found else None


def _above_namespace(mount_root: str) -> bool:
    """Whether a cgroup mount's root lies above our cgroup namespace's root (a namespace
    made after the mount): our cgroup, "/" as the namespace shows it, is then below the
    mount's root by names the namespace does not show."""
    return mount_root == "/.." or mount_root.startswith("/../")


def _own_cgroup_dir(v1: bool, controller: str = "memory") -> Path | None:
    mount = _mount_point("cgroup", controller) if v1 else _mount_point("cgroup2", None)
    if mount is None:
        return None
    mount_point, mount_root = mount
    if _above_namespace(mount_root):
        # A cgroup namespace made after this mount (`unshare --cgroup`; a container whose
        # runtime kept the host's cgroup mount): our cgroup, "/" as the namespace shows
        # it, lies below the mount's root by names it does not show, and relpath() took
        # the hierarchy's root for it: slots made there escaped the container's limits,
        # and two such containers shared one slot (audit FK). Not ours to find: no cgroup.
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, cg_path = line.split(":", 2)
        if (v1 and controller in controllers.split(",")) or (not v1 and controllers == ""):
            rel = os.path.relpath(cg_path, mount_root) if mount_root != "/" else cg_path
            return mount_point / rel.lstrip("/").removeprefix(".")
    return None


def enclosing_memory_room() -> int | None:
    """Bytes the memory cgroups renderctl runs in (its own and those above it: a
    container's limit, a systemd slice's MemoryMax) leave before one of their limits is
    reached, counting the reclaimable page cache as room; None if no limit is set. The
    machine's free memory is no guide there: the kernel's OOM killer acts at such a
    limit (audit FI: a runner in an 80 MB cgroup took 80% of the host's free memory as
    its budget)."""
    rooms: list[int] = []
    for v1, d in _enclosing_dirs("memory"):
        files = (("memory.limit_in_bytes", "memory.usage_in_bytes",
                  ("total_inactive_file", "total_active_file")) if v1
                 else ("memory.max", "memory.current", ("inactive_file", "active_file")))
        with contextlib.suppress(OSError, ValueError):
            limit = _read_int(d / files[0])
            if limit < 2**62:  # (v1 writes "no limit" as 2**63 less a page)
                used = _read_int(d / files[1])
                cache = 0
                for line in (d / "memory.stat").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key in files[2]:  # (file pages: reclaimable; shmem is not)
                        cache += int(value)
                rooms.append(max(0, limit - used + min(cache, used)))
    return min(rooms) if rooms else None


def _enclosing_dirs(controller: str) -> Iterator[tuple[bool, Path]]:
    """(v1?, folder) of this process's cgroup for ``controller`` and each above it up to
    its hierarchy's mount, in v1 and in v2, where we can find our own."""
    for v1 in (True, False):
        mount = _mount_point("cgroup", controller) if v1 else _mount_point("cgroup2", None)
        own = _own_cgroup_dir(v1, controller) if mount is not None else None
        if mount is None or own is None:
            continue
        d = own
        while True:
            yield v1, d
            if d == mount[0] or d.parent == d:
                break
            d = d.parent


def full_pids_cgroup() -> str | None:
    """The pids cgroup, this process's own or one above it, that has (nearly) reached its
    pids.max, said as "cgroup DIR: pids.current N of pids.max M"; None if none has. The
    likely cause of a fork's EAGAIN, named where one is met: a bare "Resource temporarily
    unavailable" was all a run said of a container's pids limit (audit FI)."""
    for _, d in _enclosing_dirs("pids"):
        with contextlib.suppress(OSError, ValueError):
            limit = _read_int(d / "pids.max")
            current = _read_int(d / "pids.current")
            if limit < 2**62 and current + 2 >= limit:
                return f"cgroup {d}: pids.current {current} of pids.max {limit}"
    return None


def _probe(own: Path, v1: bool) -> bool:
    """Prove the hierarchy is writable: create a child group, check its files, remove it."""
    probe = own / f"renderctl-probe-{os.getpid()}"
    try:
        if not v1:
            if "memory" not in _controllers(own):
                return False
            _write(own / "cgroup.subtree_control", "+memory")
        probe.mkdir(exist_ok=True)
        try:
            limit_file = "memory.limit_in_bytes" if v1 else "memory.max"
            return (probe / limit_file).exists()
        finally:
            probe.rmdir()
    except OSError:
        return False


def available_memory_guard() -> GuardName:
    """The guard a runner would pick here, judged without creating anything (for `status`,
    a read-only command: ``detect_memory_guard`` proves it by making a probe cgroup)."""
    for v1, name in ((False, "cgroup-v2"), (True, "cgroup-v1")):
        own = _own_cgroup_dir(v1)
        if own is None or not os.access(own, os.W_OK):
            continue
        if v1 or "memory" in _controllers(own):
            return name  # type: ignore[return-value]
    return "sampling"


def _usable_cgroup(v1: bool) -> Path | None:
    """This process's own cgroup of that version, if a runner could make slots below it."""
    own = _own_cgroup_dir(v1)
    return own if own is not None and _probe(own, v1) else None


def _unavailable(name: str) -> GuardUnavailable:
    v1 = name == "cgroup-v1"
    mounted = (_mount_point("cgroup", "memory") if v1 else _mount_point("cgroup2", None))
    # (Said as "its memory controller is not writable" of a v2 guard on a host whose memory
    # controller is v1's, which sent a user to check permissions: audit FV.)
    if mounted is None:
        why = f"no cgroup {'v1 memory' if v1 else 'v2'} hierarchy is mounted"
    elif not v1 and "memory" not in _controllers(mounted[0]):
        why = "the cgroup v2 hierarchy has no memory controller here" + (
            ": it is v1's, --memory-guard cgroup-v1" if _usable_cgroup(True) is not None
            else "")  # (not a pointer to a guard that fails too: review FZ)
    elif os.geteuid() != 0:
        why = ("its memory controller is not writable: run as root, or in a cgroup "
               "delegated to this user")
    else:
        why = "its memory controller is not writable"
    return GuardUnavailable(f"{name} is not usable here ({why}); auto picks the strongest "
                            "guard that is")


def _controllers(root: Path) -> list[str]:
    try:
        return (root / "cgroup.controllers").read_text().split()
    except OSError:
        return []


def require_memory_guard(prefer: str) -> None:
    """Raise ``GuardUnavailable`` if ``prefer`` names a cgroup guard that cannot work here.

    The CLI asks before it enqueues anything: the runner only finds out after a `run`'s
    manifests are in the queue, and a command that fails must leave the queue as it was.
    """
    if prefer in ("cgroup-v1", "cgroup-v2") and _usable_cgroup(prefer == "cgroup-v1") is None:
        raise _unavailable(prefer)


def _own_pids_dir() -> Path | None:
    """v1: this process's cgroup in the pids hierarchy, if a runner can make groups there."""
    own = _own_cgroup_dir(True, "pids")
    return own if own is not None and os.access(own, os.W_OK) else None


def detect_memory_guard(
    *, prefer: str = "auto", runner_pid: int | None = None, sampling_interval_s: float = 0.05,
    pids_max: int = PIDS_MAX_PER_SLOT,
) -> MemoryGuard:
    """The strongest usable guard: cgroup v2, then cgroup v1, then sampling. A cgroup guard
    also caps each slot's tasks at ``pids_max`` where the pids controller is writable."""
    if prefer not in ("auto", "cgroup-v1", "cgroup-v2", "sampling"):
        raise ValueError(f"unknown memory guard {prefer!r}")
    pid = os.getpid() if runner_pid is None else runner_pid
    for v1, name in ((False, "cgroup-v2"), (True, "cgroup-v1")):
        if prefer not in ("auto", name):
            continue
        own = _usable_cgroup(v1)
        if own is not None:
            return CgroupGuard(own, v1, pid, _own_pids_dir() if v1 else None, pids_max)
        if prefer == name:
            raise _unavailable(name)
    return SamplingGuard(sampling_interval_s)
