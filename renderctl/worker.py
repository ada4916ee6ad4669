"""The worker process: runs one attempt at a time, in a clean context, and reports back.

A worker is its own process group and a child subreaper (so whatever a job starts, even a
``setsid`` daemon, stays in its tree and is killed and reaped after the job), dies with its
parent (PR_SET_PDEATHSIG, taking that tree with it), and never touches queue folders: it
writes the job's output to the temporary path it was given, checks it, and says so. The
runner publishes. A worker retires (answering ``Dropped`` with why) when a job broke its
descriptors, left a thread or an unkillable process, or left its slot above the next
job's ceiling; the runner starts a fresh one.

Clean context per job: a fresh working directory (also ``TMPDIR``), the environment the
worker started with plus ``RENDERCTL_JOB_ID``/``RENDERCTL_ATTEMPT``, default signal
handlers, reportlab/pypdf settings reset, stdout/stderr captured to files, and every module
the job imported from outside the standard library and site-packages (the user's own code)
dropped afterwards, so the next job imports it afresh with fresh globals; the rest of the
process-wide state a job can change is put back by ``cleanslate.Baseline``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import hashlib
import importlib.abc
import importlib.machinery
import inspect
import io
import operator
import os
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, NoReturn

from renderctl import mpstate
from renderctl.cleanslate import Baseline, threads_left
from renderctl.crashpoints import CrashPoints
from renderctl.errors import (
    ExitCode,
    InvalidInput,
    InvalidOutput,
    displayable,
    os_error_message,
    text_lines,
)
from renderctl.fsutil import makedirs, remove_tree, with_name
from renderctl.gate import StartGate
from renderctl.guards import (
    GuardError,
    LimitBelowUsage,
    ceiling_lifted,
    full_pids_cgroup,
    kept_fds,
    own_memory_cgroup,
    peak_is_per_job,
    reset_job_peak,
    set_job_limit,
    slot_anon_bytes,
    slot_charge,
    slot_limit_hits,
    slot_peak_bytes,
    slot_usage_bytes,
)
from renderctl.lifecycle import (
    CANCEL_REQUEST_PREFIX,
    EXPIRED_REASON,
    LEASE_XATTR,
    Outcome,
    lease_xattr_fields,
)
from renderctl.localecoercion import undo_locale_coercion
from renderctl.messages import (
    Broken,
    Drain,
    DropKind,
    Dropped,
    Finished,
    Ready,
    RunJob,
    Skip,
    Started,
    Stop,
)
from renderctl.publish import (
    DIR_MARKER,
    OutputEscapes,
    discard_sidecars,
    others_can_write,
    output_folder,
    output_folder_problem,
    says_full,
    staging_name,
    tag_output,
)
from renderctl.reaper import close_inherited
from renderctl.render.registry import BUILTIN_KINDS

TAIL_LINES = 20
# A command job's stderr, and its stdout, each in a file of its own in its working folder:
# merged, the last line shown as its error was its stdout's ("Processed 3 pages" after the
# error it gave on stderr), and a tool writing its PDF to stdout filled the tail (audit CB).
TAIL_BYTES = 4096
ERROR_CHARS = 4096  # an exception's message as recorded: its start and end beyond this
MB = 1024 * 1024
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# How long a job's leftover processes may take to die after SIGKILL (one holding 1 GiB is
# reaped ~0.1 s after it); past that the worker retires rather than run the next job beside
# them.
LEFTOVER_BOUND_S = 2.0
# What a worker's slot may come to hold beyond what it held before its first job, once a
# job has ended, before the worker retires for it: memory a job left behind (a C extension's
# leak, a module-level cache, a file in /dev/shm) would count against every later job's
# ceiling there, and kill an innocent one. Importing reportlab and pypdf, which stay loaded,
# costs ~35 MB; the rest is headroom for the allocator's own retention.
LEFTOVER_ALLOWANCE_BYTES = 64 << 20
# Descriptors a python job may leave open in its worker beyond those the worker started with
# (a library's cached file). Past that the job's are closed and the worker retires: at the
# process's limit its own bookkeeping after the job (its working folder, the leftover check,
# the output check) failed with EMFILE, reported as an I/O error that stopped the run.
FD_ALLOWANCE = 256
# What a job's captured stdout and stderr may take on disk: checked every CAPTURE_CHECK_S
# while it runs, and past the bound all but the last CAPTURE_KEEP_BYTES are punched out of
# the file (its size and the job's write offset stay). A chatty job stuck in a loop wrote
# ~1 GB/s there until its timeout, filling the disk its neighbours and the queue write to.
CAPTURE_BOUND_BYTES = 64 << 20
CAPTURE_KEEP_BYTES = 1 << 20
CAPTURE_CHECK_S = 0.5
# Pauses before the second and third try at setting a job's ceiling on the worker's slot,
# when cgroupfs refused a read or write of it (EIO, the cgroup gone): a fault that passes
# costs a moment and nothing else; one that stays makes the worker Broken (the run stops,
# 74, the job uncharged), never a job run without its ceiling, nor a worker dying with a
# traceback for the runner to replace, worker after worker, for good.
LIMIT_RETRY_S = (0.1, 0.5)
# Tests only: each of those pauses this many seconds instead (a test that makes the fault
# pass during a pause needs one wider than its own scheduling on a loaded machine).
LIMIT_RETRY_ENV = "RENDERCTL_TEST_LIMIT_RETRY_S"


def _limit_retry_pauses() -> tuple[float, ...]:
    try:
        wide = float(os.environ.get(LIMIT_RETRY_ENV, ""))
    except ValueError:
        return LIMIT_RETRY_S
    return (wide,) * len(LIMIT_RETRY_S)


@dataclass(frozen=True)
class WorkerConfig:
    """What a worker needs to know at start; small and picklable for every start method."""

    slot_path: str  # cgroup of this worker's slot ("" with the sampling guard)
    started_log: str  # append-only evidence of which attempts began (see runner recovery)
    work_root: str  # parent of each job's temporary working directory
    gate_path: str = ""  # its StartGate (renderctl.gate); "" for none
    control_dir: str = ""  # where `cancel` leaves its requests; "" for none
    reaper: tuple[int, int, int] | None = None  # the reaper's pipe (see reaper.close_inherited)
    forked: bool = False  # started by fork from the runner: holds copies of its descriptors
    runner_pid: int = 0  # under forkserver, the runner's pid (see _die_with_group)
    # What its slot held as it was handed over, by the jobs of the worker before (a file in
    # /dev/shm, kernel memory of their files): theirs, not this worker's (see _note_held_base)
    inherited_bytes: int = 0


# -- entry point ---------------------------------------------------------------------------


# Sent by the kernel when our parent (the runner, or the fork server that dies with it)
# exits. Its handler kills our whole process group: a plain SIGKILL would take only this
# process and leave a command's grandchildren running unsupervised.
PARENT_DEATH_SIGNAL = signal.SIGRTMIN + 3
# Put back to SIG_DFL in each worker even where ignored (as inherited): see worker_main.
_RESET_SIGNALS = frozenset({
    signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGCHLD,
    signal.SIGALRM, signal.SIGTSTP, signal.SIGQUIT})


# Under forkserver, the runner's pid (WorkerConfig.runner_pid); 0 until known, and always
# under fork and spawn.
_runner_pid = 0
# This worker's pid, to tell a job's fork that returned into our code (see _call).
_worker_pid = 0
# The test hook's stop and crash points (RENDERCTL_STOP_AT), for what runs outside Worker.
_crash_point: Callable[[str], None] | None = None
ADOPTED_REASON = "its fork server died; retiring"


def _parent_is_runner() -> bool:
    """Whether we, a fork server's child, have the runner for parent: our server died (for
    good: a parent never changes back)."""
    return bool(_runner_pid) and os.getppid() == _runner_pid


def _die_with_group(signum: int, frame: object) -> None:
    # Under forkserver our parent is the fork server, and a job can kill it (it is a python
    # job's grandparent: os.kill(os.getppid(), 9)). The runner is a child subreaper, so we
    # are then its child, and the kernel sends this signal again when it dies (as it does
    # for each subreaper a process passes to). Our parent's death with the runner as our
    # parent now was the fork server's alone: the job runs on, supervised as before.
    if _parent_is_runner():
        return
    # First what the job left outside our group (setsid() daemons): as a subreaper we are
    # their parent, and must live until they are dead, or they would pass to init.
    with contextlib.suppress(Exception):
        remove_leftovers(_children_of_threads, LEFTOVER_BOUND_S / 2)
    os.killpg(0, signal.SIGKILL)


def worker_main(conn: Connection, config: WorkerConfig) -> None:
    """Process entry point: set up the process, then serve jobs until told to stop."""
    os.setpgid(0, 0)
    # fd 0 is the runner's stdin (a terminal, a pipe feeding a shell loop); multiprocessing
    # gave sys.stdin a /dev/null of its own on another descriptor, and fd 0 was the job's
    # to read all the same (os.read(0), or sys.stdin put back over it: review DO, which
    # read a line meant for the calling shell). A job reads nothing; in a background group
    # a read of the terminal would stop the worker (SIGTTIN).
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        os.dup2(null, 0)
        os.close(null)
    # A worker forked from the runner holds a copy of the reaper's pipe: the reaper would
    # never see EOF (the runner's death) while this worker lives, which is when it matters.
    close_inherited(config.reaper)
    if config.forked:
        _blind_runner_fds(conn.fileno())
    from renderctl import proctree

    # Orphans of a job become ours, so that nothing a job started can outlive it.
    proctree.set_child_subreaper()
    mpstate.drop_inherited_pipes()
    # (A test stops us here, and kills our fork server: we begin as the runner's child.)
    crash_point = CrashPoints.from_env()
    crash_point("worker:born")
    global _crash_point
    _crash_point = crash_point
    global _runner_pid
    _runner_pid = config.runner_pid
    global _worker_pid
    _worker_pid = os.getpid()
    signal.signal(PARENT_DEATH_SIGNAL, _die_with_group)
    try:
        proctree.set_parent_death_signal(PARENT_DEATH_SIGNAL)
    except proctree.ParentGone:
        os._exit(0)
    # The runner shields itself from the OOM killer; a worker must be the one to go.
    proctree.set_oom_score_adj(500)
    # Every job starts with default handlers (Python itself ignores SIGPIPE; the fork server
    # ignores SIGINT, SIGTERM, SIGQUIT and SIGTSTP; nohup, SIGHUP), except the parent-death
    # signal's. And none of the runner's: under fork a worker inherits its handlers (a job
    # sent SIGCONT ran Runner._on_continue_signal on the worker's copy of the runner).
    for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, PARENT_DEATH_SIGNAL}:
        if sig in _RESET_SIGNALS or callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)
    # But SIGPIPE ignored, as every Python program has it (a write to a closed pipe raises
    # BrokenPipeError): at its default, a pool a job left running killed the worker as its
    # processes were killed after the job (its threads wrote to their pipes), and the job,
    # which had completed, was recorded crashed, every attempt (audit CD). A command's
    # program gets it at its default again (Popen's restore_signals).
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    sys.excepthook = sys.__excepthook__  # (the fork server's: see forkserver_init)
    worker = Worker(conn, config, crash_point)
    # What the worker inherited (the fork server's preloaded modules; under fork, the whole
    # runner: every record it held) and its own set-up live as long as it does. Frozen, a
    # collection does not walk them: a job's gc.collect() took ~25-40 ms for them, and
    # under fork wrote to every inherited object's header, copying the runner's pages into
    # the job's memory slot. Objects made from here on (a job's) are collected as ever.
    gc.freeze()
    worker.serve()
    # Not through multiprocessing's exit path: it waits for every non-daemon thread (one a
    # job left running would hold this worker, and the jobs sent to it, forever) and runs
    # the atexit handlers jobs registered. Our results are sent; nothing else is owed.
    os._exit(0)


def _blind_runner_fds(conn_fd: int) -> None:
    """Under fork: point the runner's descriptors this process inherited at /dev/null.

    A job saw the queue folder and runner.lock (flocked: an flock belongs to the open file,
    shared with the runner, so a job's LOCK_UN let a second runner start on a live queue),
    events.jsonl, other workers' sockets and gate files. Replaced, not closed: the numbers
    stay taken, so the runner's objects this process holds copies of never close a
    descriptor of ours that reused one. Pipes are kept: multiprocessing's own (the sentinel,
    the resource tracker) are pipes, and the runner's wake-up pipe is harmless."""
    import stat

    from renderctl.guards import drop_inherited_kept

    drop_inherited_kept()  # the runner's open counter files: ours are opened afresh
    try:
        from multiprocessing import resource_tracker

        tracker = getattr(resource_tracker._resource_tracker, "_fd", None)
    except (ImportError, AttributeError):
        tracker = None
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd <= 2 or fd in (conn_fd, devnull, tracker):
                continue
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    continue
            except OSError:
                continue  # (the listing's own descriptor, closed already)
            os.dup2(devnull, fd, inheritable=False)
    finally:
        os.close(devnull)


class Worker:
    """The worker's loop: a local queue of assigned jobs, served one at a time."""

    def __init__(self, conn: Connection, config: WorkerConfig,
                 crash_point: CrashPoints) -> None:
        self.conn = conn
        self.config = config
        self.queue: deque[RunJob] = deque()
        self.stopping = False
        self.draining = False
        self.outbox: list[object] = []
        self.limit_bytes = 0  # the ceiling currently set on this worker's slot
        # (A worker of a fresh interpreter, the fork server's or spawn's, was coerced anew.)
        undo_locale_coercion()
        self.environ = _Environ(os.environ)
        self.base_path = list(sys.path)
        self.base_modules = set(sys.modules)
        # Which module object each of those names is (in step, for a check at C speed,
        # ~20 us): a job that put its own object under a name already loaded
        # (sys.modules["json"] = fake) had the next job use it (audit BY).
        self.kept_names = list(sys.modules)
        self.kept_modules = [sys.modules[n] for n in self.kept_names]
        self.first_kept = len(self.kept_names)  # those kept since are libraries jobs loaded
        self.preloaded = frozenset(self.kept_names)
        # Top-level packages of the callables (and plugin renderers) run here: the user's
        # code even where installed (site-packages), imported afresh for every job. Kept as
        # libraries, an installed package's module globals reached the next job: DESIGN's
        # own `callable = "mypkg.render:build"` counted its calls across jobs (audit CD).
        self.user_packages: set[str] = set()
        # Of those, the ones found to hold an extension module: libraries after all. Their
        # Python modules imported afresh would hold new classes the extension, which stays
        # loaded (it cannot be imported again), does not know: isinstance failed from the
        # second job on (review CG).
        self.native_packages: set[str] = set()
        # Whether reportlab's and pypdf's settings are as harden() left them: no job that
        # runs someone's code here has run since (our renderers change none of them).
        self.render_settings_clean = False
        self.library_roots = tuple({
            p for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (p := sysconfig.get_paths().get(key))
        })
        # Jobs' own modules are imported afresh for every job; their compiled code need not be.
        sys.meta_path.insert(0, _UserCodeCache(self.library_roots))
        self.baseline = Baseline(self.library_roots)  # puts back what a job changes
        # (A fork handler the user's installed package registers as it is imported again
        # for each job is the job's, not a library's: they piled up, one a job; review CG.)
        self.baseline.user_code = lambda name: name.partition(".")[0] in self.user_packages
        self.neutral_cwd = config.work_root
        # Each job gets its own empty working directory: the previous one, emptied and renamed
        # (a rename costs ~0.02 ms here, a mkdir/rmdir pair ~1 ms of journal work).
        self.jobs_run = 0
        self.workdir = os.path.join(config.work_root, f"w{os.getpid()}.0")
        makedirs(self.workdir, mode=0o700)
        self.capture = _Capture(capture_path(config.work_root, os.getpid()))
        self.started_fd = os.open(config.started_log,
                                  os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.own_fds = _OwnFds()
        # Stop points for tests (RENDERCTL_STOP_AT=worker:checked), inherited from the runner
        self.crash_point = crash_point
        self.own_fds.add(self.capture.fd, "its capture of stdout and stderr")
        self.own_fds.add(self.capture.saved[0], "its saved stdout")
        self.own_fds.add(self.capture.saved[1], "its saved stderr")
        self.own_fds.add(self.started_fd, "its started log")
        self.own_fds.add(conn.fileno(), "its connection to the runner")
        # Kept open: one pread per job lists our children (0.4 us; an open/read/close 5 us),
        # and the task folder's link count (2 + threads) says when other threads need asking.
        pid = os.getpid()
        self.children_fd = os.open(f"/proc/{pid}/task/{pid}/children",
                                   os.O_RDONLY | os.O_CLOEXEC)
        self.tasks_fd = os.open(f"/proc/{pid}/task", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.own_fds.add(self.children_fd, "its list of child processes")
        # Its own resident size (second field, pages), for the sampling guard's leftovers.
        self.statm_fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
        self.own_fds.add(self.statm_fd, "its memory counter")
        self.gate = StartGate(config.gate_path) if config.gate_path else None
        self.control_dir = config.control_dir
        if self.gate is not None:
            self.own_fds.add(self.gate.fd, "its start gate")
        self.own_fds.add(self.tasks_fd, "its list of threads")
        self.retire_reason = ""  # set when this worker must not run another job
        self.retire_kind = DropKind.RETIRE
        self.held_base: int | None = None  # what the slot held before the first job
        self.slot_cgroup = ""  # our memory cgroup once in the slot (see own_memory_cgroup)
        self.slot_procs_fd = -1  # its cgroup.procs, kept open (see _sweep_slot)
        if config.slot_path:
            with contextlib.suppress(OSError):
                self.slot_procs_fd = os.open(os.path.join(config.slot_path, "cgroup.procs"),
                                             os.O_RDONLY | os.O_CLOEXEC)
                self.own_fds.add(self.slot_procs_fd, "its memory slot's member list")
        # What earlier jobs left held here (below the allowance): added to the next job's
        # ceiling, so that a job's fate does not depend on what ran before it.
        self.carried = 0
        # The slot's charge at the last _held(): its page cache, and the rest (held); and
        # its charge as this job's peak was reset (_set_limit): see _discount_cache.
        self.cache_left = 0
        self.held_left = 0
        self.usage_at_start: int | None = None
        # Every descriptor open now is the worker's (or inherited with it): see _reclaim_fds.
        self.base_fds = frozenset(map(int, os.listdir(f"/proc/{pid}/fd")))
        self.fds_held = 0  # beyond the worker's own, by live objects (_collect_lost_files)
        self.late_damage = ""  # what that collection did to the worker's own descriptors

    def serve(self) -> None:
        self._post(Ready(os.getpid(), os.getpgid(0)))
        try:
            while True:
                # Never block once told to stop: the Stop may have arrived with the last job.
                block = not self.queue and not self.stopping
                if block:
                    self._flush()  # a result must not wait for the next job
                self._take_messages(block=block)
                if self.draining:
                    self._drop_all(DropKind.DRAIN)
                    return
                if not self.queue:
                    if self.stopping:
                        return
                    continue
                job = self.queue.popleft()
                if self.cancel_requested(job.job_id):
                    # Before the gate records a start: the runner may not have woken to the
                    # request yet, and the job must not start in the meantime (~2 us).
                    self._send(Dropped((job.seq,), DropKind.CANCELLED,
                                       "cancelled before it started"))
                    continue
                if not self._enter_workdir():
                    # Before the gate records a start: the job goes back uncharged, and a
                    # fresh worker (in a work root the runner checks) runs it.
                    self.queue.appendleft(job)
                    self._drop_all(DropKind.RETIRE, self.retire_reason)
                    return
                if _parent_is_runner():
                    # A job's "parent" (os.getppid(), as in kill -STOP $PPID) is now the
                    # runner itself: no job starts here after the one that was running.
                    # Checked last before the gate records a start, to keep the window in
                    # which a server's death goes unseen short (a job may still be told
                    # the runner for its parent if the server dies as it starts).
                    self.queue.appendleft(job)
                    self._drop_all(DropKind.RETIRE, ADOPTED_REASON)
                    return
                if job.spec.get("kind") != "command" and _renderers_missing():
                    # Before the gate records a start: a renderer that cannot be imported
                    # (a broken Pillow, a partial site-packages) fails every job here alike.
                    # After it, each job was charged and dead-lettered as "worker exited
                    # with status 1", or, under fork and spawn, workers were replaced
                    # forever (audit BL). The environment's fault: the run halts (74).
                    # The last job's result goes first: held through the import (0.15-0.2
                    # s), it could reach the runner after that job's timeout, which then
                    # recorded a job that had completed in time as timed out (audit DW).
                    self._flush()
                    self.crash_point("worker:importing")
                    try:
                        self._load_renderers()
                    except Exception as exc:  # noqa: BLE001 (any import-time failure)
                        self.queue.appendleft(job)
                        self._unloadable(exc)
                if self.gate is not None and job.seq and not self.gate.start(job.seq):
                    # Taken back by the runner for another worker (Runner._rebalance).
                    self._send(Dropped((job.seq,), DropKind.SKIP, "taken back"))
                    continue
                if job.expires_at is not None and time.time() > job.expires_at:
                    self._send(Dropped((job.seq,), DropKind.EXPIRED, EXPIRED_REASON))
                    continue
                if _lease_lost(self.config.control_dir, job):
                    # A runner frozen past its leases' expiry cannot stop what it queued
                    # here, and another took the job over: it ran twice (audit CO).
                    self._send(Dropped((job.seq,), DropKind.LEASE,
                                       "its lease was taken over, or ran out"))
                    continue
                if not self._apply_limit(job):
                    return
                try:
                    self._run(job)
                except OSError as exc:
                    # Not the job's failure (execute() keeps those): ours, such as the
                    # started log on a full disk. Say so once, instead of a traceback.
                    self._broken(exc)
                if not self.retire_reason and _parent_is_runner():
                    self.retire_reason = ADOPTED_REASON  # (see above)
                if self.retire_reason:
                    # Its jobs go back to the runner, which starts a fresh worker for them.
                    self._drop_all(self.retire_kind, self.retire_reason)
                    return
        finally:
            self._flush()

    def _load_renderers(self) -> None:
        """Import (and harden) what the fork server preloads, before the first job that may
        use it starts, not inside it: under fork and spawn no server preloaded it, and that
        job was charged the import (~0.15-0.2 s against its timeout; ~15-20 MB against its
        ceiling, which later jobs had added to theirs as the worker's own)."""
        with contextlib.suppress(OSError, GuardError):
            self._note_held_base()
        for name in mpstate.PRELOAD:
            if name != "renderctl.forkserver_init":
                importlib.import_module(name)
        reset_render_settings(load=True)
        self.render_settings_clean = True  # as harden() left them: not hardened again
        gc.freeze()  # the worker's for good, like what it inherited (see worker_main)
        if self.held_base is not None:
            # Held by the worker from now on: raises the ceilings as a job's leftovers do.
            with contextlib.suppress(OSError, GuardError):
                self.carried = max(0, self._held() - self.held_base)

    def _enter_workdir(self) -> bool:
        """Make the job's working folder the current one, before the job is started here;
        False (with retire_reason set) if it cannot be. A job in another worker runs as we
        do and may have removed the work root, or put a file in its place, while we were
        idle: the chdir inside the job's clean context failed, and the run stopped with exit
        74 and charged the job that came next (a worker's exit during a job)."""
        try:
            os.chdir(self.workdir)
            return True
        except OSError:
            pass
        try:
            _make_workdir(self.workdir)
            os.chdir(self.workdir)
            return True
        except OSError as exc:
            self.retire_reason = (f"its working folder is gone ({os_error_message(exc)}); "
                                  "retiring")
            return False

    def cancel_requested(self, job_id: str) -> bool:
        return bool(self.control_dir) and os.path.exists(
            f"{self.control_dir}/{CANCEL_REQUEST_PREFIX}{job_id}")

    def _unloadable(self, exc: BaseException) -> NoReturn:
        """Say the renderers cannot be imported here (Broken), then exit: what we hold goes
        back to pending, uncharged, and the runner halts as for workers that cannot start."""
        with contextlib.suppress(OSError):
            self._flush()
            self._post(Broken(f"cannot import the renderers: {_message(exc)}"))
        os._exit(ExitCode.IO_ERROR)

    def _broken(self, exc: OSError | GuardError, doing: str = "") -> NoReturn:
        said = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
        with contextlib.suppress(OSError):
            self._flush()
            self._post(Broken(f"{doing}: {said}" if doing else said))
        os._exit(ExitCode.IO_ERROR)

    def _send(self, msg: object) -> None:
        """Send ``msg`` after any held result, in one message: a job's Finished travels with
        the next job's Started (one write and one runner wake-up instead of two)."""
        if self.outbox:
            self.outbox.append(msg)
            msg, self.outbox = tuple(self.outbox), []
        self._post(msg)

    def _flush(self) -> None:
        if self.outbox:
            out, self.outbox = self.outbox, []
            self._post(out[0] if len(out) == 1 else tuple(out))

    def _post(self, msg: object) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, ConnectionResetError):
            # The runner is gone (with SIGPIPE ignored, as it is here since audit CD, a
            # send to it raises instead of killing us): nothing to report to, and nobody
            # to read a traceback (CI saw one as a runner was SIGKILLed at a crash point).
            os._exit(0)

    def _take_messages(self, *, block: bool) -> None:
        try:
            if block:
                self._handle(self.conn.recv())
            while self.conn.poll():
                self._handle(self.conn.recv())
        except (EOFError, OSError):
            # The runner is gone (EOF; ECONNRESET when it died with our last message
            # unread): nothing to report to, and nobody to read a traceback.
            os._exit(0)

    def _handle(self, msg: object) -> None:
        if isinstance(msg, tuple):  # a batch: several jobs, perhaps then Stop
            for m in msg:
                self._handle(m)
        elif isinstance(msg, RunJob):
            self.queue.append(msg)
        elif isinstance(msg, Skip):
            # By assignment, not job id: the same job may be queued here again, replaced
            # or sent back, and that one is not skipped.
            skipped = tuple(j.seq for j in self.queue if j.seq in msg.seqs)
            self.queue = deque(j for j in self.queue if j.seq not in msg.seqs)
            self._send(Dropped(skipped, DropKind.SKIP))
        elif isinstance(msg, Drain):
            self.draining = True
        elif isinstance(msg, Stop):
            self.stopping = True

    def _drop_all(self, kind: DropKind, reason: str = "") -> None:
        seqs = tuple(j.seq for j in self.queue)
        self.queue.clear()
        self._send(Dropped(seqs, kind, reason))

    def _apply_limit(self, job: RunJob) -> bool:
        """Set this slot's ceiling to the job's (plus what earlier jobs left held here); a
        worker too big for it retires instead. A slot whose cgroup files cannot be read or
        written is tried again (LIMIT_RETRY_S), then the worker is Broken: it exits 74
        without starting the job (not in its started log: the job is not charged)."""
        pauses = iter(_limit_retry_pauses())
        while True:
            try:
                self._set_limit(job)
            except LimitBelowUsage:
                self.queue.appendleft(job)
                self._drop_all(DropKind.ABOVE_CEILING,
                               "worker above the next job's ceiling; recycling")
                return False
            except (OSError, GuardError) as exc:
                # Half set, perhaps: the next try writes the whole ceiling, not only the
                # peak counters.
                self.limit_bytes = 0
                pause = next(pauses, None)
                if pause is None:
                    self._broken(exc, "cannot set the job's memory ceiling")
                # The last job's result, held for the next Started, goes now: the runner
                # records it meanwhile, rather than stop (Broken) with it unrecorded.
                self._flush()
                time.sleep(pause)
                continue
            return True

    def _set_limit(self, job: RunJob) -> None:
        """One try of ``_apply_limit``."""
        self._note_held_base()
        if not self.config.slot_path:
            return
        limit = job.memory_limit_bytes + self.carried
        if limit == self.limit_bytes:
            reset_job_peak(self.config.slot_path)
        else:
            # (The last job's result is not sent before this write, though the kernel may
            # reclaim first: sent apart from the next Started, after that job's gate, it
            # showed the runner a worker holding nothing, and its budget and rebalancing
            # took jobs back for another worker in vain, and a --max-failures halt came
            # between the two; CI of 2fc297f.)
            set_job_limit(self.config.slot_path, limit)
            self.limit_bytes = limit
        # The charge the peak starts from (one pread, ~2 us): see _discount_cache.
        self.usage_at_start = slot_usage_bytes(self.config.slot_path)

    def _note_held_base(self) -> None:
        """What the slot held before the first job (once): this worker's own, that is, less
        what the jobs of the worker before it here left (``inherited_bytes``), which is
        carried as any job's leftovers are: out of the recorded peaks, and added to the
        ceilings. Counted as the worker's own, each successor in a slot added it to every
        peak: identical jobs' peaks doubled over 20 minutes of workers killed for timeouts
        (audit DQ)."""
        if self.held_base is None:
            held = self._held()
            if self.config.slot_path:  # adopted into the slot by now: how /proc shows it
                self.slot_cgroup = own_memory_cgroup()
            inherited = 0
            if self.config.inherited_bytes and self.config.slot_path:
                inherited = inherited_part(held, self.config.inherited_bytes,
                                           slot_anon_bytes(self.config.slot_path))
            self.carried = max(self.carried, inherited)
            self.held_base = held - inherited  # last: a try that failed is made again whole

    def _run(self, job: RunJob) -> None:
        self.own_fds.add_kept(kept_fds())  # cgroup files opened since the last job
        wall = time.time()
        try:
            # With the start time: recovery records it if the runner dies during the job.
            os.write(self.started_fd, f"{job.token} {wall:.6f}\n".encode())
        except OSError as exc:
            raise with_name(exc, self.config.started_log) from None
        self.crash_point("worker:starting")
        carried = self.carried  # (what _apply_limit raised this job's ceiling by)
        # The page cache at the start, at most: what the charge as the peak was reset holds
        # beyond what the slot held (not cache) as the last job ended, and no more than the
        # cache then (none is added between jobs: the runner's work is not charged here).
        usage_at_start, self.usage_at_start = self.usage_at_start, None
        cache_at_start = min(self.cache_left, max(0, usage_at_start - self.held_left)) \
            if usage_at_start is not None else 0
        self._send(Started(job.job_id, job.token, seq=job.seq, wall=wall, mono=time.monotonic(),
                           carried_bytes=carried))
        t0 = time.monotonic()
        workdir = self.workdir
        damage = self.late_damage = ""
        try:
            with self._clean_context(job, workdir) as captured:
                fields = execute(job, Path(workdir), after_call=self._reclaim_fds,
                                 before_check=lambda: self._end_processes(job))
                user_code = runs_user_code_here(job)
                damage = self.own_fds.damage() if user_code else ""
                self.crash_point("worker:checked")
                # Before the peak is read and the next job starts: what a job left running
                # (a daemon, a command's background process) would run into the next job
                # and be charged to it.
                if not remove_leftovers(_children_of_threads if damage else self._children,
                                        LEFTOVER_BOUND_S) or not self._sweep_slot():
                    self.retire_reason = "a job left processes that would not die; retiring"
                if user_code:
                    mpstate.forget_dead_helpers()
                if damage:
                    # The job closed or replaced descriptors this worker relies on: its
                    # failure, not an I/O error of the queue. Nothing of ours can be trusted
                    # to point where it did (a dup2 from a reused number would send our
                    # stdout into the job's file), so report and retire.
                    captured.intact = False
                    fields = {"outcome": Outcome.FAILED.value, "error": damage}
                    self.retire_reason = "a job broke the worker's descriptors; retiring"
            if self.late_damage and not damage:
                # The job's output was made and checked before, and stands; this worker's
                # descriptors do not: nothing more is read through them, and it retires.
                damage = self.late_damage
                captured.intact = False  # (its file too may be another now)
                self.retire_reason = (f"after the job, collecting what it left closed one of "
                                      f"the worker's descriptors ({damage}); retiring")
            if captured.intact:
                fields.setdefault("stderr_tail", captured.stderr_tail())
                # Emptied now, not when the next job starts: its page cache is charged to
                # our slot, and the next job's peak is measured from before it starts.
                captured.clear()
        finally:
            with contextlib.suppress(OSError):
                os.chdir(self.neutral_cwd)
            emptied = _empty_dir(workdir)
            for log in command_logs(workdir):
                with contextlib.suppress(OSError):
                    os.unlink(log)
            self.jobs_run += 1
            self.workdir = os.path.join(self.config.work_root,
                                        f"w{os.getpid()}.{self.jobs_run}")
            try:
                if not emptied:
                    raise FileExistsError  # left behind: the runner removes it when we die
                os.rename(workdir, self.workdir)
            except OSError:
                try:
                    _make_workdir(self.workdir)
                except OSError as exc:
                    # The job's doing, not the queue's: it removed or replaced the work
                    # root, or gave up the user that owns it. Reported as an I/O error,
                    # this stopped the run (exit 74), and every later run at that job's
                    # retry. A fresh worker gets a work root the runner has checked.
                    self.retire_reason = ("its working folder could not be made ready "
                                          f"for the next job ({os_error_message(exc)}); "
                                          "retiring")
        elapsed = time.monotonic() - t0
        if not damage:  # read through kept descriptors: not if a job broke them
            # What the slot holds now (~16 us a job), read once for the two checks below,
            # whatever else retires the worker. Only now, with its working directory
            # emptied: scratch files there (on a tmpfs /tmp they are memory too) are not
            # left behind.
            held = self._held() if self.held_base is not None else None
            self._check_ceiling(job, fields, carried)
            if held is not None:
                self._discount_cache(fields, cache_at_start)
                # After every kind: a built-in renderer's big input (a stamp of 20,000 pages)
                # left ~350 MB held, and the next job in the worker was killed at its own
                # 400 MB ceiling.
                self._check_leftover_memory(held)
        # Held until the next job starts or the worker is about to wait (see _send).
        self.outbox.append(Finished(job.job_id, job.token, elapsed_s=elapsed, seq=job.seq,
                                    **fields))

    def _check_ceiling(self, job: RunJob, fields: dict[str, Any], carried: int) -> None:
        """Record the job's peak (less what earlier jobs left held in the slot), and judge it
        by the ceiling the job was given, which the job (as root) may have lifted for
        itself."""
        slot = self.config.slot_path
        peak = slot_peak_bytes(slot)
        if peak is None:
            return
        peak = max(0, peak - carried)
        fields["peak_memory_bytes"] = peak
        limit = job.memory_limit_bytes
        if runs_user_code_here(job) and own_memory_cgroup() != self.slot_cgroup:
            # Its code (a callable's, a plugin renderer's: audit DL, whose plugin left every
            # later job here unlimited) ran in this process, as root, and moved it out of
            # the slot: nothing it or a later job here uses is charged or limited any more.
            self.retire_reason = "a job moved its worker out of its memory slot; retiring"
            fields.update(outcome=Outcome.MEMORY.value, peak_memory_bytes=None,
                          error="the job moved its worker out of its memory slot, escaping "
                                f"its ceiling of {limit / MB:.0f} MB")
            return
        lifted = ceiling_lifted(slot, limit + carried)
        if lifted:
            # Rewritten before the next job (_apply_limit): its leftovers are dead by now and
            # nothing else runs here until then, so that job starts under its own ceiling.
            self.limit_bytes = 0
        # v1's peak is this job's alone and never above an intact ceiling; v2's is the
        # slot's, so there only a lifted ceiling makes it the job's doing.
        if peak > limit and (lifted or peak_is_per_job(slot)):
            fields.update(outcome=Outcome.MEMORY.value,
                          error=f"peak {peak / MB:.0f} MB crossed its memory ceiling of "
                                f"{limit / MB:.0f} MB"
                                + (", which the job had lifted" if lifted else ""))

    def _held(self) -> int:
        """What counts against a job's ceiling before it starts: the slot's charge less page
        cache (cgroup guard), or this process's resident size (the sampling guard measures
        the worker's tree)."""
        if self.config.slot_path:
            charge = slot_charge(self.config.slot_path)
            if charge is None:
                return 0
            self.cache_left, self.held_left = charge[1], charge[0] - charge[1]
            return self.held_left
        return int(_pread_whole(self.statm_fd).split()[1]) * PAGE_SIZE

    def _check_leftover_memory(self, held: int) -> None:
        """Retire (with a fresh slot) if the job left more memory ``held`` (as _held read it,
        whole: the slot's usage alone cannot tell, as page cache that goes away, a file
        deleted, can hide the same amount leaked) than the allowance; otherwise note what
        it left, for the next job's ceiling."""
        if self.held_base is None or self.retire_reason:
            return
        slot = self.config.slot_path
        grown = held - self.held_base
        if grown > LEFTOVER_ALLOWANCE_BYTES:
            self.retire_kind = DropKind.LEAKED if slot else DropKind.RETIRE
            where = "this worker's memory slot" if slot else "this worker"
            self.retire_reason = f"a job left {grown / MB:.0f} MB held in {where}; retiring"
            return
        self.carried = max(0, grown)

    def _discount_cache(self, fields: dict[str, Any], cache_at_start: int) -> None:
        """Take out of the recorded peak (never the judged one: _check_ceiling) the page
        cache earlier jobs' outputs left charged to the slot, which the peak starts from: a
        job writing 3 bytes recorded 145 MiB after 28,000 jobs in its slot (audit CV).

        Only what was there at the start and is still there at the end (``cache_left``, read
        just now) beyond the job's own output: what a deletion or global pressure took away
        meanwhile was not in the peak either (reviews CY, CZ). Only where the peak is the
        job's own (cgroup v1) and failcnt does not show the ceiling met (where memsw equals
        the limit, as we set it, this kernel leaves it 0 even so: the bound by the end is
        what holds). Cache the job made besides its output (inputs read, scratch files) can
        stand in for earlier cache deleted meanwhile: then the record is under-counted by
        as much; judged on it, a job that lifted its ceiling and used more completed
        (review DA)."""
        peak = fields.get("peak_memory_bytes")
        if not peak or not cache_at_start or fields.get("outcome") == Outcome.MEMORY.value \
                or slot_limit_hits(self.config.slot_path) != 0:
            return
        own = fields.get("bytes") or 0
        fields["peak_memory_bytes"] = max(
            0, peak - min(cache_at_start, max(0, self.cache_left - own)))

    def _collect_lost_files(self) -> str:
        """After a job's code ran here and its modules were forgotten: a file it left open
        (a module global: its module and functions hold each other, so only a collection
        frees them) stayed open into every later job in this worker, which could read it
        through /proc/self/fd, and a lock taken through it held them off (audit DD). If more
        descriptors are open than the worker's own and those live objects held after the
        last collection (a library's cache, which stays loaded as the library does), one
        collection closes what is lost (the heap since gc.freeze(): ~1 ms). The common path
        is one stat (~3 us).

        Returns what the collection did to the worker's own descriptors, if anything: a
        lost object wrapping one of them (``os.fdopen(1)`` in a module global) closes it
        as it goes (review DE: left to a later automatic collection, that happened during
        an innocent job, which the descriptor check then failed, or halted the run)."""
        known = len(self.base_fds | self.own_fds.known.keys() | _staging_fds)
        left = _open_fd_count() - known
        damage = ""
        if left > self.fds_held:
            # Into the job's capture: what a finalizer of the job's prints is the job's
            # stderr tail, not lines in the runner's own stdout (review DG: in the middle
            # of `run --json`'s stream).
            os.dup2(self.capture.fd, 1)
            os.dup2(self.capture.fd, 2)
            try:
                gc.collect()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                # Back, whatever the collection closed: a lost object wrapping a standard
                # descriptor (os.fdopen(1), a common idiom for a line-buffered stdout)
                # closes it as it goes. (A copy it closed is the damage reported below.)
                for fd, copy in ((1, self.capture.saved[0]), (2, self.capture.saved[1])):
                    with contextlib.suppress(OSError):
                        os.dup2(copy, fd)
            if self.baseline.stdin_copy >= 0 and not _fd_open(0):
                with contextlib.suppress(OSError):
                    os.dup2(self.baseline.stdin_copy, 0)
            left = _open_fd_count() - known
            damage = self.own_fds.damage()
        self.fds_held = max(0, left)
        return damage

    def _reclaim_fds(self) -> None:
        """After a job's code ran here: if it left more than FD_ALLOWANCE descriptors open,
        close every descriptor that is not the worker's and retire (what a library of the
        job's had open is closed with them). One stat (~3 us): /proc's count of open fds."""
        n_open = _open_fd_count()
        if n_open <= len(self.base_fds) + FD_ALLOWANCE:
            return
        keep = sorted(self.base_fds | self.own_fds.known.keys() | _staging_fds)
        top = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        for low, high in zip([-1, *keep], [*keep, top], strict=True):
            if high - low > 1:
                os.closerange(low + 1, high)
        self.retire_reason = (f"the job left {n_open - len(self.base_fds)} file descriptors "
                              "open in its worker; retiring")

    def _end_processes(self, job: RunJob) -> None:
        """Kill what the job left running (a command's background process, a daemon a
        callable started) before its output is checked, not after: in between it could
        still write to the output, and what is published would not be what was checked
        and hashed (truncated, say, yet recorded as a whole PDF). Code run here may have
        broken our kept descriptors (see _OwnFds): its children are found by path."""
        children = self._children if job.spec.get("kind") == "command" else _children_of_threads
        if not remove_leftovers(children, LEFTOVER_BOUND_S) or not self._sweep_slot():
            self.retire_reason = "a job left processes that would not die; retiring"

    def _sweep_slot(self) -> bool:
        """Kill every process in this worker's memory slot but the worker: what the job
        started outside its tree (clone(CLONE_PARENT) makes a sibling of the worker, which
        no kill of our tree reaches) would run on, charged to the next jobs. One pread of
        the slot's member list (~5 us); False if they would not go within the bound."""
        if not self.config.slot_path:
            return True
        if self.slot_procs_fd < 0:
            return True
        me = os.getpid()
        deadline = time.monotonic() + LEFTOVER_BOUND_S
        while True:
            try:
                others = [p for p in map(int, _pread_whole(self.slot_procs_fd).split())
                          if p != me]
            except OSError:
                return True
            if others:
                from renderctl.proctree import pid_alive  # (rare: a job's escapee)

                others = [p for p in others if pid_alive(p)]
            if not others:
                return True
            if time.monotonic() > deadline:
                return False
            for pid in others:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.001)

    def _children(self) -> list[int]:
        if os.fstat(self.tasks_fd).st_nlink > 3:
            # A thread the job left running may have children of its own.
            return _children_of_threads()
        return [int(p) for p in _pread_whole(self.children_fd).split()]

    @contextlib.contextmanager
    def _clean_context(self, job: RunJob, workdir: str) -> Iterator[_Capture]:
        self.environ.set({"RENDERCTL_JOB_ID": job.job_id,
                          "RENDERCTL_ATTEMPT": str(job.attempt), "TMPDIR": workdir})
        tempfile.tempdir = None  # re-read TMPDIR
        # (The current folder is workdir already: see _enter_workdir.)
        if not self.render_settings_clean:
            # (~0.1 ms: skipped between our own renderers.) Loaded first if need be: under
            # spawn or fork the worker has not preloaded them, and the first job of each
            # worker ran with pypdf's own limits (a 60 MB decompression bomb was stamped).
            reset_render_settings(load=job.spec.get("kind") != "command")
        self.render_settings_clean = "reportlab" in sys.modules \
            and not runs_user_code_here(job)
        capture = self.capture
        if runs_user_code_here(job):
            self._note_user_package(job)
        kept_before = len(self.kept_names)
        try:
            with capture:
                yield capture
        finally:
            tempfile.tempdir = None
            sys.path[:] = self.base_path
            if runs_user_code_here(job) or len(sys.modules) != len(self.base_modules):
                # (Our renderers add modules only by a library's lazy import, and remove
                # none: with the count unchanged there is nothing to forget, and the set
                # difference over ~1,000 names was ~0.1 ms of every invoice.)
                self._forget_user_modules()
            # A library imported by this job stays loaded, with what its import set up
            # (see Baseline.restore): that becomes the baseline.
            libraries = len(self.kept_names) > kept_before
            if runs_user_code_here(job):
                self._restore_modules()
            self.baseline.restore_environ()
            self.environ.set({})  # before the time zone is judged (TZ)
            problems: list[str] = []
            if runs_user_code_here(job):
                try:
                    problems = self.baseline.restore(libraries_loaded=libraries)
                except Exception as exc:  # noqa: BLE001
                    # What the job left cannot be put back (an unhashable warnings filter,
                    # say): the worker is not fit for another job, and the job, which ended,
                    # keeps its outcome (an escape killed the worker: charged to the job).
                    problems = [f"its state could not be put back ({exc!r:.200})"]
                if threads_left():
                    problems.append(f"the job left {threads_left()} thread(s) running")
                from renderctl import proctree

                if proctree.parent_death_signal() != PARENT_DEATH_SIGNAL:
                    # seteuid() there and back cleared it (the identity is the same): the
                    # worker would outlive its parent but for the reaper (audit BY).
                    problems.append("the job cleared its worker's parent-death signal")
            elif job.spec.get("kind") == "command":
                problems = self.baseline.restore_from_outside()
            if problems and not self.retire_reason:
                self.retire_reason = "; ".join(problems) + "; retiring"
            elif runs_user_code_here(job) and not self.retire_reason:
                # (Not in a worker that retires: a pool the job left running, say, would be
                # finalized here, joining threads that wait on processes killed already.)
                self.late_damage = self._collect_lost_files()

    def _note_user_package(self, job: RunJob) -> None:
        """Count the package of the job's code as the user's from now on; if an earlier
        job loaded it as a library (kept), forget it now, so that this job imports it
        afresh."""
        spec = job.spec
        if spec.get("kind") == "python":
            target = str(spec.get("callable", ""))
        else:
            target = _renderer_target(job)
        package = target.partition(":")[0].split(".")[0]
        if not package or package in self.user_packages or package in self.preloaded \
                or package in self.native_packages:
            # (Loaded before any job, renderctl's own and the renderers' libraries: a
            # library's, whatever names it; imported again in part, its modules would
            # disagree about which of each other they hold.)
            return
        pairs = list(zip(self.kept_names, self.kept_modules, strict=True))
        first, later = pairs[:self.first_kept], pairs[self.first_kept:]
        mine = [(name, mod) for name, mod in later if name.partition(".")[0] == package]
        if any(map(_is_extension, (mod for _, mod in mine))):
            self.native_packages.add(package)
            return
        self.user_packages.add(package)
        if not mine:
            return
        for name, mod in mine:
            self.base_modules.discard(name)
            if sys.modules.get(name) is mod:
                del sys.modules[name]
        stay = [(name, mod) for name, mod in later if name.partition(".")[0] != package]
        self.kept_names = [name for name, _ in first + stay]
        self.kept_modules = [mod for _, mod in first + stay]

    def _forget_user_modules(self) -> None:
        new = sys.modules.keys() - self.base_modules
        if self.user_packages:
            for name in new:
                top = name.partition(".")[0]
                if top in self.user_packages and _is_extension(sys.modules.get(name)):
                    self.user_packages.discard(top)  # a library's after all (see above)
                    self.native_packages.add(top)
        for name in new:
            mod = sys.modules.get(name)
            if name == "renderctl" or name.startswith("renderctl."):
                # Our own code is not the job's: keep it (re-importing costs ms).
                self._keep_module(name, mod)
                continue
            origin = getattr(mod, "__file__", None)
            if origin and origin.startswith(self.library_roots) \
                    and name.partition(".")[0] not in self.user_packages:
                # Libraries stay loaded (re-importing C extensions is unsafe). Remembered,
                # so the next jobs do not judge reportlab's lazy imports again (~0.15 ms).
                self._keep_module(name, mod)
                continue
            sys.modules.pop(name, None)

    def _keep_module(self, name: str, mod: Any) -> None:
        self.base_modules.add(name)
        self.kept_names.append(name)
        self.kept_modules.append(mod)

    def _restore_modules(self) -> None:
        """Put back each kept module a job replaced or removed in sys.modules, but where a
        library's module took its place (a library that swaps one in as it is imported, as
        pysqlite3's users do for sqlite3: that stays, as the library does; review CA)."""
        if not any(map(operator.is_not, map(sys.modules.get, self.kept_names),
                       self.kept_modules)):
            return
        for i, (name, mod) in enumerate(zip(self.kept_names, self.kept_modules, strict=True)):
            now = sys.modules.get(name)
            if now is mod:
                continue
            origin = getattr(now, "__file__", None)
            if isinstance(now, types.ModuleType) and origin \
                    and origin.startswith(self.library_roots):
                self.kept_modules[i] = now
            else:
                sys.modules[name] = mod


def _is_extension(mod: Any) -> bool:
    origin = getattr(mod, "__file__", None)
    return isinstance(origin, str) and origin.endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES))


class _CachedSourceLoader(importlib.machinery.SourceFileLoader):
    """A SourceFileLoader whose compiled code is kept while the file is unchanged."""

    cache: dict[str, tuple[int, int, Any]] = {}  # path: (mtime_ns, size, code)

    def get_code(self, fullname: str) -> Any:
        path = self.get_filename(fullname)
        st = os.stat(path)
        hit = self.cache.get(path)
        if hit is not None and hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            return hit[2]
        code = super().get_code(fullname)
        self.cache[path] = (st.st_mtime_ns, st.st_size, code)
        return code


class _UserCodeCache(importlib.abc.MetaPathFinder):
    """Serve a job's own modules (not libraries) with their compiled code cached.

    Each job imports its modules afresh (a new module object, its top level executed again,
    so no state leaks between jobs), but compiling them again was most of a small job's cost
    where bytecode is not written (PYTHONDONTWRITEBYTECODE): ~0.1 ms for a 5-line module.
    A code object is immutable; the file's mtime and size say when it must be recompiled."""

    def __init__(self, library_roots: tuple[str, ...]) -> None:
        self.library_roots = library_roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader \
                or not spec.origin or spec.origin.startswith(self.library_roots):
            return None  # the regular finders decide, exactly as without us
        spec.loader = _CachedSourceLoader(fullname, spec.origin)
        return spec


def _set_environ(env: Mapping[str, str]) -> None:
    """Make os.environ exactly ``env``, touching only what differs.

    A clear() + update() re-exported ~100 variables twice per job (0.4 ms, a tenth of an
    invoice render); a job usually changes none of them."""
    current = os.environ
    for key in [k for k in current if k not in env]:
        del current[key]
    for key, value in env.items():
        if current.get(key) != value:
            current[key] = value


class _Environ:
    """Give each job the worker's environment plus its own variables, cheaply.

    Comparing os.environ's encoded mapping with what we last set is one C-level dict
    comparison (~3 us); only when a job changed something is the full difference applied."""

    def __init__(self, base: Mapping[str, str]) -> None:
        self.base = dict(base)
        self.last: dict[bytes, bytes] | None = None  # os.environ._data as we last left it

    def _data(self) -> dict[bytes, bytes] | None:
        data = getattr(os.environ, "_data", None)  # CPython's encoded mapping
        return data if isinstance(data, dict) else None

    def set(self, extra: Mapping[str, str]) -> None:
        data = self._data()
        if data is None or self.last is None or data != self.last:
            _set_environ({**self.base, **extra})
        else:
            for key, value in extra.items():
                if os.environ.get(key) != value:
                    os.environ[key] = value
        data = self._data()
        self.last = dict(data) if data is not None else None


def _empty_dir(path: str) -> bool:
    """Remove what a job left in its working directory (usually nothing: one listdir).

    False if something could not be removed (a job made it undeletable): the folder is then
    not reused, so that nothing of this job reaches the next one."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return False  # the job removed it: a new one is made (see Worker._run)
    except OSError:
        return False  # the job replaced its folder, or gave up the user that owns it
    if not entries:
        return True
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            remove_tree(e.path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(e.path)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    try:
        return not os.listdir(path)
    except OSError:
        return False


def reset_render_settings(*, load: bool = False) -> None:
    """Undo what an earlier job may have changed in reportlab/pypdf, and re-harden; with
    ``load``, import them first if they are not (a job in this process may use them)."""
    if load or "reportlab" in sys.modules or "pypdf" in sys.modules:
        from renderctl.render.safety import harden  # (imports reportlab and pypdf)

        harden()


def _pread_whole(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.pread(fd, 1 << 16, sum(map(len, chunks))):
        chunks.append(chunk)
    return b"".join(chunks)


def _children_of_threads() -> list[int]:
    """Children of every thread of this process, by path (no kept descriptor needed)."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/children", "rb") as fh:
            pids.extend(int(p) for p in fh.read().split())
    return pids


# Kinds whose code is ours, or runs in a child process (command): they cannot change this
# process, so the checks after a job that runs someone's code here are skipped for them
# (~12 us a job: descriptors, process state, threads, multiprocessing's helpers).
_OWN_KINDS = BUILTIN_KINDS - {"python"}


def inherited_part(held: int, handed_over: int, anon: int | None) -> int:
    """Of what a slot holds now (``held``), what the jobs of the worker before left there:
    no more than the runner saw as it handed the slot over, nor than is still there, and
    never this worker's own heap (``anon``: a dead worker's anonymous memory went with it).
    (Review DS: the inherited file deleted before the first job, the worker's own memory
    was taken for it, its base 0, every ceiling it set raised by that much.)"""
    return max(0, min(handed_over, held, held - (anon or 0)))


def runs_user_code_here(job: RunJob) -> bool:
    """Whether the job runs code of the user's (a python callable, a plugin renderer) in
    this process."""
    return job.spec.get("kind") not in _OWN_KINDS


def remove_leftovers(children: Callable[[], list[int]], bound_s: float) -> bool:
    """SIGKILL and reap every process a job left behind; False if some outlived ``bound_s``.

    Only our own children are signalled: an unreaped child's pid cannot be reused, so there
    is no race with pid reuse. As a child subreaper we inherit each killed process's
    children, the next round kills those, and so on down to setsid() daemons."""
    deadline = time.monotonic() + bound_s
    while pids := children():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            if not _reap(pid, deadline):
                return False
        if time.monotonic() >= deadline:
            return not children()  # still forking faster than we kill
    return True


def _reap(pid: int, deadline: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # reaped already (a child of another thread, by that thread)
    try:
        # Readable once it has exited: no polling, and a bound on a process stuck in D state.
        select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        try:
            return os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            return True
    finally:
        os.close(fd)


class _OwnFds:
    """The worker's own descriptors and the files they were opened on.

    A python job runs in the worker and may close any descriptor (a daemonizing library
    closes them all), after which the number can be reused by whatever the job opens next.
    One fstat per descriptor after each job (~1 us each) tells that apart from a genuine
    I/O error, which would otherwise be the first sign of it."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[int, int, str]] = {}  # fd: (st_dev, st_ino, what)
        self.kept: tuple[int, ...] = ()

    def add(self, fd: int, what: str) -> None:
        st = os.fstat(fd)
        self.known[fd] = (st.st_dev, st.st_ino, what)

    def add_kept(self, fds: tuple[int, ...]) -> None:
        """Follow the cgroup files guards keeps open (opened lazily, so the set grows)."""
        if fds == self.kept:
            return
        for fd in self.kept:
            self.known.pop(fd, None)
        for fd in fds:
            self.add(fd, "a cgroup file of its memory slot")
        self.kept = fds

    def damage(self) -> str:
        """Which descriptors are no longer what they were, as a message; "" if none."""
        bad: dict[int, str] = {}
        for fd, (dev, ino, what) in self.known.items():
            try:
                st = os.fstat(fd)
            except OSError:
                bad[fd] = what
                continue
            if st.st_ino != ino or st.st_dev != dev:
                bad[fd] = what
        if not bad:
            return ""
        fds = ", ".join(map(str, sorted(bad)))
        whats = ", ".join(dict.fromkeys(bad.values()))
        return (f"the job closed or replaced the worker's file descriptor"
                f"{'s' if len(bad) > 1 else ''} {fds} ({whats}); the worker was replaced")


class _Capture:
    """Redirect fd 1 and 2 to the worker's capture file for the duration of the job.

    The file stays open for the worker's life and is truncated after each job: one
    ftruncate instead of an open, a stat and a buffered read of the (usually empty) file.
    The worker's own stdout and stderr are saved once, for its life, not per job."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        self.saved = (os.dup(1), os.dup(2))  # close-on-exec: a command does not get them
        self.intact = True  # False: the job broke our descriptors; restore nothing

    def __enter__(self) -> _Capture:
        with contextlib.suppress(Exception):  # (streams the job broke: see Baseline.restore)
            sys.stdout.flush()
            sys.stderr.flush()
        # O_APPEND is not set: the job's writes go at the shared offset, which starts at 0
        # (the file was emptied after the last job: clear()).
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.dup2(self.fd, 1)
        os.dup2(self.fd, 2)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if self.intact:
            os.dup2(self.saved[0], 1)
            os.dup2(self.saved[1], 2)

    def clear(self) -> None:
        os.ftruncate(self.fd, 0)

    def stderr_tail(self) -> str | None:
        size = os.fstat(self.fd).st_size
        if not size:
            return None
        start = max(0, size - TAIL_BYTES)
        return _tail_lines(os.pread(self.fd, size - start, start))


def bound_capture(fd: int) -> None:
    """Keep a capture file (open for writing as ``fd``) within CAPTURE_BOUND_BYTES on disk:
    punch out all but its last CAPTURE_KEEP_BYTES (the tail a record keeps is in those)."""
    st = os.fstat(fd)
    if st.st_blocks * 512 <= CAPTURE_BOUND_BYTES:
        return
    end = (st.st_size - CAPTURE_KEEP_BYTES) // PAGE_SIZE * PAGE_SIZE
    if end <= 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if libc.fallocate(fd, _FALLOC_PUNCH_HOLE | _FALLOC_KEEP_SIZE, 0, end) != 0:
        # A file system without holes: drop it all; the writer's next write leaves a sparse
        # file behind it, and only the tail written since is kept.
        os.ftruncate(fd, 0)


_FALLOC_KEEP_SIZE = 1
_FALLOC_PUNCH_HOLE = 2


def _make_workdir(path: str) -> None:
    """A job's working folder, made inside the work root only: a root a job removed is not
    made again (makedirs would, open to everyone the umask lets in); the worker retires,
    and the runner makes a fresh root for the next one."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def capture_path(work_root: str, pid: int) -> str:
    """Where worker ``pid`` captures a python job's stdout and stderr."""
    return os.path.join(work_root, f"w{pid}.out")


def last_words(work_root: str, pid: int, kind: str) -> str | None:
    """The tail of what the job in worker ``pid`` said, read by the runner after killing it
    (the worker can no longer send it): a command's log in the worker's working folder,
    else the worker's capture."""
    if kind != "command":
        return read_tail(capture_path(work_root, pid))
    with contextlib.suppress(OSError):
        for entry in os.scandir(work_root):  # its one working folder, w<pid>.<jobs run>
            if entry.name.startswith(f"w{pid}.") and entry.is_dir(follow_symlinks=False):
                tail = command_tail(entry.path)
                if tail:
                    return tail
    return None


def command_logs(workdir: str | Path) -> tuple[str, str]:
    """Where a command run in ``workdir`` has its stderr and stdout captured: beside that
    folder, not in it. (In it, the job's "fresh empty working directory" held two files of
    renderctl's, which a `zip -r {output} .` or a `ls` took for the job's own; audit CK.)
    Named after it, so the runner's removal of a dead worker's w<pid>.* takes them too."""
    return f"{os.fspath(workdir)}.stderr", f"{os.fspath(workdir)}.stdout"


def command_tail(workdir: str | Path) -> str | None:
    """The tail of what a command said on stderr, or, if nothing, on stdout (a tool that
    reports its errors there)."""
    err, out = command_logs(workdir)
    return read_tail(err) or read_tail(out)


def read_tail(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_BYTES))
            data = fh.read()
    except OSError:
        return None
    return _tail_lines(data)


def _tail_lines(data: bytes) -> str | None:
    if not data:
        return None
    lines = text_lines(data.decode("utf-8", "replace"))[-TAIL_LINES:]
    return "\n".join(lines)



# -- executing one attempt -----------------------------------------------------------------


def execute(job: RunJob, workdir: Path, after_call: Callable[[], None] | None = None,
            before_check: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run the job's renderer and check its output; returns ``Finished`` fields.

    ``after_call`` runs once a python callable or plugin renderer has returned or raised,
    before its output is checked; ``before_check``, once a command or such code succeeded,
    just before the check (what they left running must not write to the output after it).

    Where someone else can write on the way to the output (publish.others_can_write), the
    job writes into a private folder (``_Staging``), not at its temporary name beside the
    output: that name is predictable, and they could plant a symlink there that a job run
    as root would write through (a render opens its output by name, often only when it is
    done). The output is moved to the temporary name, where the runner publishes it, only
    once it is checked. Elsewhere the job is given the temporary name itself: a path that
    any process it starts can open too (not so ``/proc/self/fd/N/...``, in a child that
    closed the descriptor, as subprocess does by default)."""
    spec = job.spec
    tmp = Path(job.tmp_output)
    if not others_can_write(os.path.realpath(spec.get("out_root") or tmp.parent), tmp.parent):
        fields = _judge_full(_execute(job, tmp, workdir, after_call, before_check, ()), tmp)
        if fields["outcome"] != Outcome.COMPLETED.value:
            discard_sidecars(tmp)  # (in a private folder, they go with it: _Staging.close)
        return fields
    try:
        staging = _Staging(Path(job.tmp_output), spec)
    except OutputEscapes as exc:
        return {"outcome": Outcome.INVALID_OUTPUT.value, "error": f"output path: {exc}"}
    except OSError as exc:
        return {"outcome": Outcome.FAILED.value, "error": _message(exc)}
    try:
        fields = _judge_full(
            _execute(job, staging.output, workdir, after_call, before_check, staging.fds,
                     held=(staging.folder_fd, staging.folder_ident)), tmp)
        if fields["outcome"] == Outcome.FAILED.value and spec.get("kind") not in (
                "command", *_OWN_KINDS):
            fields = _staging_hint(fields, staging.output)
        if fields["outcome"] == Outcome.COMPLETED.value:
            try:
                staging.commit()
            except OSError as exc:
                return {"outcome": Outcome.FAILED.value, "error": _message(exc)}
        return fields
    finally:
        staging.close()


def _staging_hint(fields: dict[str, Any], output: Path) -> dict[str, Any]:
    """``fields`` of a python job's failed attempt whose output was given as
    ``/proc/self/fd/N/...`` (a shared folder's private one), with what to do added to its
    error if it, or what the job wrote to stderr, names that folder, with "No such file or
    directory" or as a process's that failed: a process the job started, which did not
    inherit N, could not open it, and the record said only "cannot create ... No such
    file or directory" (audit FV). (A command inherits N; the built-in kinds start no
    process.)"""
    said = " ".join(str(fields.get(k) or "") for k in ("error", "stderr_tail"))
    # (Not the traceback: a job that failed for another reason, its output folder removed,
    # has the path there too, from its own open.)
    error = str(fields.get("error") or "")
    if not error or not re.search(re.escape(str(output.parent)) + r"(?!\d)", said) \
            or ("No such file or directory" not in said
                and not error.startswith("CalledProcessError")):
        return fields
    return {**fields, "error": f"{fields['error']} (the output is given as {output}, in "
                               "a shared output folder: a process the job starts must "
                               "inherit that descriptor to write there, subprocess's "
                               "pass_fds with the number from the path it was given, or "
                               "close_fds=False; or keep the output folder writable only "
                               "by renderctl's user)"}


class _HeldFolder:
    """An output's folder as a job starts, held open (O_PATH) for the check after it: one
    removed while the job ran is told from one the job never wrote into even if a folder
    of the same name was made since (on ext4 a folder removed and made again at once got
    the same inode number, when nothing held the old one: review BW)."""

    def __init__(self, path: Path,
                 borrowed: tuple[int, tuple[int, int]] | None = None) -> None:
        self.path = path
        self.fd = -1
        self.ident: tuple[int, int] | None = None
        self.owned = borrowed is None
        if borrowed is not None:
            # The private folder's own descriptor of it (_Staging), held for as long: not
            # opened a second time (before-stop review).
            self.fd, self.ident = borrowed
            return
        try:
            self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            st = os.fstat(self.fd)
            self.ident = (st.st_dev, st.st_ino)
        except OSError:
            self.close()
            return
        _staging_fds.add(self.fd)  # not one a job's leftovers are closed with

    def gone(self) -> bool:
        """Whether the folder was removed, or replaced, since the job started."""
        if self.ident is None:
            return False
        try:
            st = os.fstat(self.fd)
            held = (st.st_dev, st.st_ino) == self.ident
        except OSError:
            held = False  # the job closed it (and maybe reused its number)
        if held and st.st_nlink == 0:
            return True
        try:
            now = os.stat(self.path)
        except OSError:
            return True
        return (now.st_dev, now.st_ino) != self.ident

    def close(self) -> None:
        if self.fd >= 0 and self.owned:
            _staging_fds.discard(self.fd)
            with contextlib.suppress(OSError):
                st = os.fstat(self.fd)
                if (st.st_dev, st.st_ino) == self.ident:
                    os.close(self.fd)
            self.fd = -1


def _unless_folder_gone(folder: _HeldFolder | None) -> None:
    """Raise OutputFolderGone if ``folder`` was removed while the job ran (an `rm -rf` of
    the output tree): invalid_output said the job wrote nothing, and dead-lettered at once
    a job a retry completes, as the next claim makes the folder again (audit BV)."""
    if folder is not None and folder.gone():
        raise OutputFolderGone(f"its output folder {folder.path} was removed while the job "
                               "ran")


class OutputFolderGone(Exception):
    """The output's folder went away while the job ran: a failure a retry can mend."""


def _judge_full(fields: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """``fields``, with ``output_full`` if the attempt failed saying a disk was full and the
    output's own file system is (or cannot be written): judged here, with the partial
    output still there. The runner, judging later, found room: the private folder was
    emptied, or a tool removed its partial file, and Python's "[Errno 28] No space left on
    device" names no file, so two jobs failing on a full disk were charged, dead with
    one attempt each (audit BV)."""
    if fields["outcome"] in (Outcome.FAILED.value, Outcome.INVALID_OUTPUT.value) and \
            says_full(fields.get("error"), fields.get("stderr_tail"),
                      fields.get("traceback_tail")):
        problem = output_folder_problem(tmp)
        if problem:
            fields["output_full"] = problem
    return fields


# Descriptors of the job being run's private output folder: a job that leaves too many
# descriptors open has all but the worker's closed (Worker._reclaim_fds), but not these.
_staging_fds: set[int] = set()


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _open_fd_count() -> int:
    """How many descriptors this process has open (/proc's count: one stat)."""
    try:
        return os.stat(f"/proc/{os.getpid()}/fd").st_size or len(os.listdir("/proc/self/fd"))
    except OSError:  # not one descriptor left to list them with
        return 1 << 30


class _Staging:
    """A private folder (0700, ours) beside the output's temporary name, for one attempt.

    Made and opened through a descriptor of the output folder that is judged to be inside
    the output root (publish.output_folder); the job is given its output inside it through
    that descriptor (``/proc/self/fd/N/<output's name>``), so nothing swapped on the way
    since, a folder for a symlink or the private folder for another, redirects the job's
    writes. ``commit`` renames the output to the temporary name (a rename replaces a name,
    it never writes through a symlink)."""

    def __init__(self, tmp: Path, spec: Mapping[str, Any]) -> None:
        self.tmp = tmp
        self.name = staging_name(tmp.name)
        root = os.path.realpath(spec.get("out_root") or tmp.parent)
        self.folder_fd = output_folder(root, tmp)
        st = os.fstat(self.folder_fd)
        self.folder_ident = (st.st_dev, st.st_ino)
        self.fd = -1
        self.ident: tuple[int, int] | None = None  # set once the folder is judged ours
        try:
            os.mkdir(self.name, 0o700, dir_fd=self.folder_fd)
            self.fd = os.open(self.name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                              | os.O_CLOEXEC, dir_fd=self.folder_fd)
            st = os.fstat(self.fd)
            if st.st_uid != os.geteuid():
                # Renamed away and something else put in its place between the two calls.
                raise OutputEscapes(f"{tmp.parent / self.name} was replaced")
            if st.st_mode & 0o077:
                # Ours, made 0700, and open to others all the same: the file system keeps
                # no permissions (FAT, exFAT, a share mounted with fixed modes).
                raise OutputEscapes(
                    f"{tmp.parent}: others can write here and its file system does not keep "
                    f"permissions (a folder made 0700 reads {stat.S_IMODE(st.st_mode):04o}), "
                    f"so no private folder can be made for the output; mount it so that "
                    f"only renderctl's user can write there (e.g. umask=077)")
            self.ident = (st.st_dev, st.st_ino)
        except BaseException:
            self.close()
            raise
        _staging_fds.update((self.folder_fd, self.fd))
        self.fds = (self.fd,)  # for a command: its {output} is reached through it
        self.output = Path(f"/proc/self/fd/{self.fd}") / PurePosixPath(spec["output"]).name

    def _intact(self) -> bool:
        """Whether our descriptor is still our folder's: a python job may close it, and its
        number be reused by whatever it opens next. Never while it was being judged: one
        refused in ``__init__`` is left to the runner's sweep (publish.discard)."""
        if self.ident is None:
            return False
        st = os.fstat(self.fd)
        return (st.st_dev, st.st_ino) == self.ident

    def commit(self) -> None:
        if not self._intact():
            raise OSError(errno.EBADF, "the job closed the descriptor of its output's folder")
        os.rename(self.output.name, self.tmp.name, src_dir_fd=self.fd,
                  dst_dir_fd=self.folder_fd)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                if self._intact():  # else left to the runner's sweep (publish.discard)
                    _empty_fd(self.fd)
                    there = os.stat(self.name, dir_fd=self.folder_fd, follow_symlinks=False)
                    if (there.st_dev, there.st_ino) == self.ident:
                        os.rmdir(self.name, dir_fd=self.folder_fd)
        # Closed only if still ours: a number the job closed and reused is the job's (or,
        # reused since, the worker's own), and is left alone.
        for fd, ident in ((self.fd, getattr(self, "ident", None)),
                          (self.folder_fd, self.folder_ident)):
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if ident is None or (st.st_dev, st.st_ino) == ident:
                    os.close(fd)
        _staging_fds.difference_update((self.folder_fd, self.fd))


def _empty_fd(fd: int) -> None:
    """Remove what is in the folder ``fd`` (O_PATH) is open on, without following a link."""
    d = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    try:
        for name in os.listdir(d):
            if stat.S_ISDIR(os.stat(name, dir_fd=d, follow_symlinks=False).st_mode):
                remove_tree(name, dir_fd=d)
            else:
                os.unlink(name, dir_fd=d)
    finally:
        os.close(d)


def _execute(job: RunJob, output: Path, workdir: Path, after_call: Callable[[], None] | None,
             before_check: Callable[[], None] | None, pass_fds: tuple[int, ...],
             held: tuple[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    folder = _HeldFolder(Path(job.tmp_output).parent, held)  # (see check_output)
    try:
        return _execute_held(job, output, workdir, after_call, before_check, pass_fds,
                             folder)
    finally:
        folder.close()


def _execute_held(job: RunJob, output: Path, workdir: Path,
                  after_call: Callable[[], None] | None,
                  before_check: Callable[[], None] | None, pass_fds: tuple[int, ...],
                  folder: _HeldFolder) -> dict[str, Any]:
    spec = job.spec
    inputs = [Path(p) for p in spec.get("inputs", ())]
    params: Mapping[str, Any] = spec.get("params", {})
    try:
        if job.output_kind == "dir":
            output.mkdir()
        kind = spec["kind"]
        if kind == "command":
            fields = run_command(spec["argv"], inputs, output, workdir, pass_fds=pass_fds)
            if fields is not None:
                return fields
        else:
            try:
                if kind == "python":
                    fn = load_callable(spec["callable"], spec.get("pythonpath"))
                    _call(fn, inputs, output, dict(params))
                else:
                    from renderctl.render import inputs as render_inputs

                    render_inputs.memory_ceiling_bytes = job.memory_limit_bytes
                    _call(_renderer(job), inputs, output, params)
            finally:
                if after_call is not None and runs_user_code_here(job):
                    after_call()
        if before_check is not None and (kind == "command" or runs_user_code_here(job)):
            before_check()
        if job.output_kind == "file" and runs_user_code_here(job) and threads_left():
            # A thread the job left running (it cannot be stopped; the worker retires)
            # may hold the output open: its writes after the check would land in the
            # published file, under the hash its done record gives. What is checked and
            # published is a copy made now; the thread keeps the original, unlinked.
            _detach(output)
        fields = {"outcome": Outcome.COMPLETED.value,
                  **check_output(output, job, folder)}
        if job.output_kind == "file":
            fields["owner_tagged"] = tag_output(output, job.token)
        return fields
    except InvalidInput as exc:
        return {"outcome": Outcome.INVALID_INPUT.value, "error": _message(exc, InvalidInput)}
    except InvalidOutput as exc:
        fields = {"outcome": Outcome.INVALID_OUTPUT.value,
                  "error": _message(exc, InvalidOutput)}
        if spec["kind"] == "command":  # what it said is what explains a bad output
            fields["stderr_tail"] = command_tail(workdir)
        return fields
    except BaseException as exc:  # a job's SystemExit or KeyboardInterrupt is its failure
        return {"outcome": Outcome.FAILED.value, "error": _message(exc),
                "traceback_tail": _traceback_tail(exc)}


def _lease_lost(control_dir: str, job: RunJob) -> bool:
    """Whether ``job``'s lease on disk is another claim's, gone, or run out, read from the
    running record's xattr (~5 us). Only a clear no: a lease kept in the record itself (a
    file system without user xattrs) or unreadable is left to the runner's fencing."""
    if not control_dir or not job.token:
        return False
    path = os.path.join(os.path.dirname(control_dir), "running", f"{job.job_id}.json")
    try:
        raw = os.getxattr(path, LEASE_XATTR)
    except FileNotFoundError:
        return True
    except OSError as exc:
        # No lease on it, where ours was set before the job was sent here: another claim's
        # record, between its rename into running/ and its lease (audit CQ: started there,
        # the job ran twice).
        return job.lease_xattr and exc.errno == errno.ENODATA
    fields = lease_xattr_fields(raw, job.job_id) if job.lease_xattr else None
    if fields is None:
        return False
    token, _, _, expires, _ = fields
    return token != job.token or expires < time.time()


def _renderer_target(job: RunJob) -> str:
    """The job's renderer as "module:function": the runner's word for it, else (a worker
    driven without a runner) the catalogue's."""
    if job.target:
        return job.target
    from renderctl.render.registry import all_specs

    plugin = all_specs().get(str(job.spec.get("kind")))
    return plugin.target if plugin is not None else ""


def _renderer(job: RunJob) -> Callable[..., Any]:
    """Import the job's render function, and only that: the catalogue's scan loads every
    installed plugin, inside this job's time and memory (audit CS: another plugin's 3 s
    import timed a job out, its 300 MB table crossed a job's ceiling)."""
    from renderctl.render.base import load_target

    target = _renderer_target(job)
    kind = job.spec.get("kind")
    if not target:
        raise LookupError(f"no renderer of kind {kind!r} is installed here")
    try:
        fn = load_target(target)
    except (Exception, SystemExit) as exc:
        # Named: a bare "SystemExit: 3" or "No module named ..." said nothing of whose
        # (audit EY)
        raise RuntimeError(f"the renderer of kind {kind!r} ({target}) could not be loaded: "
                           f"{type(exc).__name__}: {exc!s:.300}") from exc
    if not callable(fn):
        raise TypeError(f"the renderer of kind {kind!r} ({target}) is "
                        f"{type(fn).__name__!r}, not a function")
    return fn


def _call(fn: Callable[..., Any], inputs: list[Path], output: Path,
          params: Mapping[str, Any]) -> None:
    """Call a job's function; what it returns must not be work left undone."""
    try:
        result = fn(inputs, output, params)
    except BaseException as exc:
        if _worker_pid and os.getpid() != _worker_pid:
            _end_fork(exc)
        raise
    if _worker_pid and os.getpid() != _worker_pid:
        _end_fork(None)
    if isinstance(result, types.CoroutineType) or (
            isinstance(result, types.GeneratorType | types.AsyncGeneratorType)
            and _makes_generators(fn)):
        # Nothing would run: the job "completed" without its output ("did not write its
        # output file"), the reason only in a RuntimeWarning on stderr (audit CD). (A
        # plain function that did its work and returned a generator is not one.)
        if not isinstance(result, types.AsyncGeneratorType):
            with contextlib.suppress(Exception):
                result.close()  # never started: no "was never awaited" warning
        what = ("an async function: it returned a coroutine, which renderctl does not await"
                if isinstance(result, types.CoroutineType) else
                "a generator function: it returned a generator, which renderctl does not run")
        raise TypeError(f"the job's function is {what}; call it from a plain function "
                        "(for an async one, with asyncio.run)")


def _makes_generators(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is a generator function (or an async one): through functools.wraps
    decorators, and a callable object's __call__ (review CJ)."""
    target: Any = inspect.unwrap(fn)
    if not inspect.isfunction(target) and not inspect.ismethod(target) and callable(target):
        target = inspect.unwrap(type(target).__call__)
    return inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target)


def _end_fork(exc: BaseException | None) -> NoReturn:
    """End a process the job forked (os.fork()) that returned from the job's function
    instead of exiting: in our code it went on as a second worker, and its clean-up killed
    the real one (recorded "worker killed by SIGKILL", falsely; audit CD). With the status
    a script's child would end with: 0, its SystemExit's, or 1 after an exception's
    traceback (a plain 0 hid a child's failure from the parent waiting for it; review CG)."""
    code = 0
    if isinstance(exc, SystemExit):
        if isinstance(exc.code, int):  # (sys.exit(True) too: 1, and nothing printed)
            code = int(exc.code)
        elif exc.code is not None:
            # sys.exit("message"): Python prints the message, as a script's child would.
            code = 1
            with contextlib.suppress(BaseException):
                print(exc.code, file=sys.stderr, flush=True)
    elif exc is not None:
        with contextlib.suppress(BaseException):
            traceback.print_exception(exc)
            sys.stderr.flush()
        code = 1
    os._exit(code)


def _detach(output: Path) -> None:
    """Put a copy of ``output`` (as it is now) in its place, a new file: a descriptor open
    on the old one no longer reaches what is published. (A writer that opens the path anew
    is not kept out; it dies with its worker, which retires.)"""
    try:
        src = os.open(output, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return  # none, or not a file: the check says which
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            return
        os.unlink(output)
        dst = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                      stat.S_IMODE(st.st_mode))
        try:
            _copy_all(src, dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _copy_all(src: int, dst: int) -> None:
    """Copy file ``src`` into the empty file ``dst``, in the kernel where it can."""
    try:
        while os.copy_file_range(src, dst, 1 << 30):
            pass
        return
    except OSError:  # not on this file system (a FUSE one, across mounts): by hand
        os.lseek(src, 0, os.SEEK_SET)
        os.lseek(dst, 0, os.SEEK_SET)
        os.ftruncate(dst, 0)
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]


def _renderers_missing() -> bool:
    """Whether a module the fork server preloads is not loaded here: under fork and spawn
    none is, and a fork server whose preload failed on one (it skips an ImportError)
    loaded the rest."""
    return any(name not in sys.modules for name in mpstate.PRELOAD
               if name != "renderctl.forkserver_init")


def _message(exc: BaseException, said_by: type[BaseException] | None = None) -> str:
    """``exc`` as an attempt's error: its type and text, or only its text if it is exactly
    ``said_by``, the type its outcome names already ("invalid_input: InvalidInput: ..."
    said it twice; a job's own subclass keeps its name, which may tell more)."""
    try:
        text = str(exc)
    except BaseException:  # a job's exception whose __str__ raises is still its failure
        text = "<str() of the exception failed>"
    name = type(exc).__name__
    if type(exc) is said_by and text:
        return _cut(text, ERROR_CHARS)
    return _cut(f"{name}: {text}" if text else name, ERROR_CHARS)


# Links of an exception's chain (__cause__/__context__) formatted: a tail of TAIL_LINES
# lines needs far fewer, and formatting a chain 100,000 deep took minutes (quadratic in
# Python's own code), so a job that raised at once was recorded as a timeout (audit CD).
CHAIN_LINKS = 8


def _traceback_tail(exc: BaseException) -> str:
    try:
        _cut_chains(exc, depth=0)
        text = "".join(traceback.format_exception(exc))
    except BaseException as err:  # noqa: BLE001 - a job's exception can break anything
        # One whose __traceback__ or __context__ itself raises: the worker died formatting
        # it, and the job's own error was lost ("worker exited with status 1"; audit CD).
        return f"<the traceback could not be formatted: {type(err).__name__}>\n"
    lines = text.splitlines()[-TAIL_LINES:]
    return "\n".join(_cut(line, ERROR_CHARS // 4) for line in lines) + "\n"


def _cut_chains(exc: BaseException, depth: int) -> None:
    """Cut ``exc``'s chain after CHAIN_LINKS links, and so the chains of the exceptions an
    exception group holds, as far as the traceback module shows them (15 a group, 10 deep:
    a group of chains 100,000 long took as long as one; review CG). (The job is over: its
    exceptions are ours to cut.)"""
    link, links = exc, 0
    while True:
        if isinstance(link, BaseExceptionGroup) and depth < 10:
            for member in link.exceptions[:15]:
                _cut_chains(member, depth + 1)
        up = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
        if up is None:
            return
        link, links = up, links + 1
        if links == CHAIN_LINKS:
            link.__cause__ = link.__context__ = None
            return


def _cut(text: str, limit: int) -> str:
    """``text`` kept to about ``limit`` characters: its start and its end, saying what went;
    a lone surrogate written as its escape.

    A message is copied into every attempt of the record, the event log, the run's line and
    the JUnit report: one exception of megabytes made each of them that big. A lone
    surrogate (an undecodable byte of a file name, in Python) went into events.jsonl and
    the dead/ record as JSON's "\\udcff", which strict decoders (jq, Go) refuse: the whole
    log was unreadable to them (audit CD).
    """
    text = displayable(text)  # (as the command line shows them)
    if len(text) <= limit:
        return text
    head = limit * 3 // 4
    tail = limit - head
    return f"{text[:head]} [... {len(text) - head - tail} characters cut ...] {text[-tail:]}"


def load_callable(target: str, pythonpath: str | None) -> Callable[..., Any]:
    """Import ``module:function`` with the manifest's folder first on ``sys.path``."""
    if pythonpath:
        sys.path.insert(0, pythonpath)
    module_name, _, attr = target.partition(":")
    import importlib

    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj  # type: ignore[no-any-return]


def expand_argv(argv: list[str], inputs: list[Path], output: Path) -> list[str]:
    """Placeholders: ``{input}`` (the first input), ``{inputs}`` (one argument per input,
    only as a whole argument), ``{output}`` (the temporary output path)."""
    out: list[str] = []
    for arg in argv:
        if arg == "{inputs}":
            out.extend(str(p) for p in inputs)
            continue
        if "{input}" in arg and not inputs:
            raise InvalidInput("argv uses {input} but the job has no input")
        # One pass: a path substituted is never looked at again (an output root or name
        # holding "{input}" had the input's path put inside the output's: audit CB).
        out.append(_PLACEHOLDER.sub(
            lambda m: str(output) if m[1] == "output" else str(inputs[0]), arg))
    return out


_PLACEHOLDER = re.compile(r"\{(output|input)\}")


def _program_path(program: str, workdir: Path) -> str | None:
    """Where exec found (or would look for) ``program``: a path is the job's working
    folder's, a bare name PATH's; None if PATH has no such name."""
    if "/" in program:
        return os.path.join(workdir, program)
    return shutil.which(program, path=os.environ.get("PATH", os.defpath))


def _not_found_said(program: str, workdir: Path) -> str:
    """Why exec said ENOENT of ``program``: it is not there, or it is and what it needs to
    run is not (a script's #! interpreter; a binary's loader), which was said as the script
    itself not found (audit FU)."""
    path = _program_path(program, workdir)
    if path is None or not os.path.isfile(path):
        return f"command not found: {program}"
    head = _head(path)
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n")[0].strip().split(b" ")[0].decode(errors="replace")
        return (f"command: {path}: its interpreter {interpreter} (its #! line) was not "
                "found")
    return (f"command: {path} is there, but what it needs to start (its interpreter or "
            "dynamic loader) was not found")


def _head(path: str) -> bytes:
    """The first 512 bytes of the program at ``path`` (none if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(512)
    except OSError:
        return b""


def _is_script_without_interpreter(program: str, workdir: Path) -> bool:
    """Whether ``program`` (found as exec would: _program_path) is text with no #! line."""
    head = _head(_program_path(program, workdir) or program)
    return bool(head) and not head.startswith(b"#!") and b"\0" not in head \
        and not head.startswith(b"\x7fELF")


def _child_setup() -> None:
    # Runs in the forked child before exec: die with the worker (a runner's SIGKILL of the
    # worker must not leave the command running unsupervised).
    from renderctl.proctree import set_parent_death_signal

    if _crash_point is not None:
        _crash_point("worker:command_forked")

    set_parent_death_signal(signal.SIGKILL)
    # The worker's SIGTERM handler (see run_command) is not the command's, and SIGTERM is
    # blocked across the fork: one pending now (sent to the group since) kills the command
    # as it is unblocked, as one after the exec would. (Unblocked with the handler still
    # set, it was taken by the handler's copy here, and the command ran on: review DO.)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def run_command(argv: list[str], inputs: list[Path], output: Path,
                workdir: Path, pass_fds: tuple[int, ...] = ()) -> dict[str, Any] | None:
    """Run an argv (never a shell); None means it exited 0 and the output is to be checked."""
    args = expand_argv(argv, inputs, output)
    err_log, out_log = command_logs(workdir)
    # The runner ends a command's attempt (timeout, cancel) with SIGTERM to our whole group,
    # the command included, and SIGKILL after --kill-grace. Dying of it at once would take
    # the command with us (its parent-death signal is SIGKILL) and cut its grace short:
    # wait for it to act on the signal first, then die of it ourselves. Caught from before
    # the command starts (audit DL: a SIGTERM just after it started killed us at once).
    terminated: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    try:
        with open(err_log, "wb") as fh, open(out_log, "wb") as out:
            ended = _start_and_wait(args, workdir, pass_fds, fh, out, terminated)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if terminated:
        # What the command left (a setsid() process it started on the SIGTERM, say) is
        # ours, as subreaper, only while we live: dead, we would hand it to init, where
        # the runner's kill of our group and tree cannot find it. Kill it first.
        with contextlib.suppress(Exception):
            remove_leftovers(_children_of_threads, LEFTOVER_BOUND_S / 2)
        os.kill(os.getpid(), signal.SIGTERM)
    if isinstance(ended, dict):
        return ended
    code = ended
    tail = command_tail(workdir)
    if code == 0:
        return None  # the output is checked next; a success keeps no log in the record
    # The tool's own last words, in the error every report shows (run's lines and events,
    # `dead list`): "exited with status 3" alone sends the user to `show` for the reason.
    said = _last_line(tail)
    if code < 0:
        return {"outcome": Outcome.CRASHED.value, "signal": -code, "stderr_tail": tail,
                "error": f"command killed by signal {signal.Signals(-code).name}{said}"}
    return {"outcome": Outcome.FAILED.value, "exit_code": code, "stderr_tail": tail,
            "error": f"command exited with status {code}{said}"}


def _start_and_wait(args: list[str], workdir: Path, pass_fds: tuple[int, ...],
                    fh: BinaryIO, out: BinaryIO, terminated: list[int]) -> int | dict[str, Any]:
    """Start the command, capturing into ``out`` and ``fh``, and wait for it: its exit
    status, or the attempt's fields if it could not start. ``terminated``: the SIGTERMs
    the worker's handler took (see run_command)."""
    # Blocked across the fork: the child resets and unblocks it (_child_setup), so that one
    # sent to our group from now on reaches the command. One already sent (pending, or
    # taken by the handler) came before the command was in the group: it does not start.
    # (Passed on to it after the start instead, it was its second SIGTERM when it had had
    # the first directly: review DP.)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if terminated or signal.SIGTERM in signal.sigpending():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # (handled here)
        return {"outcome": Outcome.FAILED.value,
                "error": "ended (SIGTERM) before its command started"}
    try:
        # env: exactly the job's os.environ (see _Environ), not the C-level environment,
        # where an earlier job's bare os.putenv() would otherwise survive.
        proc = subprocess.Popen(args, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=fh, preexec_fn=_child_setup,
                                close_fds=True, pass_fds=pass_fds,
                                env=dict(os.environ))
    except FileNotFoundError:
        return {"outcome": Outcome.FAILED.value, "error": _not_found_said(args[0], workdir)}
    except PermissionError:
        path = _program_path(args[0], workdir)
        what = (f"command: {path} is a folder, not a program"
                if path is not None and os.path.isdir(path) else f"not executable: {args[0]}")
        return {"outcome": Outcome.FAILED.value, "error": what}
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            # The job's argv, the same at every attempt (audit CB: retried until dead
            # with a bare OSError).
            return {"outcome": Outcome.INVALID_INPUT.value,
                    "error": "command: its arguments are too long for the system (an "
                             "argument over 128 KiB, or all of them past the limit; "
                             "pass a list file instead)"}
        if exc.errno in (errno.EAGAIN, errno.ENOMEM):
            # The machine's shortage, not the command's: said as such (it was this
            # function's traceback, read as the job's failure: audit FI). Retried as any
            # failure is: the shortage may be over by then.
            full = full_pids_cgroup()
            return {"outcome": Outcome.FAILED.value,
                    "error": "could not start its command: no process could be created ("
                             + (full if full is not None else
                                f"{os.strerror(exc.errno)}: a limit on processes, a cgroup's "
                                "pids.max or `ulimit -u`, or on memory")
                             + ")"}
        if exc.errno != errno.ENOEXEC:
            raise
        if _is_script_without_interpreter(args[0], workdir):
            return {"outcome": Outcome.INVALID_INPUT.value,
                    "error": f"command: {args[0]} is a script without a #! line"}
        # A binary half copied, or for another machine: perhaps mended by the next
        # attempt (review CC), so failed, saying what it is.
        return {"outcome": Outcome.FAILED.value,
                "error": f"command: {args[0]} is not a format this system can run"}
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # (handled here)
    if _crash_point is not None:
        _crash_point("worker:command_started")
    pidfd = os.pidfd_open(proc.pid)
    try:
        while not select.select([pidfd], [], [], CAPTURE_CHECK_S)[0]:
            bound_capture(fh.fileno())
            bound_capture(out.fileno())
    finally:
        os.close(pidfd)
    return proc.wait()


def _last_line(tail: str | None, limit: int = 200) -> str:
    """': <the last non-blank line of a tail>' (shortened), or '' if there is none."""
    for line in reversed(text_lines(tail or "")):
        line = line.strip()
        if line:
            if len(line) > limit:
                # Cut in the middle, as `top` cuts a cause: a long line's end is often the
                # telling part (a path, then ": No such file or directory"), and cut at the
                # end it was gone (audit FU).
                head = (limit - 3) // 3
                line = line[:head] + "..." + line[-(limit - 3 - head):]
            return ": " + line
    return ""


# An output up to this size is read once for both its hash and its PDF check; a bigger one
# is hashed in chunks and opened by pypdf from the file, which reads only what it needs.
# The check runs in the job's memory slot: reading a 300 MB output whole counted 300 MB
# against the ceiling of a job that never held it (a streaming tool's merge, seen killed
# `memory` at a 200 MB ceiling), and pypdf's own copy doubled it.
CHECK_IN_MEMORY_MAX = 8 * MB


def check_output(output: Path, job: RunJob,
                 folder: _HeldFolder | None = None) -> dict[str, Any]:
    """The output exists and is what it claims (a PDF opens and has a page); hash it.
    ``folder``: the output's folder as the job started, held open since."""
    if job.output_kind == "dir":
        if not output.is_dir():
            _unless_folder_gone(folder)
            raise InvalidOutput("the job did not produce its output folder")
        digest = hashlib.sha256()
        total = 0
        pages = 0
        for p in sorted(output.rglob("*")):
            if not p.is_file() or p.is_symlink():
                continue
            rel = p.relative_to(output).as_posix()
            shown = f"{_output_name(job)}/{rel}"
            sha, size, n = _check_file(p, shown, pdf=p.suffix.lower() == ".pdf")
            pages += n or 0
            digest.update(rel.encode() + b"\0")
            digest.update(bytes.fromhex(sha))
            total += size
        (output / DIR_MARKER).write_text(f"{job.job_id}\n{job.token}\n")
        return {"sha256": digest.hexdigest(), "bytes": total, "pages": pages}
    try:
        os.lstat(output)
    except FileNotFoundError:
        _unless_folder_gone(folder)
        raise InvalidOutput("the job did not write its output file") from None
    if not os.path.isfile(output) or os.path.islink(output):
        raise InvalidOutput("the output is not a regular file")
    sha, size, n_pages = _check_file(output, _output_name(job), pdf=_is_pdf_target(job))
    return {"sha256": sha, "bytes": size, "pages": n_pages}


def _check_file(path: Path, name: str, *, pdf: bool) -> tuple[str, int, int | None]:
    """(sha256 hex, bytes, pages) of one output file, which messages call ``name`` (not
    its temporary's name: audit FU); pages only if it must be a ``pdf``, checked as
    pdf_pages does."""
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_nlink != 1:
            # A hard link the job made to (or from) a file elsewhere, outside the output
            # root perhaps: what is published would change with that file after this check.
            raise InvalidOutput(f"{name}: the file has {st.st_nlink - 1} "
                                "other hard link(s); an output must be a file of its own")
        size = st.st_size
        if size <= CHECK_IN_MEMORY_MAX:
            data = fh.read()
            pages = pdf_pages(data, name) if pdf else None
            return hashlib.sha256(data).hexdigest(), len(data), pages
        sha = hashlib.file_digest(fh, "sha256").hexdigest()
        fh.seek(0)
        pages = pdf_pages(fh, name) if pdf else None
        return sha, size, pages


def _is_pdf_target(job: RunJob) -> bool:
    return str(job.spec.get("output", "")).lower().endswith(".pdf")


def _output_name(job: RunJob) -> str:
    """The output as the user named it (the file checked has a temporary name)."""
    return str(job.spec.get("output", "")) or "the output"


def pdf_pages(source: bytes | BinaryIO, name: str) -> int:
    """Open a PDF with pypdf; InvalidOutput unless it parses and has at least one page.

    ``source``: the file's bytes, read already for the hash, or the file open at its start
    (pypdf then reads only what it needs: a big file); ``name``: what the messages call it."""
    from pypdf import PdfReader

    try:
        stream = io.BytesIO(source) if isinstance(source, bytes) else source
        if not stream.read(1024).lstrip().startswith(b"%PDF-"):
            raise InvalidOutput(f"{name}: not a PDF (no %PDF- header)")
        stream.seek(0)
        n = len(PdfReader(stream).pages)
    except InvalidOutput:
        raise
    except Exception as exc:
        raise InvalidOutput(f"{name}: not a readable PDF: {_message(exc)}") from None
    if n < 1:
        raise InvalidOutput(f"{name}: the PDF has no pages")
    return n
