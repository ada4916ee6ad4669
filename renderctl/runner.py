"""The runner: claims jobs, supervises workers, records every attempt, publishes outputs.

::

    pending/ ─claim (batch; durable with the next commit)─▶ ready ─dispatch (budget)─▶ worker
                                                                               │ RunJob
       ┌──────── Started / Finished / Dropped (batched) ◀── pipe ◀── worker ◀───┘
       ▼                                  (or its sentinel: the worker died)
    completions ─group commit─▶ syncfs ─▶ fence + publish (rename) ─▶ records renamed into
                                done/ dead/ pending/ ─▶ syncfs ─▶ running copies recycled

One process, one thread, one loop. The loop waits on one ``select.poll`` set (kept for its
life) over every worker's pipe and process sentinel plus a self-pipe for signals, with a timeout
that is the next deadline (memory sample, job timeout, kill escalation, lease renewal,
backoff expiry): a dead worker or a finished job wakes it at once; nothing polls on a
fixed sleep. Because nothing but this loop runs in the runner, ``fork`` is safe too.

Actors:

- **WorkerHandle**: one worker process and its slot (cgroup or sampler), the jobs sent to
  it, the one it has started, and why we killed it (if we did, and for which job). A kill
  takes the worker's process group, the worker itself and its whole tree as it is at the
  SIGKILL (a job can leave the group, and start more in a kill grace), frozen first, and,
  with a cgroup guard, every task in its slot.
- **claims**: jobs moved to ``running/`` with a lease, waiting in ``ready`` for a worker
  and for room in the memory budget. A few are claimed ahead (prefetch) so that a worker
  never waits for the runner's disk syncs; how many follows from the observed job length.
- **completions**: finished attempts waiting for the next group commit. Nothing is reported
  done before its output and record are durable; many jobs share one sync.
- **recovery** (at start, and when a lease of a runner we cannot judge expires; the
  verdicts live in recovery.py, which `cancel` with no runner uses too): running jobs of
  a dead runner are returned to pending (a ``crashed`` attempt if the attempt had started,
  nothing charged if it had not), or completed if this attempt's output had already been
  published.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import multiprocessing.connection as mpc
import operator
import os
import select
import signal
import socket
import stat
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, Protocol

from renderctl import mpstate, proctree
from renderctl.clock import SYSTEM_CLOCK, Clock
from renderctl.crashpoints import CRASH_ENV, STOP_ENV, CrashPoints
from renderctl.errors import (
    ExitCode,
    QueueIOError,
    RenderctlError,
    UserError,
    os_error_message,
    signal_exit_code,
)
from renderctl.fsutil import (
    fallocate,
    read_regular,
    remove_tree,
    sync_filesystems,
    unlink_quiet,
)
from renderctl.gate import StartGate
from renderctl.guards import (
    PIDS_MAX_PER_SLOT,
    MemoryGuard,
    OomMark,
    Slot,
    TreeSampler,
    detect_memory_guard,
    enclosing_memory_room,
    full_pids_cgroup,
)
from renderctl.lifecycle import EXPIRED_REASON, Outcome, State
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
from renderctl.metrics import STATE_READ_MAX
from renderctl.mpstate import mp_temp_dir, prestart
from renderctl.policy import ClaimIndex, ForeignLeases, after_attempt, compute_backoff
from renderctl.publish import (
    FULL_ERRORS,
    OutputEscapes,
    OutputRootUnusable,
    Published,
    check_confined,
    discard,
    is_ours,
    make_folders,
    output_folder,
    output_folder_problem,
    owner_token,
    publish,
    queue_identities,
    says_full,
    tmp_output_path,
    tmp_outputs,
)
from renderctl.reaper import Reaper, kill_tree, proc_stat
from renderctl.reaper import children as reaper_children
from renderctl.recovery import (
    QUEUE_FULL_RELEASE,
    QUEUE_IO_RELEASE,
    RELEASED_LOG,
    STARTED_LOG,
    WORKERS_FILE,
    apply_verdicts,
    cancelled_orphan,
    judge_orphan,
    kill_stale_workers,
    queue_failure,
    released_tokens,
    restore_lost_output,
    retired_event,
    started_tokens,
)
from renderctl.render.base import RendererSpec
from renderctl.render.registry import (
    BUILTIN_KINDS,
    all_specs,
    catalogue_stamp,
    rescanned_specs,
    unknown_kind_note,
)
from renderctl.settings import RunnerSettings
from renderctl.store import (
    Claim,
    Holder,
    JobRecord,
    Queue,
    Transition,
    name_prefix,
    parse_token,
    transition_event,
)
from renderctl.worker import (
    CAPTURE_CHECK_S,
    LEFTOVER_ALLOWANCE_BYTES,
    WorkerConfig,
    bound_capture,
    capture_path,
    last_words,
    worker_main,
)

MB = 1024 * 1024
RETIRE_BOUND_S = 5.0  # a worker that said it retires and has not exited by then is killed
CRASH_POINTS = ("claim", "lease", "start", "commit", "publish:before_link",
                "publish:after_link", "commit:placed", "publish:after_done", "dead")
# For tests: the lease length (s) instead of RunnerSettings.lease_s, so that a test can see a
# lease judged (renewed, expired, taken over) in seconds rather than minutes.
LEASE_ENV = "RENDERCTL_TEST_LEASE_S"
# For tests: RunnerSettings.worker_start_timeout_s, so a test sees a stuck start judged.
START_TIMEOUT_ENV = "RENDERCTL_TEST_WORKER_START_S"
# For tests: the tasks a worker slot may hold (guards.PIDS_MAX_PER_SLOT), so that a test's
# fork bomb meets the limit after dozens of processes rather than thousands.
SLOT_PIDS_ENV = "RENDERCTL_TEST_SLOT_PIDS_MAX"
# For tests: PREFETCH_WORK_S, so that a test of the depth's fall can make it deep before
# the fall however loaded the machine (under load a one-byte job measures 2-30 ms, and 40
# ms of them made the depth 2-3 where the test needed several held jobs to send back).
PREFETCH_WORK_ENV = "RENDERCTL_TEST_PREFETCH_WORK_S"


# How long finished attempts may wait for company in a group commit: 10 ms is below what a
# person notices and above a sync's cost here (~0.5-2 ms). Short jobs (more than one
# prefetched per worker) wait up to 50 ms: measured on 2,000 invoices, 10 -> 50 ms cut the
# runner's CPU per job (0.47 -> 0.43 ms) and its sys time by a third. Longer jobs finish too
# rarely to share a commit; their results go out within 10 ms.
COMMIT_WINDOW_S = 0.01
COMMIT_WINDOW_BUSY_S = 0.05
COMMIT_MAX_BATCH = 256
# pending/ is listed again (see _rescan) for jobs no doorbell announced: while the index is
# empty, whenever the folder's mtime moved (checked with one stat per poll); while jobs are
# known, every RESCAN_FULL_S (100,000 pending: a ~75 ms listing a minute, 0.12%).
RESCAN_FULL_S = 60.0
MTIME_SETTLED_NS = 1_000_000_000  # an mtime this recent may hide a later change in its tick
PREFETCH_WORK_S = 0.04  # of short jobs queued per worker (see _prefetch_depth)
NAP_MAX_S = 0.02  # the longest the loop leaves workers' messages unread (see _nap)
# Drain, then exit 128 + n. SIGQUIT (Ctrl-\) is the impatient one: no grace (see
# _on_stop_signal); it used to kill the runner like a crash, charging every running job
# an attempt at the next start for a quit the user chose.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
# The same stop signal again this soon is the same stop: coreutils' timeout passes a signal
# on to its child and to the process group both (a Ctrl-C reaches us a third time, from the
# terminal), and the "second" signal cut the grace of every run under timeout (audit CE).
SAME_STOP_S = 0.2
STOPPED_TOO = "it ended after the runner's stop signal"  # (see Runner._failed_of_stop)
# Jobs queued behind one that has run this long (at least; or STEAL_FACTOR x the recent
# job time) are taken back for an idle worker (see _rebalance).
STEAL_AFTER_S = 0.5
STEAL_FACTOR = 4.0
GATE_RETRY_S = 0.02  # a take-back the worker's start gate refused is tried again this soon
RECV_CHUNK = 1 << 16  # read from a worker's connection at most this much per call
# A worker's largest message is a few hundred KB (errors and tails are capped); a length
# beyond this is not one of ours (see Garbled).
MESSAGE_MAX = 64 << 20
RESCAN_KINDS_S = 5.0  # the plugin catalogue read again at most this often (_accept_claim)
# Room kept for a release log written on a full disk: a line (~40 bytes) a job in flight,
# a worker's running and prefetched jobs, for any --workers.
RELEASE_LOG_ROOM = 256 * 1024
STATE_INTERVAL_S = 1.0  # how often runner.state.json is rewritten for `top` and metrics
STATE_FILE = "runner.state.json"
MAX_START_FAILURES = 5
WORK_ROOT_PREFIX = "renderctl-work-"  # of each runner's folder of job working directories
# control/ files of one runner, by token prefix (holder files: store.HOLDER_FILE)
MP_DIR_PREFIX = "pymp-"  # multiprocessing.util.get_temp_dir()'s folders
WORK_NOTE = "work.{}"  # where its WORK_ROOT_PREFIX folder is, for the next runner to remove
CONFINED_CACHE_MAX = 4096  # output folders remembered as checked (see _check_confined)
BUDGET_SHARE = 0.8  # of MemAvailable at start: leave room for the page cache and the rest
BUDGET_MEASURE_S = 1.0  # the default budget measured again at most this often (_fits_budget)
SHORT_ROOM_BYTES = 128 * 1024 * 1024  # an enclosing cgroup with less left is named as short


def default_budget() -> tuple[int, str]:
    """The default --memory-budget in MB, and what it is, as a message names it: 80% of
    the machine's available memory, or all that the limits of the memory cgroups we run
    in leave (a container's), where that is less. All of it there: its reclaimable page
    cache is counted as room already, and 80% of a 512 MB container's left no room for
    a default 400 MB job (review FJ: every job dead-lettered, where they had run)."""
    import psutil

    machine = int(psutil.virtual_memory().available * BUDGET_SHARE)
    enclosing = enclosing_memory_room()
    if enclosing is not None and enclosing < machine:
        return max(1, enclosing // MB), ("the default: what the limit of the memory cgroup "
                                         "renderctl runs in leaves (a container's)")
    return max(1, machine // MB), "the default: 80% of the available memory"


def default_budget_mb() -> int:
    return default_budget()[0]


def default_workers(budget_mb: int) -> int:
    return max(1, min(os.cpu_count() or 1, budget_mb // 400))


# Open descriptors a runner holds: ~17 of its own, ~7 a worker (its connection, pidfd,
# gate, slot's kept cgroup files...); measured 24, 45 and 129 with 1, 4 and 16 workers.
FDS_BASE = 32
FDS_PER_WORKER = 8
# What a raised limit gives each worker and its job: a worker holds ~26 itself (its
# connection, kept cgroup and /proc files, capture...), the rest is its job's.
FDS_WORKER_ROOM = 256


def ensure_fd_room(workers: int) -> None:
    """Raise the soft open-files limit, ours and the fork server's (whose workers and jobs
    inherit it), when it is below what ``workers`` need, within the hard limit; UserError
    naming both if the hard limit is too low."""
    import resource

    need = FDS_BASE + FDS_PER_WORKER * workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        fits = (hard - FDS_BASE) // FDS_PER_WORKER
        raise UserError(
            f"{workers} worker(s) need about {need} open files, and this process may have "
            f"{hard} at most (`ulimit -n`: {soft}, hard limit {hard}): "
            + (f"run at most {fits} worker(s) (--workers), or raise the limit" if fits >= 1
               else "raise the limit"))
    target = max(need, FDS_WORKER_ROOM)
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    server = mpstate.forkserver_pid()  # (started before the command line was read)
    if server is not None:
        with contextlib.suppress(OSError):
            resource.prlimit(server, resource.RLIMIT_NOFILE, (target, hard))


class WorkerStartError(RenderctlError):
    """Workers keep dying before they are ready: the runner cannot do anything useful."""

    exit_code = ExitCode.IO_ERROR


class Reporter(Protocol):
    """Where the runner tells its story (plain lines, JSON Lines, or the dashboard)."""

    def event(self, ev: Mapping[str, Any]) -> None: ...

    def tick(self, runner: Runner) -> None: ...


class NullReporter:
    """Says nothing."""

    def event(self, ev: Mapping[str, Any]) -> None:
        pass

    def tick(self, runner: Runner) -> None:
        pass


@dataclass
class Assignment:
    """A claimed job on its way through a worker."""

    claim: Claim
    final: Path
    tmp: Path
    output_kind: str
    memory_mb: int
    # (monotonic) when it started, moved later by each pause of the run (Ctrl-Z) while it
    # ran, which counts against no timeout; paused_s is their sum.
    started_mono: float | None = None
    started_wall: float | None = None
    started_worker_mono: float | None = None  # (monotonic) when the worker started it
    paused_s: float = 0.0
    carried_bytes: int = 0  # memory earlier jobs left in its worker (Started.carried_bytes)
    read_mono: float | None = None  # (monotonic) when its result was read (_failed_of_stop)
    cancel_requested: bool = False
    moved: bool = False  # published by rename (the temporary name is gone)
    seq: int = 0  # its number in its worker's stream (renderctl.gate)
    order: int = 0  # its place in the line, in the order of claims (Runner._put_back)

    @property
    def job_id(self) -> str:
        return self.claim.job_id


@dataclass(eq=False)  # identity: a handle is a dict key (see _outgoing)
class WorkerHandle:
    """One worker process and what the runner knows about it."""

    index: int
    proc: Any  # multiprocessing.Process (BaseProcess of the chosen context)
    conn: mpc.Connection
    slot: Slot
    gate: StartGate  # decides, with the worker, whether its queued jobs start
    started_log: str  # where it logs each attempt's start before starting it (recovery)
    work_root: str = ""  # the work root it started in (see Runner._ensure_work_root)
    pid: int | None = None
    pgid: int | None = None
    pgid_start: int | None = None  # its group leader's start time (control/workers.*.json)
    # (monotonic) by when it must say Ready (RunnerSettings.worker_start_timeout_s)
    start_deadline: float | None = None
    start_timed_out: bool = False
    # (monotonic) by when, idle with jobs handed to it, it must start one (see _enforce)
    answer_deadline: float | None = None
    answer_limit_s: float = 0.0
    unresponsive: bool = False  # killed for sitting on its jobs (_judge_answer)
    unsupervised: bool = False  # killed for starting a job we did not hold (_kill_unsupervised)
    queued: deque[Assignment] = field(default_factory=deque)
    current: Assignment | None = None
    assigned_total: int = 0
    halt_cut: int = 0  # its assigned_total when --max-failures took its unstarted jobs back
    # (monotonic) when to try again a take-back its start gate refused (renderctl.gate)
    gate_retry: float = 0.0
    retiring: bool = False
    replaced: bool = False  # its successor was started when it retired
    kill_reason: Outcome | None = None
    # The job the kill was for. The worker may finish it and start its next queued job
    # before the kill lands: that one is not the kill's target and must not get its verdict.
    kill_target: Assignment | None = None
    kill_deadline: float | None = None
    grace_ran_out: bool = False  # SIGKILLed because the kill grace ended (see _killed)
    # Killed as the stop grace ran out (_drain): no verdict on its job, whose own result,
    # if it came first, stands.
    stopped_at_grace: bool = False
    drain_sent: bool = False
    started_any: bool = False
    stale_slot: bool = False  # its slot holds what no job's ceiling allows: use a fresh one
    doomed: list[Any] = field(default_factory=list)  # processes to kill again at death
    sampler: TreeSampler | None = None
    mark: OomMark | None = None
    # Our end of its connection, for sends and reads that never block (Runner._tell and
    # _read_messages), what is still to be sent there, in order, and what has come of a
    # message not yet whole.
    sock: socket.socket | None = None
    # What says it died: a pidfd under fork and spawn (see Runner._watch), else the sentinel
    # (and the pidfd once it has outlived its fork server: see Runner._outlived_server).
    death_fd: int | None = None
    pidfd: int | None = None
    adopted: bool = False  # it outlived its fork server: our child, its pidfd says its end
    unsent: bytearray = field(default_factory=bytearray)
    inbox: bytearray = field(default_factory=bytearray)
    polling_out: bool = False  # its connection is polled for POLLOUT (unsent waits)

    def reserved_mb(self) -> int:
        sizes = [a.memory_mb for a in self.queued]
        if self.current is not None:
            sizes.append(self.current.memory_mb)
        return max(sizes, default=0)

    def load(self) -> int:
        return len(self.queued) + (1 if self.current is not None else 0)


@dataclass(frozen=True)
class RunSummary:
    """What one `run` did."""

    counts: Mapping[str, int]
    wall_s: float
    exit_code: ExitCode
    guard: str
    workers: int
    # CPU this process used (user + system: reading manifests, submitting, supervising), not
    # the jobs': what renderctl itself costs, per job, next to the renders.
    runner_cpu_s: float = 0.0

    @property
    def jobs_per_s(self) -> float:
        n = sum(self.counts.values())
        return n / self.wall_s if self.wall_s > 0 else 0.0


class Runner:
    """Supervises one queue until it is drained (or, with ``follow``, until signalled)."""

    def __init__(self, queue: Queue, settings: RunnerSettings = RunnerSettings(), *,
                 reporter: Reporter | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.q = queue
        if os.environ.get(LEASE_ENV):
            settings = replace(settings, lease_s=_test_number(LEASE_ENV))
        if os.environ.get(START_TIMEOUT_ENV):
            settings = replace(settings,
                               worker_start_timeout_s=_test_number(START_TIMEOUT_ENV))
        self.s = settings
        self._prefetch_work_s = _test_number(PREFETCH_WORK_ENV) \
            if os.environ.get(PREFETCH_WORK_ENV) else PREFETCH_WORK_S
        self.reporter: Reporter = reporter or NullReporter()
        queue.on_quarantine = self.reporter.event  # a corrupt record: said as it is found
        self.clock = clock
        # Delays on time.monotonic(), the clock the loop's deadlines are on (_next_deadline
        # compares next_due() with them), whatever clock the records are stamped by.
        self.index = ClaimIndex(max_delay_s=settings.backoff_max_s, clock=SYSTEM_CLOCK)
        self.workers: dict[int, WorkerHandle] = {}
        self.ready: deque[Assignment] = deque()
        self._claimed = 0  # claims accepted so far: each Assignment's order
        self.completions: list[tuple[Assignment, Finished]] = []
        self.counts: dict[str, int] = {s.value: 0 for s in State if s.terminal}
        self.retries = 0
        # Jobs this run sent back to pending (a retry's backoff, a release), until it ends
        # them: one another command ends meanwhile (`cancel` of a pending job moves it
        # itself) is counted at the end as this run's (see _settle_left_pending). Each with
        # how many attempts it had then: whether the end came with an attempt of its own.
        self._left_pending: dict[str, int] = {}
        self._vanish_check_due = False  # woken in a --follow run: see _tick_follow
        self.stop_signal: int | None = None
        self.stop_deadline: float | None = None
        self.stopped_at: float | None = None  # (monotonic) when the first stop signal came
        self._quit_settles_at: float | None = None  # SIGQUIT blocked until then (see above)
        self.stop_grace_s = 0.0  # what running jobs get from it to finish (--grace; SIGQUIT: 0)
        self._stop_reported = False
        # A second stop signal that cut a grace short, until reported: a run whose jobs
        # were killed 10 s into a 30 s grace said nothing of why (audit BM).
        self.skip_signal: int | None = None
        self._skip_reported = False
        self._suspend_asked = False  # SIGTSTP came: pause the run at the top of the loop
        self._continued = False  # SIGCONT came: continue what a stop of our group stopped
        # Which of SIGTSTP and SIGCONT came last, in the order they came (read from the
        # wake-up fd, which the C-level handler writes as each arrives): a SIGCONT after
        # the Ctrl-Z we have not acted on yet cancels it (see _suspend).
        self._last_tstp_cont: int | None = None
        self.stopped = False  # the loop has ended (the last snapshot says "finished")
        self.wake_cancel = True
        self._woken = False  # SIGUSR1 came (a submit, a cancel): see _forget_vanished
        self._halt_reported = False
        # Why the output folder cannot be written (DESIGN: exit 74, stop, lose nothing): set
        # by the first job that could not be given, or could not write, its output there.
        self.output_io_error: str | None = None
        # Output file systems (st_dev) found full this run, with why: see _folder_faults.
        self._full_devices: dict[int, str] = {}
        # Workers keep failing to start (WorkerStartError's message): halted like the above.
        self.worker_start_error: str | None = None
        # The queue's own file system full or failing under the run (its message): the jobs
        # in flight released through RELEASED_LOG, the summary's exit 74 (see _run_locked);
        # how many were released (None: none in flight; False: the log could not be
        # written, and the next run charges them as after a crash).
        self.queue_io_error: str | None = None
        self.queue_io_released: int | bool | None = None
        self._gates = 0  # start gates made (each worker gets a fresh one)
        self.guard: MemoryGuard | None = None
        if settings.memory_budget_mb:
            self.budget_mb, self.budget_said = settings.memory_budget_mb, "--memory-budget"
        else:
            self.budget_mb, self.budget_said = default_budget()
        self._budget_measured = -math.inf  # (when last measured again: _fits_budget)
        self._info_started_at = 0.0  # (wall) as runner.json says, kept when it is rewritten
        self.n_workers = settings.workers or default_workers(self.budget_mb)
        self.holder: Holder | None = None
        self.token_prefix = ""
        # Started logs of dead workers, each with the attempts in flight at its death: it
        # goes once none of them is left unrecorded (see _drop_moot_logs).
        self._moot_logs: list[tuple[str, set[str]]] = []
        self.reaper: Reaper | None = None
        self._reaper_args: tuple[str, str, str] | None = None  # (see _check_reaper)
        self._subreaper = False  # orphans come to us (see _kill_orphans)
        self.work_root = ""
        self._old_work_roots: list[str] = []  # replaced (see _ensure_work_root); removed at the end
        self._work_root_id: tuple[int, ...] = ()  # (dev, ino, mode, uid) as made
        self._inherited: set[tuple[int, int | None]] = set()  # children before the run
        self._dead_ahead = 0  # results awaiting the commit that will dead-letter their job
        self.exec_times: deque[float] = deque(maxlen=512)
        self._sizing: deque[float] = deque(maxlen=32)  # what sizes the prefetch depth
        self._depth = 1  # adaptive prefetch depth (see _prefetch_depth)
        self._avg_exec = 0.0  # of recent jobs, seconds; 0 until three have finished
        # Running jobs whose lease a runner we cannot judge still held at our start (another
        # host, or a holder file removed by hand). Taken over once the lease is seen not
        # renewed (a live holder renews every lease_s / 3); until then the run is not finished.
        self._foreign = ForeignLeases(min_watch_s=self.s.lease_s / 2,
                                      max_watch_s=self.s.lease_s)
        self.wait_times: deque[float] = deque(maxlen=512)
        self.recent_failures: deque[dict[str, Any]] = deque(maxlen=5)
        self.started_at = 0.0
        # For tests: SIGKILL (RENDERCTL_CRASH_AT) or SIGSTOP (RENDERCTL_STOP_AT) ourselves at
        # one of CRASH_POINTS.
        self.crash_point = CrashPoints(settings.crash_at or os.environ.get(CRASH_ENV),
                                       os.environ.get(STOP_ENV))
        self._next_renew = 0.0
        self._next_poll = 0.0
        self._next_rescan = 0.0  # monotonic; set at start (see _rescan)
        self._pending_seen_ns = -1  # pending/'s mtime at the last rescan, if settled
        self._next_sample = 0.0
        self._next_capture_check = 0.0
        self._next_state = 0.0
        self._ctx: Any = None
        self._wake_r = -1
        self._wake_w = -1
        self._prior_handlers: dict[int, Any] = {}  # of STOP_SIGNALS and SIGTSTP, restored
        self._specs = all_specs()
        # Plugin kinds whose params a job did not fit -> when the catalogue was read again
        # for that (monotonic; see _plugin_params)
        self._params_rechecked: dict[str, float] = {}
        self._catalogue_stamp = catalogue_stamp()  # (see _rescan_due)
        self._rescanned_at = -math.inf
        self._confined: set[tuple[str, str]] = set()  # output folders checked and made
        # No output goes in there (publish.check_confined), however the path leads there.
        self._queue_real = os.path.realpath(queue.path)
        self._committing: list[tuple[Assignment, Finished]] = []  # (see _commit)
        self._released_where_held = False
        # Claims, and starts (a worker's line in its started log), not yet known durable.
        self._unsynced_claims = False
        self._oldest_completion = 0.0
        self._start_failures = 0
        self._poller = select.poll()
        self._polled: dict[int, tuple[WorkerHandle, bool]] = {}  # fd: (worker, is its conn)
        # What must wake the loop even while it naps (see _nap): signals and deaths.
        self._urgent = select.poll()
        self._outgoing: dict[WorkerHandle, list[object]] = {}  # batched by _dispatch
        self._spare_slots: list[Slot] = []  # slots of retired workers, for their successors
        self._parked: list[Slot] = []  # dead workers' slots whose processes are still dying
        self._slot_names = itertools.count()  # w0, w1, ...: each slot made gets the next
        self._next_index = 0  # the highest worker index used so far
        self._successors_due = 0  # retired this dispatch round; spawned at its end

    # -- lifecycle --
    def run(self) -> RunSummary:
        self.holder = Holder.current()
        self.token_prefix = f"{self.holder.pid}-{self.holder.start_time}"
        self.started_at = time.monotonic()
        # `cancel` wakes the lock's holder with SIGUSR1, whose default action kills: ignored
        # from before we hold the lock, handled while we run, and ignored again for good
        # (not restored): a cancel that read our pid while we held the lock may signal us
        # after we released it, while the CLI still prints the summary.
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        summary = self._run_locked(self.holder)
        self.crash_point("released")
        return summary

    def _run_locked(self, holder: Holder) -> RunSummary:
        with self.q.runner_lock(holder):
            self.crash_point("locked")
            # Every committed batch placed first, waiting for the locks as long as it takes
            # (the open gave up after a second; a submit or a dead retry may hold them): a
            # batch left in journal/ would be neither run nor waited for, and a replace cut
            # short would look like a hand-made copy to _settle_copies. Never "all done"
            # (exit 0) with accepted jobs out of pending/: a full disk stops us here (74).
            if self.q.replay_due:  # (else the open just did it all)
                self.q.roll_forward(wait=True)
            unplaced = self.q.unplaced_error()
            if unplaced is not None:
                raise unplaced
            self._install_signals()
            proctree.set_oom_score_adj(-900)  # the supervisor must outlive what it supervises
            pids_max = int(_test_number(SLOT_PIDS_ENV)) if os.environ.get(SLOT_PIDS_ENV) \
                else PIDS_MAX_PER_SLOT
            self.guard = detect_memory_guard(prefer=self.s.memory_guard,
                                             sampling_interval_s=self.s.sample_interval_s,
                                             pids_max=pids_max)
            self._publish_runner_info()
            self._make_work_root()
            self._prepare_release_log()
            # Children we had before the run (a sidecar a container's entrypoint started
            # before it exec'd us): not a job's, never killed as orphans (see _kill_orphans).
            me = os.getpid()
            self._inherited = {(pid, proctree.process_start_time(pid))
                               for pid in reaper_children(me)}
            try:
                # Before any worker: it kills them if we die while one cannot act on its
                # parent-death signal (renderctl.reaper). Started now, its ~10 ms of start-up
                # overlap recovery.
                self._reaper_args = (str(getattr(self.guard, "parent_dir", "") or ""),
                                     str(getattr(self.guard, "pids_parent_dir", "") or ""),
                                     self.work_root)
                self.reaper = Reaper.start(*self._reaper_args)
                with contextlib.suppress(OSError):
                    proctree.set_child_subreaper()
                    self._subreaper = True
                self.recover()
                self.q.load_index(self.index)
                self._next_rescan = time.monotonic() + RESCAN_FULL_S
                self.reporter.event({"event": "runner_started", "pid": holder.pid,
                                     "workers": self.n_workers, "guard": self.guard.name,
                                     "pending": len(self.index),
                                     "budget_mb": self.budget_mb})
                self._start_pool()
                self._loop()
                self._settle_left_pending()
                # The last commit's running copies were retired after its sync (renamed to
                # tmp/free.*); nothing syncs them after us. A power cut would bring them back
                # beside their finished records: settled by the next runner, but a replace
                # replayed meanwhile took such a copy for a running job (store._place_txn).
                self._sync(())
            except BaseException as exc:
                # Whatever stopped us (an error a commit met on the old path, under way or
                # during a stop, before the once-a-poll check saw the move): if our paths
                # lead elsewhere now, the jobs in flight are written off through the folder
                # we hold, as _check_folder does, or the next runner charged them `crashed`
                # (review EF).
                failure = queue_failure(exc)
                with contextlib.suppress(Exception):
                    if not self.q.runner_lock_intact():
                        self._release_where_held()
                    elif failure is not None:
                        # The queue's file system full or failing: nothing can be recorded
                        # the usual way, and the jobs are not at fault (audit EW: charged
                        # `crashed`, dead at max_attempts = 1). Released through the log
                        # made ready at our start; the run ends with its summary and exit
                        # 74 (review EX: EROFS ended it with neither).
                        self.queue_io_released = self._release_where_held(
                            reason=QUEUE_FULL_RELEASE if failure[1] else QUEUE_IO_RELEASE)
                if failure is None:
                    raise
                self.queue_io_error = failure[0]
            finally:
                self.stopped = True
                with contextlib.suppress(Exception):
                    self.reporter.tick(self)  # the final frame, while workers are still known
                self._shutdown()
                if not self._released_where_held and self.token_prefix:
                    with contextlib.suppress(OSError):
                        unlink_quiet(self.q.dir("control")
                                     / RELEASED_LOG.format(self.token_prefix))
        wall = time.monotonic() - self.started_at
        cpu = os.times()
        return RunSummary(dict(self.counts), wall, self._exit_code(), self.guard.name,
                          self.n_workers, runner_cpu_s=cpu.user + cpu.system)

    def _exit_code(self) -> ExitCode:
        if self.queue_io_error is not None:
            return ExitCode.IO_ERROR
        if self.stop_signal is not None:
            return signal_exit_code(self.stop_signal)
        if self.output_io_error is not None or self.worker_start_error is not None:
            return ExitCode.IO_ERROR
        bad = self.counts["dead"] + self.counts["cancelled"] + self.counts["expired"]
        return ExitCode.JOBS_FAILED if bad else ExitCode.OK

    def _install_signals(self) -> None:
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poller.register(self._wake_r, select.POLLIN)
        self._urgent.register(self._wake_r, select.POLLIN)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        # SIGHUP too (the terminal of an interactive run closed, or a session logged out):
        # dying of it would orphan the running jobs, each charged a crashed attempt at the
        # next start; draining returns them uncharged.
        # One the parent left ignored stays ignored (`nohup`: SIGHUP; a script's `cmd &`:
        # SIGINT): the run goes on through what it was started to go on through.
        handlers = {**{sig: self._on_stop_signal for sig in STOP_SIGNALS},
                    signal.SIGTSTP: self._on_suspend_signal,
                    signal.SIGCONT: self._on_continue_signal}
        if self.stop_signal == signal.SIGQUIT:
            # A Ctrl-\ came before we got here (`run`'s submit): as after one of ours, the
            # next quits at once (with a handler here, that took a third).
            del handlers[signal.SIGQUIT]
        self._prior_handlers = {sig: signal.signal(sig, handler)
                                for sig, handler in handlers.items() if not left_ignored(sig)}
        signal.signal(signal.SIGUSR1, self._on_wake_signal)

    def stop(self, signum: int) -> None:
        """Stop as on ``signum`` (one that arrived before run() installed its handlers)."""
        self._on_stop_signal(signum, None)

    def _on_stop_signal(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.stopped_at is not None and now - self.stopped_at < SAME_STOP_S \
                and (signum == self.stop_signal
                     or signal.SIGQUIT not in (signum, self.stop_signal)):
            # The same stop delivered again (coreutils' timeout: to us and to the group), or
            # two stops at once (systemd's SIGTERM and, with SendSIGHUP=yes, SIGHUP): one.
            return
        if signum == signal.SIGQUIT:
            # Quit now: running jobs are killed and released (uncharged) without the grace.
            # A second Ctrl-\ takes the default action at once (quit, core): it stays the
            # way out of a run that does not respond. Not for a copy of the first, within
            # SAME_STOP_S (above): under timeout, the copy it passes on killed the runner,
            # its jobs left in running/ and charged (review CG). So this handler stays
            # until then (_settle_quit puts the default action in its place).
            if self._quit_settles_at is not None and now < self._quit_settles_at:
                return  # a copy of the one that set it
            if self._quit_settles_at is not None or self.stop_signal == signal.SIGQUIT:
                signal.signal(signal.SIGQUIT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGQUIT)
                return
            self._quit_settles_at = now + SAME_STOP_S
        if self.stop_signal is None:
            self.stop_signal = signum
            self.stopped_at = now
            self.stop_grace_s = 0.0 if signum == signal.SIGQUIT else self.s.grace_s
            self.stop_deadline = self.stopped_at + self.stop_grace_s
        else:
            if self.skip_signal is None and self.stop_deadline is not None \
                    and self.stop_deadline > now:
                self.skip_signal = signum
            self.stop_deadline = now  # a second signal skips the grace

    def _settle_quit(self, now: float, *, at_once: bool = False) -> None:
        """After a Ctrl-\\, once its copies have had their time (see _on_stop_signal): the
        default action for the next, which then quits even while the loop is busy."""
        if self._quit_settles_at is None or (now < self._quit_settles_at and not at_once):
            return
        self._quit_settles_at = None
        if signal.getsignal(signal.SIGQUIT) == self._on_stop_signal:
            signal.signal(signal.SIGQUIT, signal.SIG_DFL)

    def _report_stopping(self, signum: int, grace_s: float, *, again: bool = False) -> None:
        """The ``stopping`` event: a stop signal, and a second one that cut the grace."""
        self.reporter.event({"event": "stopping", "signal": _signame(signum),
                             "grace_s": grace_s, **({"again": True} if again else {}),
                             "running": sum(1 for w in self.workers.values()
                                            if w.current is not None)})

    def _on_suspend_signal(self, signum: int, frame: object) -> None:
        self._suspend_asked = True  # acted on between steps of the loop, not inside one

    def _on_continue_signal(self, signum: int, frame: object) -> None:
        self._continued = True  # (the wake-up fd has the loop see it at once)

    def _on_wake_signal(self, signum: int, frame: object) -> None:
        self.wake_cancel = True
        self._woken = True
        self._next_poll = 0.0

    def _publish_runner_info(self) -> None:
        assert self.holder is not None and self.guard is not None
        if not self._info_started_at:
            self._info_started_at = self.clock.wall()
        info = {**self.holder.to_json(), "started_at": self._info_started_at,
                "guard": self.guard.name, "workers": self.n_workers,
                "budget_mb": self.budget_mb}
        self.q.write_runner_info(info)

    def _shutdown(self) -> None:
        self._settle_quit(time.monotonic(), at_once=True)  # a Ctrl-\ must work from here on
        # (The joins below wait on the fork server.) Never the end of the shutdown: out of
        # descriptors (a job lowered our RLIMIT_NOFILE), its /proc read failed, the workers
        # were left alive, and the exit hung for good joining them.
        with contextlib.suppress(Exception):
            mpstate.continue_helpers()
        self._sigkill_workers()
        for w in list(self.workers.values()):
            with contextlib.suppress(Exception):
                if w.adopted:
                    proctree.pidfd_exited(w.pidfd, 5)
                    self._worker_exit_code(w)
                else:
                    w.proc.join(timeout=5)
            with contextlib.suppress(Exception):
                w.slot.close()
            w.gate.close()  # its file goes with work_root
        self.workers.clear()
        self._kill_orphans()  # what the jobs of the workers just killed left
        if self._subreaper:
            with contextlib.suppress(OSError):
                proctree.set_child_subreaper(False)
        self._reaper_args = None  # (not to be started again)
        if self.reaper is not None:
            self.reaper.close()  # our workers are gone: it has nothing left to kill
            self.reaper = None
        for slot in [*self._spare_slots, *self._parked]:
            with contextlib.suppress(Exception):
                slot.close()
        self._spare_slots.clear()
        self._parked.clear()
        if self.guard is not None:
            with contextlib.suppress(Exception):
                self.guard.close()
        if self.work_root:
            for root in (self.work_root, *self._old_work_roots):
                remove_tree(root)
            with contextlib.suppress(OSError):  # (a queue gone read-only: review EX)
                unlink_quiet(self.q.dir("control") / WORK_NOTE.format(self.token_prefix))
        try:
            ours_left = bool(self.token_prefix) and self.token_prefix in self.q.lease_prefixes()
        except OSError:
            ours_left = True  # cannot tell: keep the evidence
        if not ours_left:
            # While a lease of ours is left in running/ (an exit 74, an exception), the next
            # runner's recovery reads these logs to tell an attempt that ran, and is charged,
            # from one that never started: without them, work done would be run again free.
            for log in self.q.dir("control").glob(STARTED_LOG.format(f"{self.token_prefix}.*")):
                with contextlib.suppress(OSError):
                    unlink_quiet(log)
        with contextlib.suppress(OSError):  # (a folder a job put there is not our I/O error)
            unlink_quiet(self._workers_file())
        with contextlib.suppress(OSError):
            unlink_quiet(self.q.path / STATE_FILE)
        with contextlib.suppress(OSError):
            if self.token_prefix and not ours_left:
                self.q.forget_holder(self.token_prefix)  # no lease of ours is left
            self.q.trim_free()
            # Our workers are gone now: their temporaries (and a dead runner's, whose
            # workers were still dying when we started) can go.
            self.q.clean_tmp()
        signal.set_wakeup_fd(-1)
        # Back to what was there before (the CLI's: it still prints the summary and writes
        # the reports), not to SIG_DFL: a repeated Ctrl-C landing now killed the process
        # before it said how the run ended, with the jobs drained all the same.
        for sig, prior in self._prior_handlers.items():
            if sig == signal.SIGQUIT and signal.getsignal(sig) == signal.SIG_DFL:
                continue  # a Ctrl-\ came (see _on_stop_signal): the next still quits at once
            signal.signal(sig, signal.SIG_DFL if prior is None else prior)
        # Still holding the lock: a cancel's wake-up may land until it is released (run()).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        self.crash_point("shutdown")
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- what `top`, the dashboard and metrics read --
    def snapshot(self) -> dict[str, Any]:
        """The runner's live state as plain data (JSON-ready); cheap enough to call per tick."""
        now_mono = time.monotonic()
        running = []
        for w in self.workers.values():
            a = w.current
            if a is None:
                continue
            mem = None
            if w.sampler is not None:
                mem = w.sampler.peak_rss_bytes or None
            else:
                with contextlib.suppress(Exception):
                    mem = w.slot.usage_bytes()
            spec = a.claim.record.spec
            running.append({
                "id": a.job_id, "kind": spec.kind, "pid": w.pid,
                "attempt": a.claim.lease.attempt,
                "elapsed_s": round(now_mono - (a.started_mono or now_mono), 3),
                "timeout_s": spec.timeout_s, "memory_bytes": mem,
                "memory_limit_bytes": spec.memory_mb * MB,
            })
        return {
            "schema": 1,
            "ts": self.clock.wall(),
            "pid": os.getpid(),
            "queue": str(self.q.path),
            "guard": self.guard.name if self.guard else None,
            "workers_desired": self.n_workers,
            "workers_alive": sum(1 for w in self.workers.values() if w.pid is not None),
            "budget_mb": self.budget_mb,
            "uptime_s": round(now_mono - self.started_at, 3),
            "counts": dict(self.counts),
            "retries": self.retries,
            "pending_known": len(self.index),
            # (Never below 0: a wall-clock step back made it "-3594653ms" in `top`.)
            "oldest_pending_age_s": (round(max(0.0, self.clock.wall() - oldest), 3)
                                     if (oldest := self.index.oldest_accepted_at()) is not None
                                     else None),
            # Claimed and not yet counted ended: waiting for a worker, queued in one,
            # running, or finished and waiting for the group commit (which counts it).
            "in_flight": len(self.ready) + sum(w.load() for w in self.workers.values())
            + len(self.completions),
            "stopped": self.stopped,
            "claimed_waiting": len(self.ready),
            # Finished, waiting for the group commit that records their outcome.
            "finishing": len(self.completions),
            # Claimed, not started: waiting for a worker or queued in one (prefetched).
            "not_started": len(self.ready) + sum(len(w.queued) for w in self.workers.values()),
            "running": running,
            "wait_s": _percentiles(self.wait_times),
            "exec_s": _percentiles(self.exec_times),
            "recent_failures": list(self.recent_failures),
            "stopping": self.stop_signal is not None,
        }

    def _check_folder(self) -> None:
        """Stop if the folder we locked was moved away and another put at its path: our
        paths would lead into a queue we do not hold (another runner may). A stat and an
        fstat per poll."""
        if not self.q.runner_lock_intact():
            self._release_where_held()
            raise QueueIOError(f"{self.q.path} is no longer the queue folder this runner "
                               "locked (it was moved or replaced); stopping")

    def _sigkill_workers(self) -> None:
        """SIGKILL every worker and its process group."""
        for w in list(self.workers.values()):
            if w.pgid:
                with contextlib.suppress(OSError, ValueError):
                    proctree.kill_group(w.pgid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                # Not Ready yet: no group of its own to kill. (multiprocessing's kill does
                # nothing once it has taken a dead fork server's EOF for the worker's exit.)
                _sigkill_worker(w)

    def _prepare_release_log(self) -> None:
        """Make our RELEASED_LOG now, with room for a release of every job in flight: it is
        written when the queue's disk is full (see _run_locked), when neither a new file nor
        a block more could be had. Removed at our end if unused (see _run_locked)."""
        if not self.token_prefix:
            return
        with contextlib.suppress(OSError):
            fd = os.open(self.q.dir("control") / RELEASED_LOG.format(self.token_prefix),
                         os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                # FALLOC_FL_KEEP_SIZE: blocks past the end, for the appends to take. Less if
                # that is all there is (review EX: on a nearly full tmpfs the 256 KiB failed
                # whole, and the release then had no block to go to): a block holds ~90.
                for room in (RELEASE_LOG_ROOM, RELEASE_LOG_ROOM // 16, 4096):
                    try:
                        fallocate(fd, room, keep_size=True)
                        break
                    except OSError:
                        continue
            finally:
                os.close(fd)

    def _release_where_held(self, reason: str = "") -> int | bool | None:
        """Our paths lead elsewhere now, so no release can be recorded the usual way: the
        jobs in flight are killed, and their tokens written, through the descriptor of the
        folder we hold wherever it went, as released (recovery.RELEASED_LOG). The next
        runner of that folder then returns them uncharged, as after any stop: they were
        charged `crashed`, and a job with max_attempts = 1 went to dead/ for what its
        operator did (audit DY). Nothing is recorded if the folder was deleted, or if this
        fails: the jobs are then judged as after a crash, as before. ``reason``: written
        beside each token (QUEUE_FULL_RELEASE, QUEUE_IO_RELEASE: the queue's file system
        was full or failing, not moved). Returns how many were released, None if none was
        in flight, False if they could not be recorded."""
        # What ran or waited in a worker, and what completed but is not yet published (the
        # stop's loss, not the job's) or was judged released already (review EB); not an
        # attempt that ended failing, whose charge the release would drop (review DZ).
        tokens = {a.claim.lease.token for w in self.workers.values()
                  for a in (*w.queued, *([w.current] if w.current is not None else []))}
        # On a full queue disk, also an attempt that failed saying the disk is full (its
        # output there, as usual: the next runner would charge it `crashed`).
        tokens |= {a.claim.lease.token for a, fin in (*self.completions, *self._committing)
                   if fin.outcome in (Outcome.COMPLETED.value, Outcome.RELEASED.value)
                   or (reason == QUEUE_FULL_RELEASE
                       and says_full(fin.error, fin.stderr_tail, fin.traceback_tail))}
        if not tokens or not self.token_prefix or self._released_where_held:
            return None
        self._released_where_held = True  # (once: _check_folder's raise passes through run)
        # Dead before they are written off: no job goes on working (or writing its
        # temporary) after its attempt is recorded as released.
        self._sigkill_workers()
        folder = self.q.held_folder_fd()
        if folder is None:
            return False
        control = fd = -1
        try:
            control = os.open("control", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                              dir_fd=folder)
            fd = os.open(RELEASED_LOG.format(self.token_prefix), os.O_WRONLY | os.O_CREAT
                         | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=control)
            os.write(fd, "".join(f"{t}\t{reason}\n" if reason else f"{t}\n"
                                 for t in sorted(tokens)).encode())
            # Protects against: the release lost to a power cut, after which the jobs would
            # be judged crashed after all (the log, then its name in control/).
            os.fsync(fd)
            os.fsync(control)
        except OSError:
            return False  # (deleted, or failing: judged as after a crash)
        finally:
            for d in (fd, control):
                if d >= 0:
                    os.close(d)
        return len(tokens)

    def _write_state(self) -> None:
        # Not fsynced: a display aid, rewritten every second; rename keeps readers whole.
        path = self.q.path / STATE_FILE
        tmp = self.q.dir("tmp") / f"{os.getpid()}.state"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(self.snapshot(), default=str))
            os.replace(tmp, path)

    # -- recovery --
    def recover(self) -> None:
        """Return a dead runner's running jobs to pending (or complete them if published)."""
        assert self.guard is not None
        self._kill_stale_workers()
        with contextlib.suppress(Exception):
            self.guard.cleanup_stale()
        started = started_tokens(self.q)
        released = released_tokens(self.q)
        now = self.clock.wall()
        cancels = set(self.q.cancel_requests())
        transitions: list[Transition] = []
        published_tmps: list[Path] = []
        retired: list[dict[str, Any]] = []
        ended: list[Transition] = []  # (reported as recovered, with the verdicts below)
        superseded: list[tuple[Path, JobRecord]] = []
        for jid in self.q.list_ids(State.RUNNING):
            path = self.q.record_path(State.RUNNING, jid)
            view = self.q.find(jid)
            if view is None:
                continue
            if view.state is not State.RUNNING:
                # A crash after the later record was placed, before the running copy and
                # the output's temporary link were removed: finish that cleanup. (After a
                # power loss the output's publish may be what was lost: put it back first.)
                if view.state is State.DONE:
                    kind = self._specs.get(view.record.spec.kind)
                    restore_lost_output(self.q, view.record, path,
                                        is_dir=kind is not None and kind.output == "dir")
                if view.state.terminal:
                    # Its event is logged as the running copy is retired: not yet.
                    retired.append(retired_event(self.q, view.record, view.state, path))
                    ended.append(Transition(view.record, view.state))
                superseded.append((path, view.record))
                continue
            rec = view.record
            lease = rec.lease
            if lease is not None and not self._orphaned(lease):
                self._foreign.observe(jid, lease.token, lease.expires_at, wall=now,
                                      mono=time.monotonic())
                continue
            t, tmp = self._recover_one(rec, started, released, now,
                                       cancelled=jid in cancels)
            transitions.append(t)
            if tmp is not None:
                published_tmps.append(tmp)
        if superseded:
            # Protects against: a power loss after the unlinks below losing the later record
            # (and the output's publish), which the dead runner may have died before syncing:
            # with the running copy gone as well, the job would be in no folder, or done with
            # its output under a temporary name that nothing would restore.
            self._sync({rec.spec.output_path.parent for _, rec in superseded})
            for path, rec in superseded:
                unlink_quiet(path)
                for stale in tmp_outputs(rec.spec.output_path, rec.spec.id):
                    discard(stale)
        self.q.events.append({"ts": now, **ev} for ev in retired)
        self._apply_recovered(transitions, published_tmps)
        for t in ended:
            # Reported and counted as a verdict is (audit DF: dead-lettered as its runner
            # died, such a job was in no line, count, JUnit report or exit code of the run
            # that recovered it: exit 0, "dead 0", though status said dead 1).
            self._count(t)
            self.reporter.event({"event": "recovered", "job": t.record.spec.id,
                                 "state": t.dst.value})
        self._forget_dead_runners()
        self.q.clean_tmp()
        self.q.adopt_free()

    def _forget_dead_runners(self) -> None:
        """Drop the holder files and started logs of runners that hold no lease any more.

        A runner still named by a lease keeps both: its holder says who it was, and its
        started log is the evidence of which attempt began if we die before taking over."""
        held = self.q.lease_prefixes()
        for log in self.q.dir("control").glob(STARTED_LOG.format("*")):
            # started.<prefix>.log, or started.<prefix>.<n>.log: one per worker we start
            owner = (name_prefix(log.name, STARTED_LOG) or "").partition(".")[0]
            if owner != self.token_prefix and owner not in held:
                unlink_quiet(log)
        self.q.forget_holders(keep=held)

    def _take_over_expired(self, now: float) -> None:
        """Recover the foreign leases (see recover) seen unrenewed for long enough; a renewed
        one (its runner alive after all) is watched again."""
        transitions: list[Transition] = []
        published_tmps: list[Path] = []
        started: dict[str, float | None] | None = None
        released: dict[str, str] = {}
        mono = time.monotonic()
        for jid in self._foreign.due(mono=mono):
            view = self.q.find(jid)
            lease = view.record.lease if view is not None else None
            if view is None or view.state is not State.RUNNING or lease is None:
                self._foreign.forget(jid)  # finished or returned by someone else
                continue
            if not self._foreign.observe(jid, lease.token, lease.expires_at, wall=now,
                                         mono=mono):
                continue
            self._foreign.forget(jid)
            if started is None:
                # Read now, not at our start: its runner may have started the attempt since
                # (it was alive then), and an attempt that started is charged.
                started = started_tokens(self.q)
                released = released_tokens(self.q)
            t, tmp = self._recover_one(view.record, started, released, now)
            transitions.append(t)
            if tmp is not None:
                published_tmps.append(tmp)
        if transitions:
            self._apply_recovered(transitions, published_tmps)
            self._forget_dead_runners()
            self._handle_cancel_requests()  # asked meanwhile: before anything claims them

    def _apply_recovered(self, transitions: list[Transition], published_tmps: list[Path]) -> None:
        """Make recovery's verdicts durable, then drop the temporary names of outputs it found
        published (only now: the done records that replace them as proof are on disk)."""
        apply_verdicts(self.q, transitions, published_tmps)
        for t in transitions:
            self._count(t)
            self.reporter.event({"event": "recovered", "job": t.record.spec.id,
                                 "state": t.dst.value})

    def _orphaned(self, lease: Any) -> bool:
        """Whether the lease's holder is known dead (we hold the runner lock): one here
        that is gone, or one of this kernel under another host name (another container
        here: the lock it would hold is ours; see proctree.holder_dead_to_lock_holder)
        whose runner no longer writes the queue's state file, as a live one does each
        second (two FUSE mounts of a queue let two runners past the lock). Otherwise
        (another host, an unknown holder) only watching the lease can tell, and a lease the
        wall clock says expired may still be renewed."""
        h = lease.holder
        return proctree.holder_dead_to_lock_holder(
            host=h.host, boot_id=h.boot_id, pid=h.pid, start_time=h.start_time or 0) \
            and not (h.host != socket.gethostname() and self._writes_state(h.pid))

    def _writes_state(self, pid: int) -> bool:
        """Whether the queue's state file was written in the last 2 s by a runner of ``pid``
        (in its own pid namespace: ours has written none yet, at recovery). A runner that
        died less than that ago looks alive: its leases are watched as before."""
        try:
            # A regular file only, a state's worth read (a character device put there, its
            # mtime always fresh, was read until memory ran out: review FM).
            raw, st = read_regular(self.q.path / STATE_FILE, STATE_READ_MAX)
            if time.time() - st.st_mtime > 2 * STATE_INTERVAL_S:
                return False
            return bool(json.loads(raw).get("pid") == pid)
        except (OSError, ValueError, AttributeError):
            return False

    def _recover_one(self, rec: JobRecord, started: Mapping[str, float | None],
                     released: Mapping[str, str], now: float, *,
                     cancelled: bool = False) -> tuple[Transition, Path | None]:
        o = judge_orphan(rec, started=started, now=now, specs=self._specs, released=released)
        if o.done is not None:
            return o.done, o.published_tmp  # (a cancel came too late: it completed)
        if cancelled:
            # `cancel` said "cancel requested" and the runner died before acting on it: the
            # cancel stands, as `cancel` itself settles a job with no runner. Charged and
            # judged instead, a job on its last attempt went to dead/ (where `dead retry
            # --all` would have run it again), another back to pending.
            return cancelled_orphan(rec, o, now), None
        if o.crashed is None:
            # It never started (claimed ahead, or the claim was cut short): not charged.
            back = replace(rec, lease=None, reason="returned by recovery (never started)",
                           changed_at=now)
            return Transition(back, State.PENDING, unrun=True), None
        return self._verdict(rec, dict(o.crashed), now), None

    def _workers_file(self) -> Path:
        return self.q.dir("control") / WORKERS_FILE.format(os.getpid())

    def _kill_stale_workers(self) -> None:
        kill_stale_workers(self.q, own=self._workers_file())
        self._remove_dead_work_roots()

    def _remove_dead_work_roots(self) -> None:
        """Remove the job working folders of runners that died (we hold the queue's lock, so
        every other runner of this queue is dead, and so are their workers by now)."""
        for f in self.q.dir("control").glob(WORK_NOTE.format("*")):
            if name_prefix(f.name, WORK_NOTE) == self.token_prefix:
                continue
            with contextlib.suppress(OSError):
                for root in f.read_text().split("\n"):
                    # Only what we would have made: never a path a damaged file points at.
                    if os.path.basename(root).startswith((WORK_ROOT_PREFIX, MP_DIR_PREFIX)) \
                            and os.path.isdir(root) and not os.path.islink(root):
                        remove_tree(root)
            unlink_quiet(f)

    def _record_workers(self) -> None:
        boot = self.holder.boot_id if self.holder is not None else None
        data = [{"pid": w.pid, "pgid": w.pgid, "pgid_start": w.pgid_start, "boot": boot}
                for w in self.workers.values() if w.pgid]
        tmp = self._workers_file().with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self._workers_file())

    # -- the pool --
    def _start_pool(self) -> None:
        self._ctx = prestart(self.s.start_method)
        for i in range(self.n_workers):
            self._spawn(i)
        self._next_index = self.n_workers - 1

    def _note_work_roots(self) -> None:
        # Where our jobs' working folders are, and multiprocessing's own folder (the fork
        # server's socket), for the next runner should we die: they would pile up in /tmp,
        # crash by crash (multiprocessing removes its folder only at a clean exit).
        roots = "".join(f"{r}\n" for r in (self.work_root, *self._old_work_roots))
        (self.q.dir("control") / WORK_NOTE.format(self.token_prefix)).write_text(
            f"{roots}{mp_temp_dir()}\n")

    def _make_work_root(self) -> None:
        self.work_root = tempfile.mkdtemp(prefix=WORK_ROOT_PREFIX)
        st = os.lstat(self.work_root)
        # As made, on whatever file system TMPDIR is (one that keeps no modes shows others)
        self._work_root_id = (st.st_dev, st.st_ino, st.st_mode, st.st_uid)
        self._note_work_roots()

    def _ensure_work_root(self) -> None:
        """Make a fresh work root if a job removed, replaced or re-moded ours (it is the
        parent of the job's working folder, and jobs run as we do): a new worker could not
        start in it, and, worker after worker, the run would stop. One lstat per worker
        start."""
        try:
            st = os.lstat(self.work_root)
            if (st.st_dev, st.st_ino, st.st_mode, st.st_uid) == self._work_root_id:
                return
        except OSError:
            st = None
        old = self.work_root
        self._make_work_root()
        if st is not None and stat.S_ISDIR(st.st_mode):
            # Other workers' jobs may be running in it: removed when we end.
            self._old_work_roots.append(old)
            self._note_work_roots()
        elif st is not None:
            unlink_quiet(Path(old))  # what the job put in its place

    def _spawn(self, index: int, slot: Slot | None = None) -> None:
        assert self.guard is not None
        self._ensure_work_root()
        reused = slot is not None or bool(self._spare_slots)
        if slot is None and not self._spare_slots:
            # Named once for the run, never after the worker: a respawn under a dead
            # worker's index, its slot parked while its processes die, got that same cgroup
            # (open_slot reuses a folder), so the successor ran in the slot being judged,
            # and once emptied it was handed out again beside it: two workers, one ceiling.
            slot = self.guard.open_slot(f"w{next(self._slot_names)}")
        else:
            slot = slot or self._spare_slots.pop()
            # Its last job's ceiling is still set; the new worker must start without it.
            with contextlib.suppress(OSError):
                slot.release_limit()
        inherited = 0
        if reused:
            # What the jobs before left charged here (no process in it now: judged by
            # _slot_verdict), for the new worker to count as theirs, not its own.
            with contextlib.suppress(OSError, ValueError):
                inherited = slot.held_bytes() or 0
        self._gates += 1
        try:
            gate = StartGate(os.path.join(self.work_root, f"gate.{self._gates}"), create=True)
        except OSError as exc:
            # A job filled the work root's file system (TMPDIR: jobs' working folders are
            # there): a halt naming it, running jobs finishing. It was an exception out of
            # the loop, "I/O error: No space left on device", every running job killed.
            with contextlib.suppress(Exception):
                slot.close()
            self._cannot_start_workers(f"cannot start a worker: {os_error_message(exc)}")
            return
        # A log per worker, not one per runner: it goes soon after its worker (see
        # _drop_moot_logs), where one log grew a line per job for the runner's whole life.
        log = str(self.q.dir("control")
                  / STARTED_LOG.format(f"{self.token_prefix}.{self._gates}"))
        # The start below would wait on a fork server left stopped (Ctrl-Z's SIGTSTP it
        # ignores; see _suspend) until start_worker's watch resumed it. ~20 us per start,
        # of 2-20 ms.
        mpstate.continue_helpers()
        cfg = WorkerConfig(slot_path=slot.path, started_log=log,
                           work_root=self.work_root, gate_path=gate.path,
                           control_dir=str(self.q.dir("control")),
                           reaper=self.reaper.identity if self.reaper else None,
                           forked=self.s.start_method == "fork",
                           # (under fork and spawn we are its parent: its parent's death
                           # is ours, always)
                           runner_pid=os.getpid() if self.s.start_method == "forkserver"
                           else 0, inherited_bytes=inherited)
        # (A test stops us here, then stops the fork server: a job's act in that window.)
        self.crash_point("start_worker")
        try:
            proc, parent = start_worker(self._ctx, cfg, name=f"renderctl-worker-{index}")
        except WorkerStartError as exc:
            gate.close()
            with contextlib.suppress(Exception):
                slot.close()
            self._cannot_start_workers(str(exc))
            return
        except BaseException:
            gate.close()
            raise
        with contextlib.suppress(ProcessLookupError, OSError):
            slot.adopt(proc.pid)
        if self.reaper is not None:
            self.reaper.watch(proc.pid)
        w = self.workers[index] = WorkerHandle(index, proc, parent, slot, gate, log,
                                               work_root=cfg.work_root)
        w.start_deadline = time.monotonic() + self.s.worker_start_timeout_s
        self._watch(w)

    def _watch(self, w: WorkerHandle) -> None:
        # One poll set for the runner's life, changed only when workers come and go:
        # multiprocessing.connection.wait() built a selector per call, and Connection.poll()
        # one per message (three or four per job), a visible share of the loop's CPU.
        # (A duplicate: closing it leaves the Connection's descriptor alone.)
        w.sock = socket.socket(fileno=os.dup(w.conn.fileno()))
        w.death_fd = w.proc.sentinel
        with contextlib.suppress(OSError, AttributeError):
            w.pidfd = os.pidfd_open(w.proc.pid)
        if self.s.start_method != "forkserver" and w.pidfd is not None:
            # Under fork and spawn the sentinel is a pipe the worker holds the write end of,
            # and so does whatever its job forks or starts: a job that closed it (a
            # daemonizing library) made a live worker look dead, and the join that followed
            # blocked the runner until the job ended; a job's daemon holding it hid a dead
            # worker until the orphan sweep. A pidfd says when the process itself exits.
            # (Under forkserver the server reports each exit on the sentinel, which also
            # ends when the server dies: then the pidfd takes over, see _outlived_server.)
            w.death_fd = w.pidfd
        for fd, is_conn in ((w.conn.fileno(), True), (w.death_fd, False)):
            self._poller.register(fd, select.POLLIN)
            self._polled[fd] = (w, is_conn)
        self._urgent.register(w.death_fd, select.POLLIN)

    def _unwatch(self, w: WorkerHandle) -> None:
        # Before its fds are closed: a number reused by a later pipe must not look like it.
        for fd in [fd for fd, (x, _) in self._polled.items() if x is w]:
            self._poller.unregister(fd)
            del self._polled[fd]
        with contextlib.suppress(KeyError):
            if w.death_fd is not None:
                self._urgent.unregister(w.death_fd)
        if w.pidfd is not None:
            os.close(w.pidfd)
            w.pidfd = None
        if w.sock is not None:
            w.sock.close()
            w.sock = None
        w.unsent.clear()
        w.inbox.clear()

    # -- the loop --
    def _loop(self) -> None:
        while True:
            if self._continued:
                self._continued = False
                mpstate.continue_helpers()
            if self._suspend_asked:
                if self._continued_since_tstp():
                    self._suspend_asked = False  # continued before we could pause: nothing to do
                else:
                    self._suspend()
            now = time.monotonic()
            if self.stop_signal is not None:
                self._settle_quit(now)
                if not self._stop_reported:
                    self._stop_reported = True
                    self._report_stopping(self.stop_signal, self.stop_grace_s)
                if self.skip_signal is not None and not self._skip_reported:
                    self._skip_reported = True
                    self._report_stopping(self.skip_signal, 0.0, again=True)
                self._drain(now)
                if now >= self._next_poll:
                    self._check_folder()  # (a stop's grace may be long: review EI)
                    self._next_poll = now + self.s.poll_interval_s
                    self.wake_cancel = True
                if self.wake_cancel:
                    # A cancel during the grace is still a cancel: a running job is killed
                    # now rather than left to finish (or be released and run again later).
                    self.wake_cancel = False
                    self._handle_cancel_requests()
                if not any(w.current or w.queued for w in self.workers.values()) \
                        and not self.ready and not self.completions:
                    # Requests that came in for jobs we have released: they are pending
                    # now, and cancelling them there is what was asked.
                    self._handle_cancel_requests()
                    return
            else:
                if now >= self._next_poll:
                    self._check_folder()
                    if self._parked:
                        self._settle_parked()
                    self.q.poll_new(self.index)
                    self._rescan(now)
                    self._next_poll = now + self.s.poll_interval_s
                    self.wake_cancel = True
                if self.wake_cancel:
                    self.wake_cancel = False
                    self._handle_cancel_requests()
                if self._woken:
                    self._woken = False
                    self._forget_vanished()
                if self._foreign:
                    self._take_over_expired(self.clock.wall())
                if self.halted:
                    if self._dead_ahead and self.completions:
                        # The dead events first (the halt comes right after the one that
                        # reached it), and the count they reach is what the commit found.
                        self._commit()
                        self._oldest_completion = 0.0
                    if self.halted:
                        self._halt()
                due = self.index.next_deadline()
                if due is not None and due < self.clock.wall():
                    self._expire_past_deadline()
                self._rebalance(now)  # (jobs stuck behind a long one go before new claims)
                self._trim_surplus(now)
                self._claim()
            self._dispatch()
            self._rebalance(now)
            self._enforce(now)
            if self.completions and not self._oldest_completion:
                self._oldest_completion = now
            if self.completions and self._commit_due(now):
                self._commit()
                self._oldest_completion = 0.0
                continue  # results may have freed room: claim and dispatch before waiting
            if self._unsynced_claims and not self.completions:
                # No commit is coming soon to carry them: make the claims (and starts)
                # durable now.
                self._sync(())
                self._unsynced_claims = False
            if self.stop_signal is None and self._finished():
                self.q.poll_new(self.index)
                self._rescan(now)
                if self._finished():
                    if self.halted:
                        self._halt()  # its event, when the halt came in this very pass
                    return
            if now >= self._next_state:
                self._next_state = now + STATE_INTERVAL_S
                self._write_state()
                self._check_reaper()
                self._kill_orphans()
                # A job runs as we do and may SIGSTOP the fork server: stopped, it reports no
                # worker's death and forks none, and a killed worker's job was never
                # settled (the run went on until signalled). Within a second, it goes on.
                mpstate.continue_helpers()
                if self.s.follow:
                    self._tick_follow()
            self.reporter.tick(self)
            self._wait(self._next_deadline(now))

    def _read_wake(self) -> None:
        """Empty the wake-up fd, noting which of SIGTSTP and SIGCONT it saw last."""
        if self._wake_r < 0:
            return
        with contextlib.suppress(OSError):
            while data := os.read(self._wake_r, 512):
                for signum in reversed(data):
                    if signum in (signal.SIGTSTP, signal.SIGCONT):
                        self._last_tstp_cont = signum
                        break

    def _continued_since_tstp(self) -> bool:
        """Whether a SIGCONT came after the last SIGTSTP (read up to now)."""
        self._read_wake()
        return self._last_tstp_cont == signal.SIGCONT

    def _suspend(self) -> None:
        """Ctrl-Z (SIGTSTP): pause the whole run, jobs included, then stop as asked.

        The terminal stops only its foreground process group: the runner and its fork
        server. The jobs run in process groups of their own, out of its reach; left running
        they would go on unwatched (no sampled memory ceiling, no timeout, no cancel) and,
        on `fg`, those past their timeout would be killed for a pause the user chose. So
        every worker's group is stopped first and continued after, and the pause counts
        against no job's timeout, kill grace or stop grace. A process that left its job's
        group (a daemon that called setsid()) is found in the worker's slot and paused too."""
        self._suspend_asked = False
        groups = [w.pgid for w in self.workers.values() if w.pgid]
        for pgid in groups:
            with contextlib.suppress(OSError):
                proctree.kill_group(pgid, signal.SIGSTOP)
        escaped = self._stop_escapees()
        self.reporter.event({"event": "suspended", "pid": os.getpid(),
                             "running": sum(1 for w in self.workers.values()
                                            if w.current is not None)})
        t0 = time.monotonic()
        self.crash_point("suspend:stopping")
        # A `kill -CONT` (or `fg`) already sent since the Ctrl-Z was for this pause: a stop
        # now would wait for another that never comes (a SIGCONT 50 ms after a SIGTSTP,
        # while the loop was busy starting workers, left the run stopped for good, holding
        # the queue). Then the pause ends at once. (A SIGCONT in the microseconds between
        # this look and the stop is still lost: `fg` again continues the run.)
        if not self._continued_since_tstp():
            proctree.suspend_self()  # an orphaned process group (a service) goes on at once
        paused = time.monotonic() - t0
        # `fg` continues our whole process group; `kill -CONT PID` only us. What else the
        # terminal stopped with us must go on too: multiprocessing's resource tracker, and
        # a worker still starting, not yet in a group of its own (with fork or spawn; the
        # fork server and what it forks ignore SIGTSTP: see forkserver_init).
        starting = [w.proc.pid for w in self.workers.values() if not w.pgid and w.proc.pid]
        for pid in [*mpstate.helper_pids(), *starting]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        for pgid in groups:
            with contextlib.suppress(OSError):
                proctree.kill_group(pgid, signal.SIGCONT)
        _signal_all(escaped, signal.SIGCONT)
        for w in self.workers.values():
            if w.current is not None and w.current.started_mono is not None:
                w.current.started_mono += paused
                w.current.paused_s += paused
            if w.kill_deadline is not None:
                w.kill_deadline += paused
            if w.start_deadline is not None:
                w.start_deadline += paused
            if w.answer_deadline is not None:
                w.answer_deadline += paused
        if self.stop_deadline is not None:
            self.stop_deadline += paused
        self._next_renew = 0.0  # our leases aged meanwhile: renew them first
        self.reporter.event({"event": "resumed", "paused_s": round(paused, 3)})

    def _stop_escapees(self) -> list[Any]:
        """SIGSTOP the jobs' processes outside their worker's group (a setsid() daemon, a
        child in a group of its own), as the slot's cgroup or the sampler knows them; those
        stopped (psutil handles, for the SIGCONT). Read again after each round: one may have
        forked meanwhile."""
        stopped: dict[int, Any] = {}
        for _ in range(3):
            found = []
            for w in self.workers.values():
                if not w.pgid:
                    continue
                try:
                    pids = w.slot.pids()
                except (OSError, ValueError):
                    pids = []
                ours = _processes([p for p in pids if p not in stopped])
                if w.sampler is not None:
                    ours += [p for p in w.sampler.known_processes() if p.pid not in stopped]
                # Not the group's own, which had its signal (and, on `fg`, have their
                # SIGCONT from it: sent a second, a job's SIGCONT handler ran twice).
                found += _outside_group(ours, w.pgid)
            if not found:
                break
            _signal_all(found, signal.SIGSTOP)
            stopped.update((p.pid, p) for p in found)
        return list(stopped.values())

    def _rescan(self, now: float) -> None:
        """Index jobs in pending/ that no doorbell announced: a submit or `dead retry`
        killed between its rename into pending/ and its doorbell, or a doorbell lost to a
        power cut (they are not fsynced). Nothing is added per claim (claims run at
        ~10,000/s): while the index is empty, pending/ holds only what we do not know
        (usually nothing), so it is listed when its mtime moved; while jobs are known, it
        is listed in full every RESCAN_FULL_S."""
        if len(self.index):
            if now < self._next_rescan:
                return
            mtime = self.q.pending_mtime_ns()
        else:
            mtime = self.q.pending_mtime_ns()
            if mtime == self._pending_seen_ns:
                return
        self._next_rescan = now + RESCAN_FULL_S
        # The kernel stamps mtimes with a coarse clock: a rename just after this stat may
        # leave the same mtime. Trust it only once it is older than that could be.
        settled = time.time_ns() - mtime > MTIME_SETTLED_NS
        self._pending_seen_ns = mtime if settled else -1
        self.q.index_unknown_pending(self.index)

    @property
    def halted(self) -> bool:
        """`--max-failures` reached, the output folder cannot be written, or workers cannot
        be started: no more claims; finish what runs, then stop."""
        if self.output_io_error is not None or self.worker_start_error is not None:
            return True
        # Counted as results arrive, not as their group commit lands (up to 50 ms later):
        # meanwhile fast failures went on being claimed and started, and a run told to stop
        # after 5 dead-lettered 40-51 jobs.
        return self.s.max_failures is not None \
            and self.counts["dead"] + self._dead_ahead >= self.s.max_failures

    def _cannot_start_workers(self, problem: str) -> None:
        """Halt, as for an output folder that cannot be written: a job running on a worker
        that did start finishes (this was an exception, whose way out SIGKILLed those jobs,
        each charged a crashed attempt at the next start, and left the claimed ones in
        running/ until then); what is not started goes back to pending, uncharged."""
        if self.worker_start_error is None:
            self.worker_start_error = problem + _shortage_said()

    def _output_io(self, problem: str) -> None:
        if self.output_io_error is None:
            self.output_io_error = problem

    def _halt(self) -> None:
        """`--max-failures` reached, the output folder cannot be written, or workers cannot be
        started: say so (once, after the job that did it), and return what was claimed but
        has not started to pending, uncharged: jobs waiting to be sent, and jobs queued in
        workers, which their start gates settle exactly (as in _rebalance: a job a worker
        has started runs on, the rest never start there)."""
        if not self._halt_reported:
            self._halt_reported = True
            if self.worker_start_error is not None:
                self.reporter.event({
                    "event": "halted", "dead": self.counts["dead"],
                    "worker_start": self.worker_start_error,
                    "reason": f"{self.worker_start_error}; no new jobs are started, running "
                              "ones finish, the rest stay pending (exit 74)"})
            elif self.output_io_error is not None:
                self.reporter.event({
                    "event": "halted", "dead": self.counts["dead"],
                    "io_error": self.output_io_error,
                    "reason": f"cannot write outputs: {self.output_io_error}; no new jobs "
                              "are started, running ones finish, the rest stay pending "
                              "(exit 74)"})
            else:
                self.reporter.event({
                    "event": "halted", "dead": self.counts["dead"],
                    "max_failures": self.s.max_failures,
                    "reason": f"--max-failures {self.s.max_failures} reached: no new jobs "
                              "are started; running ones finish"})
        taken = list(self.ready)
        self.ready.clear()
        for w in self.workers.values():
            if not w.queued or w.queued[-1].seq <= w.halt_cut:
                continue
            self._read_messages(w)  # its Started messages so far: fewer to settle below
            back = self._take_back(w, time.monotonic())
            if back is None:
                continue  # the next pass tries again (see _take_back)
            w.halt_cut = w.assigned_total
            taken.extend(back)
        for a in taken:
            if a.cancel_requested:  # its request is consumed: it must end cancelled here
                self._finish_unrun(a, State.CANCELLED, "cancelled before it started")
            else:
                self._release_unrun(a)

    def _commit_due(self, now: float) -> bool:
        """Commit now, or let more results join the batch (one sync for all of them)?"""
        if len(self.completions) >= COMMIT_MAX_BATCH or self.stop_signal is not None:
            return True
        if now - self._oldest_completion >= self._commit_window():
            return True
        # Nobody is running anything: waiting would only add latency.
        return not any(w.current for w in self.workers.values())

    def _commit_window(self) -> float:
        return COMMIT_WINDOW_BUSY_S if self._prefetch_depth() > 1 else COMMIT_WINDOW_S

    def _finished(self) -> bool:
        if self.s.follow and not self.halted:
            return False
        if self.ready or self.completions or (len(self.index) and not self.halted):
            return False
        if self._foreign and not self.halted:
            return False  # running elsewhere, as far as we can tell: wait to take it over
        return not any(w.current or w.queued for w in self.workers.values())

    def _wait(self, timeout: float | None) -> None:
        nap = self._nap()
        if nap >= 0.001:
            # Workers' messages stay unread for the nap; signals and deaths still wake us.
            self._urgent.poll(math.ceil(min(nap, timeout if timeout is not None else nap) * 1000))
            timeout = 0.0
        ready = self._poller.poll(None if timeout is None else math.ceil(timeout * 1000))
        dead: list[WorkerHandle] = []
        for fd, events in ready:
            if fd == self._wake_r:
                self._read_wake()
                continue
            entry = self._polled.get(fd)
            if entry is None:
                continue  # its worker was handled earlier in this round
            w, is_conn = entry
            if is_conn:
                if events & select.POLLOUT:
                    self._send_unsent(w)
                if events & ~select.POLLOUT:
                    self._read_messages(w)
            elif w not in dead and not self._outlived_server(w):
                dead.append(w)
        for w in dead:
            self._on_death(w)

    def _outlived_server(self, w: WorkerHandle) -> bool:
        """Whether ``w``'s sentinel ended because its fork server died, not it.

        A job can kill the fork server (it is a python job's grandparent). The worker lives
        on as our child (we are a subreaper; see worker._die_with_group), so its pidfd says
        when it exits from now on, and we reap it ourselves (``_worker_exit_code``)."""
        sentinel = w.death_fd
        if w.pidfd is None or sentinel is None or w.adopted or not self._subreaper:
            return False
        if proctree.pidfd_exited(w.pidfd):
            return False  # it has exited: its death, whatever the server did
        w.adopted = True
        for poller in (self._poller, self._urgent):
            with contextlib.suppress(KeyError):
                poller.unregister(sentinel)
        self._polled.pop(sentinel, None)
        w.death_fd = w.pidfd
        self._poller.register(w.pidfd, select.POLLIN)
        self._urgent.register(w.pidfd, select.POLLIN)
        self._polled[w.pidfd] = (w, False)
        mpstate.forget_dead_server()  # (else a zombie until the next worker start)
        return True

    def _worker_exit_code(self, w: WorkerHandle) -> int | None:
        """``w``'s exit status, multiprocessing's way (-N for signal N), once it has exited."""
        if w.pidfd is not None and self._subreaper and (w.adopted or w.death_fd != w.pidfd):
            # It outlived its fork server and died our child, so the server cannot tell its
            # status (multiprocessing, reading the dead server's EOF, takes it for 255):
            # adopted, or its death seen together with the server's (a runner busy
            # elsewhere, or stopped; a CI flake). Reaped through its pidfd, which is ours
            # only then: otherwise None, and the server's report stands.
            code = proctree.reap_pidfd(w.pidfd)
            if code is not None or w.adopted:
                return code
        if w.death_fd != w.pidfd:
            w.proc.join(timeout=1)  # (the fork server's report of the exit status)
        # (With a pidfd the process has exited: exitcode reaps it without waiting; join
        # would wait on the sentinel, which a job's leftover may hold open.)
        return w.proc.exitcode

    def _nap(self) -> float:
        """How long the loop may leave workers' messages unread, in seconds (0: not at all).

        While every worker has jobs queued behind its running one, none can run dry for
        about (queued jobs x recent job time); results wait for the group commit anyway. So
        the loop reads messages every few jobs instead of after each: on a machine whose
        cores all render, every wake-up of the runner takes its time from a render (2,000
        invoices: ~2,800 wake-ups and 1.2-1.5 s of runner CPU; napping: ~1,100 and 0.95-1.1 s)."""
        if self.stop_signal is not None or not self._avg_exec:
            return 0.0
        queued = min((len(w.queued) for w in self.workers.values() if not w.retiring),
                     default=0)
        if not queued or any(w.current is None for w in self.workers.values()):
            return 0.0
        # Half: room to claim and send before one runs dry. Capped: a job's start (its
        # timeout counts from when we read it) and results are never seen much later.
        return min(NAP_MAX_S, queued * self._avg_exec / 2)

    def _next_deadline(self, now: float) -> float | None:
        # The state file too: `top` and metrics read it, and a long --poll-interval would
        # otherwise leave it as old as the last lease renewal (or older, idle).
        deadlines = [self._next_renew, now + self.s.poll_interval_s, self._next_state]
        if any(w.current for w in self.workers.values()):
            deadlines.append(self._next_sample)
        room: bool | None = None  # (asked only when a worker holds a queue: ~3 us)
        for w in self.workers.values():
            if w.current is not None and w.current.started_mono is not None \
                    and w.kill_reason is None:
                # (Once killed, what is awaited is its death, which wakes the loop: a passed
                # timeout kept here made the loop spin, every core's worth, while the death
                # went unreported.)
                deadlines.append(w.current.started_mono + w.current.claim.record.spec.timeout_s)
                steal = w.current.started_mono + self._steal_after()
                if w.queued and steal > now and room is None:
                    room = self._room_elsewhere(now)
                if room and w.queued and steal > now:
                    # (Passed, _rebalance had its chance: what changes that wakes the loop.)
                    deadlines.append(steal)
            for d in (w.kill_deadline, w.start_deadline, w.answer_deadline):
                if d is not None:
                    deadlines.append(d)
            if w.gate_retry > now:  # (one passed was retried, and set again if refused)
                deadlines.append(w.gate_retry)
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        if self._quit_settles_at is not None:
            deadlines.append(self._quit_settles_at)
        if self.completions and self._oldest_completion:
            deadlines.append(self._oldest_completion + self._commit_window())
        deadline = self.index.next_deadline()
        if deadline is not None:  # (1 ms past it: a deadline is passed when "< now")
            deadlines.append(now + max(0.0, deadline + 0.001 - self.clock.wall()))
        due = self.index.next_due()
        watch = self._foreign.next_due()
        if watch is not None:
            deadlines.append(watch)
        if due is not None and due > now:  # (monotonic, as ``now``: see ClaimIndex)
            # One due already was left by this round's claim: no room for it now, and what
            # makes room (a worker's result, its death) wakes the loop. Waited for here,
            # the loop spun, a core's worth, while a retry's backoff ended behind busy
            # workers (audit CH: 3 s of runner CPU in a 6 s run).
            deadlines.append(due)
        return max(0.0, min(deadlines) - now)

    # -- claiming and dispatch --
    def _prefetch_depth(self) -> int:
        """Jobs a worker may hold, the running one included.

        Short jobs get ~40 ms of work queued behind them: enough to cover a group commit
        (~5-20 ms of runner time) and to let the loop nap between reads (see _nap); long or
        not yet measured jobs get none, so no job waits behind a long one while another
        worker is idle."""
        if self.s.prefetch is not None:
            return self.s.prefetch
        if self.s.max_failures is not None:
            # Every start decided by the runner, which knows the failures so far: a worker
            # runs what it holds without asking, and quick jobs queued 15 deep ran through
            # a whole queue of failures (30 dead for --max-failures 3) before one result
            # was read. At most one job per worker then starts after the one that halts.
            return 1
        return self._depth  # recomputed per finished job (_observe_exec), read many times

    def _compute_depth(self) -> int:
        if len(self._sizing) < 3:
            return 1
        recent = self._sizing
        avg = self._avg_exec = sum(recent) / len(recent)
        return max(1, min(self.s.prefetch_max, int(self._prefetch_work_s / max(avg, 1e-4))))

    def _expire_past_deadline(self) -> None:
        """Expire the pending jobs whose deadline passed while they waited (for a worker, or
        behind others), at their deadline rather than when a claim would reach them."""
        for rec in self.q.expire_past_deadline(self.index, crash_hook=self.crash_point):
            self.counts["expired"] += 1
            self.reporter.event({"event": "expired", "job": rec.spec.id})

    def _claim(self) -> None:
        if self.halted:
            return
        if not len(self.index):
            return
        depth = self._prefetch_depth()
        live = [w for w in self.workers.values() if not w.retiring]
        want = sum(max(0, depth - w.load()) for w in live) - len(self.ready)
        if want <= 0:
            return
        assert self.holder is not None
        claims, expired = self.q.claim(self.index, holder=self.holder, lease_s=self.s.lease_s,
                                       limit=want, token_prefix=self.token_prefix,
                                       crash_hook=self.crash_point)
        for rec in expired:
            self.counts["expired"] += 1
            self.reporter.event({"event": "expired", "job": rec.spec.id})
        if claims:
            self._unsynced_claims = True
            self.crash_point("lease")
        for c in claims:
            self._accept_claim(c)

    def _accept_claim(self, c: Claim) -> None:
        spec = c.record.spec
        final = spec.output_path
        kind = self._specs.get(spec.kind)
        if kind is None and self._rescan_due():
            # A plugin installed since this runner read the catalogue (a --follow runner
            # lives for days; `submit` validated the job against what is installed now):
            # read it again. Unread, the job failed every attempt with a KeyError (audit
            # CS).
            self._specs = rescanned_specs()
            kind = self._specs.get(spec.kind)
        misfit: list[str] = []
        if kind is not None and spec.kind not in BUILTIN_KINDS:
            kind, misfit = self._plugin_params(kind, spec.kind, spec.params)
        output_kind = kind.output if kind is not None else "file"
        a = Assignment(c, final, tmp_output_path(final, spec.id, c.lease.token), output_kind,
                       spec.memory_mb)
        if not self._fits_budget(spec.memory_mb, time.monotonic()):
            self._finish_unrun(a, State.DEAD,
                               f"memory_mb {spec.memory_mb} can never fit the memory budget "
                               f"of {self.budget_mb} MB ({self.budget_said}): retry it under "
                               "a larger --memory-budget, or with `dead retry --memory-mb` at "
                               f"most {self.budget_mb}")
            return
        if kind is None:
            # No renderer of that kind here (uninstalled since the submit, or a queue shared
            # with a host that has it): no attempt can succeed until it is installed.
            self._record_now(a, {"outcome": Outcome.INVALID_INPUT.value,
                                 "error": f"kind {spec.kind!r}: no renderer of that kind is "
                                          "installed where this runner runs (`renderctl "
                                          f"kinds` lists them){unknown_kind_note()}; "
                                          "`renderctl dead retry` once it is"})
            return
        if misfit:
            self._record_now(a, {"outcome": Outcome.INVALID_INPUT.value,
                                 "error": f"params do not fit kind {spec.kind!r} as this "
                                          f"runner read its plugin ({kind.target}): "
                                          f"{'; '.join(misfit)}; `renderctl submit "
                                          "--replace` it with params that do (`renderctl "
                                          "kinds`), or, if the plugin was upgraded since "
                                          "this runner started, restart the runner and "
                                          "`renderctl dead retry` it"})
            return
        key = (spec.out_root, str(final.parent))
        try:
            if key not in self._confined or not os.path.isdir(key[1]):
                # Confined before anything is made, and before the worker writes there: a
                # folder that exists may be a symlink out of the root (isdir() follows it),
                # which must neither get folders made at its target nor have their errors
                # blamed on the output folder. One checked earlier is checked and made
                # again once it is gone (removed, or the root re-pointed elsewhere during a
                # long --follow run): a stat per claim, not a failed attempt.
                self._confined.discard(key)
                self._check_confined(spec.out_root, final)
                self.crash_point("folders")
                make_folders(spec.out_root, final.parent)
        except (OutputEscapes, OSError) as exc:
            self._confined.discard(key)  # not made: the next claim there checks again
            if isinstance(exc, OutputRootUnusable) or (
                    isinstance(exc, OSError) and exc.errno in FOLDER_IO_ERRNOS):
                # The folder's fault, not the job's: it never ran, so nothing is charged.
                self._output_io(f"{exc.filename or final.parent}: {exc.strerror}")
                self._release_unrun(a)
                return
            self._record_now(a, {"outcome": Outcome.INVALID_OUTPUT.value,
                                 "error": f"output path: {_path_problem(exc, final)}"})
            return
        if not c.record.attempts:
            # Acceptance to first attempt, as the metric has it: a retry's claim (after its
            # backoff) or a released job's re-claim measured the backoff or the outage.
            self.wait_times.append(max(0.0, self.clock.wall() - c.record.accepted_at))
        self._claimed += 1
        a.order = self._claimed
        self.ready.append(a)

    def _fits_budget(self, memory_mb: int, now: float) -> bool:
        """Whether a job of ``memory_mb`` fits the memory budget alone. Where it does not, a
        default budget is measured again first (at most once every BUDGET_MEASURE_S), and
        raised to what it finds if that is more, as a runner started now would take it:
        measured only as we started, it stayed as small as the memory free then for our
        whole life (audit FQ: a --follow runner started while another runner's jobs held
        memory dead-lettered every 400 MB job as never fitting a 367 MB budget, however
        long ago that memory was freed). Never lowered: a job that fitted stays fitting."""
        if memory_mb <= self.budget_mb:
            return True
        if not self.s.memory_budget_mb and now >= self._budget_measured + BUDGET_MEASURE_S:
            self._budget_measured = now
            mb, said = default_budget()
            if mb > self.budget_mb:
                self.budget_mb, self.budget_said = mb, said
                with contextlib.suppress(OSError):
                    if self.q.runner_lock_intact():  # (not into a folder put in our place)
                        self._publish_runner_info()  # (status reads the budget there)
        return memory_mb <= self.budget_mb

    def _plugin_params(self, kind: RendererSpec, name: str, params: Mapping[str, Any]
                       ) -> tuple[RendererSpec | None, list[str]]:
        """A plugin kind's spec and what in ``params`` does not fit it (as validate says it),
        after reading the catalogue again if that is the first misfit of the kind for a
        while (a distribution installed since may provide it now). A plugin upgraded since
        its import is not imported again here (see rescanned_specs): the runner restarts."""
        from renderctl.manifest import params_problems

        misfit = params_problems(kind, params)
        if not misfit:
            return kind, misfit
        now = time.monotonic()
        if now >= self._params_rechecked.get(name, -math.inf) + RESCAN_KINDS_S:
            self._params_rechecked[name] = now
            self._specs = rescanned_specs()
            again = self._specs.get(name)
            if again is None:
                return None, []
            kind, misfit = again, params_problems(again, params)
        return kind, misfit

    def _rescan_due(self) -> bool:
        """Whether to read the plugin catalogue again for a kind ours does not know: at
        once if sys.path's folders changed since the last read (something was installed),
        else at most once per RESCAN_KINDS_S (a file system whose folder times are coarse).
        A scan per claim cost 0.5 s each behind a slow plugin (review CP); a pause alone
        dead-lettered the jobs of a plugin installed just after (review CR)."""
        now = time.monotonic()
        stamp = catalogue_stamp()
        if stamp == self._catalogue_stamp and now < self._rescanned_at + RESCAN_KINDS_S:
            return False
        self._catalogue_stamp, self._rescanned_at = stamp, now
        return True

    def _dispatch(self) -> None:
        if self.stop_signal is not None:
            return
        depth = self._prefetch_depth()
        try:
            self._dispatch_ready(depth)
        finally:
            # One message per worker per round: a pipe write wakes the worker, and cost the
            # runner ~60 us each when made per job.
            for w, msgs in self._outgoing.items():
                self._tell(w, msgs[0] if len(msgs) == 1 else tuple(msgs))
            self._outgoing.clear()
        # Successors of workers retired this round, after the jobs went out: a spawn blocks
        # this thread for 15-20 ms, which must not hold back the messages above.
        while self._successors_due and self.worker_start_error is None:
            self._successors_due -= 1
            self._next_index += 1
            self._spawn(self._next_index)

    def _dispatch_ready(self, depth: int) -> None:
        if self.halted:
            return  # (what is ready goes back to pending: _halt)
        now = time.monotonic()
        # Workers holding jobs, a retiring one working off its queue included: --workers is
        # the cap on jobs at once. A successor started early (see _send) waits for its
        # predecessor's last job before it gets one; before, it took one at once, and with
        # --max-jobs-per-worker 1 eight jobs ran at a time under --workers 2.
        busy = sum(1 for w in self.workers.values() if w.load())
        while self.ready:
            a = self.ready[0]
            if a.cancel_requested:
                self.ready.popleft()
                self._finish_unrun(a, State.CANCELLED, "cancelled before it started")
                continue
            total = sum(w.reserved_mb() for w in self.workers.values())
            best: WorkerHandle | None = None
            for w in self.workers.values():
                if w.pid is None or w.retiring or w.load() >= depth \
                        or w.kill_reason is not None:
                    # (Doomed: a job sent there ran until the kill landed, up to the whole
                    # kill grace, and was then released and run again; audit CD.)
                    continue
                if not w.load() and busy >= self.n_workers:
                    continue
                if w.current is not None and self._overdue(w.current, now):
                    continue  # nothing waits behind a job already overdue (see _rebalance)
                after = total - w.reserved_mb() + max(w.reserved_mb(), a.memory_mb)
                if after > self.budget_mb:
                    continue
                if best is None or w.load() < best.load():
                    best = w
            if best is None:
                return
            self.ready.popleft()
            busy += not best.load()
            self._send(best, a)

    def _steal_after(self) -> float:
        return max(STEAL_AFTER_S, STEAL_FACTOR * self._avg_exec)

    def _overdue(self, a: Assignment, now: float) -> bool:
        """Whether running job ``a`` has run for longer than jobs lately take."""
        return a.started_mono is not None and now >= a.started_mono + self._steal_after()

    def _stuck(self, w: WorkerHandle, now: float) -> bool:
        """Whether ``w`` has jobs queued behind one that is overdue."""
        return bool(w.queued) and w.current is not None and w.kill_reason is None \
            and self._overdue(w.current, now)

    def _room_elsewhere(self, now: float) -> bool:
        """Whether some worker not stuck on an overdue job could take one more now."""
        depth = self._prefetch_depth()
        return any(w.pid is not None and not w.retiring and w.kill_reason is None
                   and w.load() < depth
                   and not (w.current is not None and self._overdue(w.current, now))
                   for w in self.workers.values())

    def _rebalance(self, now: float) -> None:
        """Take jobs queued in a worker stuck on a long job back for one with room.

        Prefetching short jobs (see _prefetch_depth) bets that the running one is short too;
        when it turns out long, the jobs behind it would wait for it while another worker
        could run them. The worker reads messages only between jobs, so the two settle
        which queued jobs it has started through its start gate (renderctl.gate): those
        stay, the rest are ours, and it will never start them. No job runs twice. Called
        before each claim too: taken back, they go first (they are older), where a worker
        with room only when idle left them behind a backlog's newer jobs, for the whole of
        the long one (audit CI: 5 s behind a 5 s job while the other worker took newer).
        Not when halted: no worker may start them, and _halt takes them back for pending."""
        if self.stop_signal is not None or self.halted or self.ready:
            return
        # The idle worker looked for only when some worker holds more than its share: this
        # runs twice per loop turn, and in the usual case no worker does (one len per worker).
        idle = self._idle_worker() if any(
            self._overfull(w) for w in self.workers.values()) else None

        def needs(w: WorkerHandle) -> bool:
            return self._stuck(w, now) or (idle is not None and idle is not w
                                           and self._overfull(w) and self._could_move(w, idle))

        if not any(needs(w) for w in self.workers.values()) or not self._room_elsewhere(now):
            return
        for w in self.workers.values():
            if not needs(w):
                continue
            # Look again with its messages read: it may have finished that job and started
            # the next one since the loop last read them (a nap, a group commit), and then
            # nothing needs taking back.
            self._read_messages(w)
            if not needs(w):
                continue
            self.crash_point("rebalance")
            self._requeue(w, now, "queued behind a long job" if self._stuck(w, now)
                          else "more queued than its share")
        if self.ready:
            self._dispatch()

    def _trim_surplus(self, now: float) -> None:
        """Return to pending the jobs a worker holds, not started, when it holds more than
        twice the prefetch depth (all but the depth's worth, which stay first in line).
        Sent while recent jobs were instant (a run of quick ones),
        slower ones held each worker's next seconds, and a higher priority (itself claimed
        into the back of that line), or a retry come due, waited behind them all, none
        overdue and no worker idle (audit EJ: a priority-10 job 4 s behind 17 others; a
        0.2 s backoff kept 2.3 s). In pending, the claim order places them again (their
        acceptance order kept), and the workers are filled to the depth as for any claim.
        Twice: a depth that wavers by one sends no job back and forth (a record written
        each way). Not for an explicit --prefetch, whose depth never changes."""
        if self.stop_signal is not None or self.halted or self.s.prefetch is not None:
            return
        depth = self._prefetch_depth()
        if not any(len(w.queued) > 2 * depth for w in self.workers.values()):
            return
        for w in list(self.workers.values()):
            if w.kill_reason is not None or len(w.queued) <= 2 * depth:
                continue
            self._read_messages(w)  # (it may have started some since the loop looked)
            if w.kill_reason is not None or len(w.queued) <= 2 * depth:
                continue
            self.crash_point("rebalance")
            taken = self._take_back(w, now)
            if not taken:
                continue  # (None: its gate is held; tried again next turn)
            # The first ``depth`` stay first in line (no record written); the rest go back.
            self._put_back(taken[:depth])
            back: list[Assignment] = []
            for a in taken[depth:]:
                if a.cancel_requested:
                    self._finish_unrun(a, State.CANCELLED, "cancelled before it started")
                elif self._holds(a.claim):
                    back.append(a)
                else:
                    self._fenced(a)
            self._send_back_to_pending(w, back)
        if self.ready:
            self._dispatch()

    def _send_back_to_pending(self, w: WorkerHandle, back: list[Assignment]) -> None:
        """Return claims ``w`` never started to pending, uncharged, with one batch's syncs
        (review EL: a record and its syncs each, and runs whose job lengths jump sent
        hundreds back)."""
        if not back:
            return
        wall = self.clock.wall()
        owner: dict[int, Assignment] = {}
        transitions: list[Transition] = []
        for a in back:
            rec = replace(a.claim.record, lease=None, changed_at=wall,
                          reason="prefetched, then returned unstarted (its worker held more "
                                 "than the prefetch depth allowed)")
            t = Transition(rec, State.PENDING, unrun=True)
            owner[id(t)] = a
            transitions.append(t)
        dropped = {id(t) for t in self.q.finish(
            # (The records placed in pending/ and synced, the running copies still there.)
            transitions, crash_hook=lambda _: self.crash_point("trim:placed"),
            held=lambda t: self._holds(owner[id(t)].claim))}
        for t in transitions:
            if id(t) in dropped:
                self._fenced(owner[id(t)])
                continue
            self._count(t)
            self.reporter.event({"event": "requeued", "job": t.record.spec.id, "worker": w.pid,
                                 "reason": "back to pending: prefetched deeper than the "
                                           "depth now allows"})

    def _overfull(self, w: WorkerHandle) -> bool:
        """Whether ``w`` holds more jobs queued than the prefetch depth allows now: sent
        while jobs looked instant (three 1 ms results made the depth 32), they turned out
        0.4 s each, too short for any to be overdue, and one worker held 9 s of work while
        the other sat idle (audit DH)."""
        return w.kill_reason is None and len(w.queued) > self._prefetch_depth()

    def _idle_worker(self) -> WorkerHandle | None:
        """A live worker that holds no job at all, and may be given one (--workers counts
        the workers holding jobs), if there is one."""
        if sum(1 for w in self.workers.values() if w.load()) >= self.n_workers:
            return None
        return next((w for w in self.workers.values()
                     if w.pid is not None and not w.retiring and w.kill_reason is None
                     and not w.load()), None)

    def _could_move(self, w: WorkerHandle, idle: WorkerHandle) -> bool:
        """Whether, once what ``w`` has not started is taken back, the first of it (the
        oldest, dispatched first) would fit the memory budget on ``idle`` beside what runs:
        taken back when it could not, it went back to ``w`` (review DI: nine take-backs, and
        the idle worker never ran one). ``w`` then reserves only its running job."""
        others = sum(x.reserved_mb() for x in self.workers.values() if x is not w)
        kept = w.current.memory_mb if w.current is not None else 0
        return others + kept + w.queued[0].memory_mb <= self.budget_mb

    @staticmethod
    def _take_back(w: WorkerHandle, now: float) -> list[Assignment] | None:
        """The jobs queued in ``w`` that it has not started, removed from it: what it started
        by now stays with it; the rest it will never start (renderctl.gate). It answers each
        with Dropped as it comes to it, which is then ignored. None while the worker holds
        its gate (starting a job, or stopped doing so): tried again at ``w.gate_retry``."""
        started = w.gate.revoke(w.assigned_total)
        if started is None:
            w.gate_retry = now + GATE_RETRY_S
            return None
        taken = [a for a in w.queued if a.seq > started]
        w.queued = deque(a for a in w.queued if a.seq <= started)
        return taken

    def _requeue(self, w: WorkerHandle, now: float, reason: str) -> bool:
        """Take back what ``w`` has queued and not started, first in line for the others."""
        taken = self._take_back(w, now)
        if not taken:
            return False
        self._hand_back(w, taken, reason)
        return True

    def _hand_back(self, w: WorkerHandle, taken: list[Assignment], reason: str) -> None:
        """Jobs taken back from ``w`` (_take_back), first in line for the others, each said."""
        self._put_back(taken)
        for a in taken:
            self.reporter.event({"event": "requeued", "job": a.job_id, "worker": w.pid,
                                 "reason": reason})

    def _put_back(self, back: Iterable[Assignment]) -> None:
        """Return jobs a worker did not start to the front of the line, in the order they
        were claimed, with those put back before them: jobs handed back in turns (a
        retiring worker's, then those sent to it meanwhile; two workers') ran last first,
        each turn put in front of the one before."""
        back = list(back)
        if not back:
            return
        last = max(a.order for a in back)
        while self.ready and self.ready[0].order < last:
            back.append(self.ready.popleft())
        back.sort(key=operator.attrgetter("order"))
        self.ready.extendleft(reversed(back))

    def _take_back_doomed(self, w: WorkerHandle, now: float) -> None:
        """A worker we are killing keeps none of the jobs queued in it that it has not
        started: they go to another worker now. A job that handles the SIGTERM of a
        timeout survives it (so does its worker, until the grace ends), and the worker then
        started the next queued job, which was killed with it after up to the whole grace
        and run again, its effects twice (audit CD)."""
        if self._requeue(w, now, "its worker is being killed"):
            self._dispatch()

    def _send(self, w: WorkerHandle, a: Assignment) -> None:
        spec = a.claim.record.spec
        kind = self._specs.get(spec.kind)
        msg = RunJob(job_id=spec.id, attempt=a.claim.lease.attempt, token=a.claim.lease.token,
                     spec=spec.to_json(), tmp_output=str(a.tmp), output_kind=a.output_kind,
                     memory_limit_bytes=spec.memory_mb * MB, expires_at=_expires_at(a),
                     seq=w.assigned_total + 1, target=kind.target if kind is not None else "",
                     lease_xattr=self.q.leases_in_xattrs)
        a.seq = msg.seq
        w.queued.append(a)
        w.assigned_total += 1
        out = self._outgoing.setdefault(w, [])
        out.append(msg)
        if w.assigned_total >= self.s.max_jobs_per_worker and not w.retiring:
            w.retiring = True
            out.append(Stop())
            # Start its successor now (at the end of this dispatch round), while it works off
            # its queue: replacing it only after it exited left a gap of ~40 ms of lost worker
            # time per recycle (the spawn, the Ready, the first job's warm-up), ~6% of a batch
            # of 5 ms renders.
            w.replaced = True
            self._successors_due += 1

    def _tell(self, w: WorkerHandle, msg: object) -> None:
        """Send to a worker, never waiting for it to read: framed as Connection.send frames
        it (the worker reads with Connection.recv), and what its socket cannot take now is
        kept, in order, and sent as the loop sees the socket writable.

        A blocking send waited until the worker read its pipe, which it does only between
        jobs: a job with a big spec (1,000 inputs, long params; over ~180 KB) prefetched
        behind a long-running one held the whole loop for that job's length (no cancel,
        timeout, signal or other worker's result seen; measured: a cancel took 7.2 s), and
        a worker stopped from outside held it for good."""
        data = ForkingPickler.dumps(msg)
        # (Connection's framing: a signed 32-bit length; a manifest is at most 8 MB.)
        w.unsent += struct.pack("!i", len(data))
        w.unsent += data
        self._send_unsent(w)

    def _send_unsent(self, w: WorkerHandle) -> None:
        while w.unsent and w.sock is not None:
            try:
                n = w.sock.send(w.unsent, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
            except BlockingIOError:
                if not w.polling_out and w.conn.fileno() in self._polled:
                    self._poller.modify(w.conn.fileno(), select.POLLIN | select.POLLOUT)
                    w.polling_out = True
                return
            except OSError:
                # It died: its sentinel will say so, and its queued jobs go to another worker.
                w.unsent.clear()
                break
            del w.unsent[:n]
        if w.polling_out:
            w.polling_out = False
            with contextlib.suppress(KeyError, OSError):
                self._poller.modify(w.conn.fileno(), select.POLLIN)

    # -- messages from workers --
    def _read_messages(self, w: WorkerHandle) -> None:
        """Handle every whole message the worker has sent, never waiting for the rest of one.

        Connection.recv() blocked until a message was whole, and Connection.send writes one
        over 16 KB (a failure's error and traceback in wide characters) in two writes: a
        worker stopped between them (SIGSTOP, a freezer, a debugger) froze the whole loop
        for good (no timeout, cancel, signal or other worker seen). What has come of a
        message is kept until the rest does, as _tell keeps what could not be sent."""
        while w.sock is not None:
            try:
                chunk = w.sock.recv(RECV_CHUNK, socket.MSG_DONTWAIT)
            except OSError:  # (BlockingIOError: nothing more now)
                break  # and if it died, its sentinel reports the death
            if not chunk:
                self._conn_closed(w)
                break
            w.inbox += chunk
            if len(chunk) < RECV_CHUNK:
                break  # all there was (more, later, wakes the loop's poll again)
        try:
            while (msg := _take_message(w.inbox)) is not None:
                self._on_message(w, msg)
        except Garbled:
            # Nothing more from it can be read: kill it, charging its job (whatever wrote
            # into its connection ran there), not the run (this raised out of the loop).
            w.inbox.clear()
            if w.kill_reason is None:
                self._kill(w, Outcome.FAILED)

    def _conn_closed(self, w: WorkerHandle) -> None:
        """The worker's end of its connection is closed (a python job closed the worker's
        descriptors; or it is exiting): stop polling it. A closed socket polls readable at
        once, every pass, and the loop ran at 100% CPU until the worker's sentinel fired,
        for as long as the job ran. The sentinel (still polled) tells of its end."""
        fd = w.conn.fileno()
        if fd in self._polled:
            self._poller.unregister(fd)
            del self._polled[fd]

    def _on_message(self, w: WorkerHandle, msg: object) -> None:
        if isinstance(msg, tuple):  # a worker's batch, in the order it happened
            for m in msg:
                self._on_message(w, m)
            return
        if isinstance(msg, Started):
            a = self._pop_queued(w, msg.seq)
            if a is None:
                self._kill_unsupervised(w, msg)
                return
            # The worker logged the start before telling us; until that line (and the
            # claim) is on the disk, a crash of the whole machine (a power cut, or the job
            # itself bringing the host down) loses the evidence, and recovery returns the
            # job uncharged: a job that takes the machine down every time it runs would
            # then never reach max_attempts, and take it down at every boot. Synced with
            # the next commit, or at once when none is coming (the loop, below _commit).
            self._unsynced_claims = True
            a.started_mono = time.monotonic()
            a.started_wall = msg.wall
            a.started_worker_mono = msg.mono
            a.carried_bytes = msg.carried_bytes
            w.current = a
            w.started_any = True
            if w.sampler is not None:
                w.sampler.limit_bytes = a.memory_mb * MB + msg.carried_bytes
                w.sampler.peak_bytes = 0
            self.reporter.event({"event": "started", "job": a.job_id,
                                 "attempt": a.claim.lease.attempt, "worker": w.pid})
            self.crash_point("start")
            if a.cancel_requested:
                self._kill(w, Outcome.CANCELLED)
        elif isinstance(msg, Finished):
            a = w.current
            if a is None or a.seq != msg.seq:
                return
            w.current = None
            if w.kill_reason is not None and a is w.kill_target and not w.stopped_at_grace:
                # We decided to kill it (cancel, timeout, memory) before it finished: our
                # verdict stands, recorded now, as the worker may start its next job before
                # the kill lands. The worker dies anyway and is replaced.
                # What it said travels with its result (the worker may already be
                # writing the next job's words over its capture).
                verdict = replace(self._killed(w, a, None, read_tail=False),
                                  stderr_tail=msg.stderr_tail)
                self._complete(a, verdict)
                w.kill_target = None  # recorded: a later job of this worker is not it
                if w.kill_deadline is not None:
                    # A timeout's grace is the job's, to clean up, and it has ended (what it
                    # left running the worker killed before it reported): the worker, which
                    # survived because the job handled the SIGTERM, need not be waited for.
                    self._kill_now(w)
                    w.kill_deadline = None
                return
            fin = msg
            if w.mark is not None and w.slot.oom_killed_since(w.mark):
                # The kernel killed a child of the job for memory; the job saw a crash.
                if w.slot.ceiling_reached_since(w.mark):
                    fin = replace(msg, outcome=Outcome.MEMORY.value,
                                  error="the kernel killed a process of the job at its "
                                        "ceiling" + inputs_said(a.claim.record.spec.inputs))
                elif msg.outcome != Outcome.COMPLETED.value:
                    fin = replace(msg, outcome=Outcome.CRASHED.value,
                                  error=_outside_oom_message(a, "a process of the job"))
                w.mark = w.slot.mark()
            if fin.peak_memory_bytes is None and w.sampler is not None:
                fin = replace(fin, peak_memory_bytes=_own_peak(a, w.sampler.peak_bytes))
            # Without the time the run was suspended (Ctrl-Z): the dashboard's execution
            # percentiles and the prefetch depth are of the job's work, as the metric's.
            self._observe_exec(max(0.0, fin.elapsed_s - a.paused_s),
                               sizing=fin.outcome == Outcome.COMPLETED.value)
            a.read_mono = time.monotonic()
            self._complete(a, fin)
        elif isinstance(msg, Dropped):
            # A worker retiring because its slot holds more than the next job's ceiling: its
            # successor gets a fresh slot (what an earlier job left charged to this one, a
            # file in tmpfs, must not count against a later job). If even a worker that has
            # run nothing could not set the ceiling, the job is charged: replacing workers
            # for it would spin forever.
            if msg.kind in (DropKind.ABOVE_CEILING, DropKind.LEAKED):
                w.stale_slot = True
            leaving = msg.kind in (DropKind.RETIRE, DropKind.ABOVE_CEILING, DropKind.LEAKED)
            if leaving:
                # Nothing more goes to it: the jobs it hands back here, sent to it again as
                # the one worker with room, waited for its death (audit DW).
                w.retiring = True
            if leaving and w.current is None and w.kill_deadline is None:
                # It retires (its reason says why) and should be gone in milliseconds; one
                # that is not (something a job left holds it) is killed, so that its slot
                # and the jobs sent to it meanwhile are not lost with it.
                w.kill_deadline = time.monotonic() + RETIRE_BOUND_S
                w.doomed = _tree(w.pid)
            unfit = msg.kind is DropKind.ABOVE_CEILING and not w.started_any
            back: list[Assignment] = []  # (to the front of the line, in the order they had)
            for i, seq in enumerate(msg.seqs):
                # An assignment we no longer hold (cancelled, taken back) is ignored: the
                # same job may be queued here again since, under a new number.
                a = self._pop_queued(w, seq)
                if a is None:
                    continue
                if msg.kind is DropKind.LEASE and not self.q.renew(
                        [a.claim], lease_s=self.s.lease_s):
                    self._fenced(a)  # (renewed if still ours: run out by a wall-clock
                    # step or our own stop, the worker would hand it back again and again)
                elif a.cancel_requested or msg.kind is DropKind.CANCELLED:
                    self._finish_unrun(a, State.CANCELLED, "cancelled before it started")
                elif msg.kind is DropKind.EXPIRED:
                    self._finish_unrun(a, State.EXPIRED, EXPIRED_REASON)
                elif self.stop_signal is not None:
                    self._release_unrun(a)
                elif unfit and i == 0:
                    held = w.slot.usage_bytes()
                    self._record_now(a, {
                        "outcome": Outcome.MEMORY.value, "peak_memory_bytes": held,
                        "error": f"its ceiling of {a.memory_mb} MB is below what its worker's "
                                 f"memory slot held before it started"
                                 f"{f' ({held / MB:.0f} MB)' if held and held >= MB else ''}; "
                                 "the slot is replaced"})
                else:
                    back.append(a)
            self._put_back(back)
        elif isinstance(msg, Ready):
            w.pid, w.pgid = msg.pid, msg.pgid
            w.start_deadline = None
            w.pgid_start = proctree.process_start_time(msg.pgid)
            self._start_failures = 0
            # The OOM counter only grows; one mark per worker (renewed after an OOM kill it
            # survived) saves reading it at every job start.
            w.mark = w.slot.mark()
            if self.guard is not None and self.guard.name == "sampling":
                with contextlib.suppress(Exception):
                    w.sampler = TreeSampler(msg.pid, 1 << 62)
            self._record_workers()
        elif isinstance(msg, Broken):
            # What failed the worker (its started log on a full disk, its slot's cgroup
            # files) would fail the next one too: halt as for workers that cannot start
            # (exit 74). Not by raising, whose way out SIGKILLed the other workers' jobs
            # (each charged a crashed attempt at the next start): they finish; the broken
            # worker exits by itself, and what it held goes back to pending, uncharged.
            self._cannot_start_workers(f"worker {w.pid}: {msg.error}")

    @staticmethod
    def _pop_queued(w: WorkerHandle, seq: int) -> Assignment | None:
        """The assignment numbered ``seq`` (RunJob.seq) queued in ``w``, removed from it.

        By number, not job id: a worker's answer about an assignment can arrive after the
        same job was queued there again (cancelled then replaced, taken back then sent
        back), and taking the new one for the old lost track of it: it ran unsupervised,
        and was sent and run a second time."""
        for i, a in enumerate(w.queued):
            if a.seq == seq:
                del w.queued[i]
                return a
        return None

    def _kill_unsupervised(self, w: WorkerHandle, msg: Started) -> None:
        """``w`` started an assignment we neither hold nor know as cancelled: a job running
        with no timeout, ceiling or cancel watching it, whose result we would not take.
        Kill the worker now; its death settles what we do hold (not charged: not their
        fault), and the job, wherever we hold it, runs under supervision."""
        self.reporter.event({"event": "worker_unsupervised", "worker": w.pid,
                             "job": msg.job_id, "token": msg.token})
        if w.kill_reason is None:
            w.kill_reason, w.unsupervised = Outcome.RELEASED, True
        self._kill(w, w.kill_reason)

    def _observe_exec(self, elapsed: float, *, sizing: bool = True) -> None:
        self.exec_times.append(elapsed)
        if sizing or elapsed >= self._prefetch_work_s:
            # Not a quick failure: a job that fails at once says nothing of how long the
            # others take, and a run of them made the depth 32 for jobs of seconds (audit
            # EJ). A long one that failed does: the depth falls.
            self._sizing.append(elapsed)
            self._depth = self._compute_depth()

    def _on_death(self, w: WorkerHandle) -> None:
        self._read_messages(w)
        code = self._worker_exit_code(w)
        if w.pid is None:
            # Died (or was killed, stuck) before it could say Ready: the environment, not a
            # job, is broken. Replacing it forever would spin; after a few in a row the run
            # halts (running jobs finish; the rest go back to pending, uncharged).
            self._start_failures += 1
            if self._start_failures >= MAX_START_FAILURES:
                last = (f"the last killed, not ready after {self.s.worker_start_timeout_s:g}s"
                        if w.start_timed_out else f"last exit status {code}")
                self._cannot_start_workers(
                    f"{self._start_failures} workers in a row died before they were ready "
                    f"({last}); check the worker's environment "
                    f"(--start-method {self.s.start_method})")
        if w.pgid:
            proctree.kill_group(w.pgid, signal.SIGKILL)  # no survivor of its tree
        with contextlib.suppress(OSError, ValueError):
            for pid in w.slot.pids():  # a grandchild that left the group, still in the slot
                os.kill(pid, signal.SIGKILL)
        _signal_all(w.doomed, signal.SIGKILL)
        if w.sampler is not None:
            _signal_all(w.sampler.known_processes(), signal.SIGKILL)
        a = w.current
        if a is not None:
            self._complete(a, self._killed(w, a, code))
        self._remove_work_files(w)  # (its job's last words are read above)
        back: list[Assignment] = []
        for q in w.queued:
            if self.stop_signal is not None:
                self._release_unrun(q)
            elif q.cancel_requested:
                self._finish_unrun(q, State.CANCELLED, "cancelled before it started")
            else:
                back.append(q)
        self._put_back(back)
        w.queued.clear()
        w.current = None
        del self.workers[w.index]
        self._unwatch(w)
        self._kill_orphans()  # (joined above: what it left is ours by now)
        with contextlib.suppress(Exception):
            w.conn.close()
        w.gate.close()
        unlink_quiet(w.gate.path)
        self._moot_logs.append((w.started_log, self._in_flight_tokens()))
        self._drop_moot_logs()
        respawn = not w.replaced and self.stop_signal is None \
            and self.worker_start_error is None and (not self._finished() or self.s.follow)
        dying = False
        if (w.replaced or respawn) and not w.stale_slot:
            verdict = self._slot_verdict(w.slot)
            dying = verdict is None
            w.stale_slot = verdict is False
        if dying:
            # What it held cannot be told while its processes die (a big one takes tens of
            # ms to go): its successor gets another slot, and this one is judged later
            # (_settle_parked) rather than waited for on the loop's thread.
            self._parked.append(w.slot)
        elif w.replaced and not w.stale_slot:
            self._spare_slots.append(w.slot)  # emptied above; its successor already runs
        elif not respawn or w.stale_slot:
            with contextlib.suppress(Exception):
                w.slot.close()
        if respawn:
            self._spawn(w.index, None if dying or w.stale_slot else w.slot)

    def _remove_work_files(self, dead: WorkerHandle) -> None:
        """Remove a dead worker's working folder and capture file from work_root: a job
        killed for its timeout or memory leaves its scratch files there, and one worker
        retired per --max-jobs-per-worker jobs leaves two entries; kept until the runner
        exits, they piled up for as long as a --follow runner lives."""
        pid = dead.proc.pid
        if pid is None or any(w.proc.pid == pid for w in self.workers.values() if w is not dead):
            return  # (its pid reused by a worker started since: those are that one's)
        with contextlib.suppress(OSError), os.scandir(dead.work_root or self.work_root) as it:
            for e in it:
                # worker.py: w<pid>.<n>, its command logs w<pid>.<n>.std*, and w<pid>.out
                if e.name.startswith(f"w{pid}."):
                    if e.is_dir(follow_symlinks=False):
                        remove_tree(e.path)
                    else:
                        unlink_quiet(e.path)

    def _in_flight(self) -> list[Assignment]:
        """Every attempt claimed and not yet recorded."""
        live = [*self.ready, *(a for a, _ in self.completions)]
        for w in self.workers.values():
            live.extend(w.queued)
            if w.current is not None:
                live.append(w.current)
        return live

    def _in_flight_tokens(self) -> set[str]:
        return {a.claim.lease.token for a in self._in_flight()}

    def _drop_moot_logs(self) -> None:
        """Remove dead workers' started logs that no longer prove anything: every attempt
        in flight when the worker died (its own, and any it may have started unseen) has
        its record on disk since, so recovery would never look a token of it up."""
        if not self._moot_logs:
            return
        live = self._in_flight_tokens()
        kept = []
        for log, tokens in self._moot_logs:
            if tokens & live:
                kept.append((log, tokens))
            else:
                unlink_quiet(log)
        self._moot_logs = kept

    @staticmethod
    def _slot_verdict(slot: Slot) -> bool | None:
        """Whether a dead worker's slot may serve another worker: True if nothing of its
        tree is left there and it holds no more than a worker's leftover allowance, False if
        it holds more, None while its processes are still dying. A worker checks what a job
        left only when the job ends in it; a job killed for its timeout or its memory can
        leave a file in /dev/shm charged to the slot, which would count against every later
        job's ceiling there (an innocent one killed for memory it never used)."""
        try:
            if slot.pids():
                return None
            held = slot.held_bytes()
        except (OSError, ValueError):
            return False
        return held is None or held <= LEFTOVER_ALLOWANCE_BYTES

    def _settle_parked(self) -> None:
        """Judge the slots parked while their processes died: spare, or removed."""
        for slot in list(self._parked):
            verdict = self._slot_verdict(slot)
            if verdict is None:
                continue
            self._parked.remove(slot)
            if verdict:
                self._spare_slots.append(slot)
            else:
                with contextlib.suppress(Exception):
                    slot.close()

    def _killed(self, w: WorkerHandle, a: Assignment, code: int | None, *,
                read_tail: bool = True) -> Finished:
        """The result of ``a``, whose worker we killed or saw die (exit ``code``; None: it
        is still dying), with the tail of what the job said, read from its files."""
        # Wall time, pauses included, as the worker measures a job that ends by itself
        elapsed = time.monotonic() - (a.started_mono or time.monotonic()) + a.paused_s
        token = a.claim.lease.token
        if w.kill_reason is not None and a is not w.kill_target:
            # It started after we decided to kill its worker for another job: not its fault.
            why = "as unresponsive" if w.unresponsive \
                else "for starting a job the runner did not hold" if w.unsupervised \
                else f"({w.kill_reason.value}) for another job"
            return Finished(a.job_id, token, Outcome.RELEASED.value, elapsed,
                            error=f"its worker was killed {why}, which it started after "
                                  "that kill was decided; not charged")
        oom = w.mark is not None and w.slot.oom_killed_since(w.mark)
        # Killed for want of memory the job's ceiling did not run out of: the machine's, or
        # that of the cgroup renderctl runs in (a container's). Not the job's fault as far
        # as anyone can tell: charged as a crash, retried, and said so.
        outside = oom and w.mark is not None and not w.slot.ceiling_reached_since(w.mark)
        reason = Outcome.MEMORY if oom and not outside else w.kill_reason
        if outside and reason is Outcome.MEMORY:
            reason = None  # (our kill of the rest of its tree followed the kernel's)
        peak = w.slot.peak_bytes()
        if peak is None and w.sampler is not None:
            peak = w.sampler.peak_bytes
        peak = _own_peak(a, peak)
        sig = -code if code is not None and code < 0 else None
        exit_code = code if code is not None and code >= 0 else None
        if reason is not None:
            outcome, error = reason.value, _kill_message(reason, a, peak)
            if reason is Outcome.TIMEOUT and sig == signal.SIGKILL and w.grace_ran_out:
                # (It said "terminated" of a job that ignored the SIGTERM and was killed
                # after the whole grace; audit CI.)
                error += (f", and killed (SIGKILL) when the {self.s.kill_grace_s:g} s kill "
                          "grace ended")
        elif outside:
            outcome, error = Outcome.CRASHED.value, _outside_oom_message(a, "its worker")
        elif sig is not None and sig == self.stop_signal \
                and not _stopped_with_runner_before(a.claim.record):
            # The signal that stops us reached the worker too: sent to every process of the
            # service (systemd's default KillMode=control-group). The job was stopped with
            # the runner, which returns jobs to pending uncharged, not crashed on its own.
            # Once per job: one that stops its own service (`systemctl restart` from a job;
            # a stop signal cannot say who sent it) would run uncharged after each restart
            # for ever; the next time it is charged as the crash it may be.
            outcome, error = Outcome.RELEASED.value, \
                f"its worker got the runner's stop signal ({_signame(sig)}) too; not charged"
        elif sig is not None and sig == self.stop_signal:
            outcome, error = Outcome.CRASHED.value, \
                f"worker killed by the runner's stop signal ({_signame(sig)}) again, as on an " \
                "earlier attempt; charged this time (does the job stop its own service?)"
        elif sig is not None:
            outcome, error = Outcome.CRASHED.value, \
                f"worker killed by {_signame(sig)} (not sent by renderctl)"
        elif code == 255 and not w.adopted \
                and (server := mpstate.dead_fork_server()) is not None:
            # The fork server relays its children's exit status; it died (a job signalled
            # its parent?), so this worker died of its parent-death signal, status unknown.
            exit_code = None
            outcome, error = Outcome.CRASHED.value, \
                f"worker died with the fork server (pid {server}), which was killed"
        else:
            outcome, error = Outcome.FAILED.value, \
                f"worker exited with status {code} during the job"
        said = None
        if read_tail and a.started_mono is not None and w.pid is not None:
            said = last_words(w.work_root or self.work_root, w.pid, a.claim.record.spec.kind)
        return Finished(a.job_id, token, outcome, elapsed, error=error, exit_code=exit_code,
                        signal=sig, peak_memory_bytes=peak, stderr_tail=said)

    # -- guards: timeouts, memory, kills --
    def _enforce(self, now: float) -> None:
        sample = self.guard is not None and now >= self._next_sample
        sampling = self.guard is not None and self.guard.name == "sampling"
        if sample:
            self._next_sample = now + self.s.sample_interval_s
        for w in list(self.workers.values()):
            if w.start_deadline is not None and now >= w.start_deadline:
                self._kill_unready(w)
            self._judge_answer(w, now)
            if w.kill_deadline is not None and now >= w.kill_deadline and w.pgid:
                self._kill_now(w)
                w.kill_deadline = None
                w.grace_ran_out = True
            if w.kill_reason is not None and w.queued and now >= w.gate_retry:
                self._take_back_doomed(w, now)
            a = w.current
            if a is None or a.started_mono is None or w.kill_reason is not None:
                continue
            if now >= a.started_mono + a.claim.record.spec.timeout_s:
                # Its result may be waiting unread: the loop reads workers' sockets when it
                # waits, and it may have been busy (a group commit's syncs) as the job
                # ended in time. Such a job is done, not charged a timeout and run again.
                self._read_messages(w)
                if w.current is a and w.kill_reason is None:
                    self._kill(w, Outcome.TIMEOUT, graceful=True)
                continue
            if sample and sampling and w.sampler is not None:
                try:
                    s = w.sampler.sample()
                except Exception:
                    continue
                if s.exceeded:
                    self._kill(w, Outcome.MEMORY)
            elif sample and w.mark is not None and w.slot.oom_killed_since(w.mark):
                # cgroup v1 OOM-kills one task (the largest); if that was a child, the rest
                # of the job's tree would run on. Kill it all now.
                self._kill(w, Outcome.MEMORY)
        if now >= self._next_capture_check:
            self._next_capture_check = now + CAPTURE_CHECK_S
            self._bound_captures()
        if now >= self._next_renew:
            self._renew()
            self._next_renew = now + self.s.lease_s / 3

    def _kill_unready(self, w: WorkerHandle) -> None:
        """A worker that never said Ready: kill it; its death (``_on_death``) counts a failed
        start and gives back the jobs queued to it, and the loop starts a successor."""
        w.start_deadline, w.start_timed_out = None, True
        pid = w.proc.pid
        if pid is None:
            return
        _sigkill_worker(w)
        with contextlib.suppress(OSError):  # its group, if it got as far as making one
            proctree.kill_group(pid, signal.SIGKILL)
        self.reporter.event({"event": "worker_start_timeout", "worker": pid,
                             "timeout_s": self.s.worker_start_timeout_s})

    def _judge_answer(self, w: WorkerHandle, now: float) -> None:
        """Kill a worker that sits on jobs handed to it without starting one.

        A worker reads its jobs as soon as it is idle, and says Started (with the last
        Finished) within milliseconds; rebalancing takes jobs back only from behind a
        running one. So one that is idle in our eyes with jobs queued for a long time is
        stopped (SIGSTOP by hand, a freezer cgroup) or hung, and without this the jobs in it
        waited for good: the run never ended, a stop never finished. Its death
        (``_on_death``) gives them to another worker, uncharged, as for a failed start."""
        if w.pid is None or w.current is not None or not w.queued or w.kill_reason is not None:
            w.answer_deadline = None
            return
        if w.answer_deadline is None:
            # (Judged from the first look, at most a loop's wait after the hand-over: the
            # limit is a minute, and this keeps the bookkeeping out of the hot path.) While
            # we stop, an idle worker answers the Drain at once: the kill grace is plenty.
            w.answer_limit_s = self.s.kill_grace_s if w.drain_sent \
                else self.s.worker_start_timeout_s
            w.answer_deadline = now + w.answer_limit_s
            return
        if now < w.answer_deadline:
            return
        w.answer_deadline = None
        self.crash_point("unresponsive")
        self.reporter.event({"event": "worker_unresponsive", "worker": w.pid,
                             "jobs": [a.job_id for a in w.queued], "timeout_s": w.answer_limit_s})
        # No job of its is running: one it starts before the kill lands is released, not
        # charged (see _killed).
        w.kill_reason, w.unresponsive = Outcome.RELEASED, True
        _sigkill_worker(w)
        if w.pgid:
            with contextlib.suppress(OSError):
                proctree.kill_group(w.pgid, signal.SIGKILL)

    def _bound_captures(self) -> None:
        """Keep what running python jobs write to stdout and stderr (their worker's capture
        file) within bounds on disk; a command's worker bounds its command's log itself."""
        for w in self.workers.values():
            if w.current is None or w.pid is None \
                    or w.current.claim.record.spec.kind == "command":
                continue
            try:
                fd = os.open(capture_path(w.work_root or self.work_root, w.pid),
                             os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                bound_capture(fd)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _kill(self, w: WorkerHandle, reason: Outcome, *, graceful: bool = False) -> None:
        if w.pgid is None:
            return
        if w.kill_reason is None:
            w.kill_target = w.current
        w.kill_reason = reason  # doomed: sent nothing more (_dispatch_ready)
        if graceful:
            # Its queued jobs taken back before the SIGTERM: a job that handles it may end
            # at once, and its worker then started the next one before the take-back, which
            # was killed with it at the grace's end and run again (seen in CI; audit CD).
            self._take_back_doomed(w, time.monotonic())
        # A grandchild that called setsid() has left the group, and a python job can even move
        # its worker into another group: remember the worker and its whole tree now, while
        # it can still be found, plus whatever else is in its slot's cgroup, and kill them
        # with the group (again at the worker's death).
        try:
            in_slot = w.slot.pids()
        except (OSError, ValueError):
            in_slot = []
        w.doomed = _tree(w.pid) + _processes(in_slot)
        if graceful:
            # Once to each process: the group's members have the group's, and the tree and
            # the slot overlap (a second SIGTERM is "stop now, skip the clean-up" to many
            # programs: a job was sent up to three, and lost its grace).
            proctree.kill_group(w.pgid, signal.SIGTERM)
            _signal_all(_outside_group(w.doomed, w.pgid), signal.SIGTERM)
            # Then SIGCONT, as coreutils' timeout does: a stopped process (kill -STOP $$)
            # acts on its SIGTERM only once continued, and waited out the whole grace
            # (audit CB). Continued, it gets the grace to clean up that it is given for.
            proctree.kill_group(w.pgid, signal.SIGCONT)
            _signal_all(_outside_group(w.doomed, w.pgid), signal.SIGCONT)
            w.kill_deadline = time.monotonic() + self.s.kill_grace_s
        else:
            self._kill_now(w)

    @staticmethod
    def _kill_now(w: WorkerHandle) -> None:
        """SIGKILL the worker's tree as it is now, then its group and what ``_kill`` found.

        ``w.doomed`` is the tree as it was when the kill was decided; in a kill grace the
        job can start more, even in a new session (out of the group), and once the worker
        is dead those are re-parented away, where nothing (not the sampler, which stopped
        with the decision, nor the reaper, which follows live workers) would find them.
        While the worker lives it is a subreaper, so it is their ancestor: freeze its tree
        and kill it whole, as the reaper does, so that nothing forks away in between."""
        # The worker leads its group (pid == pgid), whose leader's start time we keep.
        start = w.pgid_start
        if w.pid is not None and w.pid == w.pgid and start is not None:
            _kill_tree_if(w.pid, lambda pid: proctree.process_start_time(pid) == start)
        if w.pgid:
            proctree.kill_group(w.pgid, signal.SIGKILL)
        _signal_all(w.doomed, signal.SIGKILL)

    def _check_reaper(self) -> None:
        """Replace a reaper that died while we run (killed by hand or by a job that runs as
        we do): without one, a job deaf to its worker's parent-death handler (one long C
        call, signals blocked) would run on unsupervised if we died, and the dead one
        stayed a zombie for our whole life (audit FE); one stopped is continued. Once a
        second: a waitpid and a stat. (Not while we are paused by Ctrl-Z: a reaper killed
        then is replaced when the run goes on.)"""
        if self._reaper_args is None:
            return  # (not started yet, or stopped: _shutdown closed it)
        if self.reaper is not None:
            if not self.reaper.gone():
                # A stopped one kills nothing either (a job can SIGSTOP it as easily).
                if proctree.is_stopped(self.reaper.proc.pid):
                    with contextlib.suppress(OSError):
                        os.kill(self.reaper.proc.pid, signal.SIGCONT)
                return
            self.reaper.drop()
            self.reaper = None
        with contextlib.suppress(OSError):  # (no process to be had: again in a second)
            self.reaper = Reaper.start(*self._reaper_args, watch=tuple(
                w.proc.pid for w in self.workers.values() if w.proc.pid))

    def _kill_orphans(self) -> None:
        """Kill what the jobs of a dead worker left running, which the kernel made ours.

        A worker is a subreaper while it lives: what its jobs start, setsid() daemons
        included, stays in its tree, and every kill of it takes that tree. A worker that
        died otherwise (a python job calling os._exit, a crash, a command's worker dying of
        the SIGTERM of a kill grace) handed its tree to the nearest subreaper: us. With a
        cgroup guard its slot is emptied too; under sampling nothing else would find them,
        and they would run on, unsupervised, after the run. Ours to keep: the workers, the
        reaper, and what multiprocessing started (the fork server, its resource tracker),
        by pid: not everything in our process group, which a job's process can join. Reaps
        those that have exited: a --follow runner lives for days. Never waits (a killed one
        is reaped at a later call)."""
        mpstate.forget_dead_server()  # (one that was still exiting when a worker outlived it)
        keep = {w.proc.pid for w in self.workers.values()}
        server = mpstate.forkserver_pid()
        if server is not None:
            # The fork server's children are our workers, and what a job made a sibling of
            # its worker (clone(CLONE_PARENT)), outside every tree we kill: never ours.
            for pid in reaper_children(server):
                if pid not in keep:
                    _kill_tree_if(pid, lambda p: (st := proc_stat(p)) is not None
                                  and int(st[1]) == server and st[0] not in (b"Z", b"X"))
        if not self._subreaper:
            return
        me = os.getpid()
        keep.update(mpstate.helper_pids())
        if self.reaper is not None:
            keep.add(self.reaper.proc.pid)
        for pid in reaper_children(me):
            fields = proc_stat(pid)
            if pid in keep or fields is None \
                    or (self._inherited and (pid, int(fields[19])) in self._inherited):
                continue
            if fields[0] in (b"Z", b"X"):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            _kill_tree_if(pid, lambda p: (st := proc_stat(p)) is not None and int(st[1]) == me)

    def _renew(self) -> None:
        claims = [a.claim for a in self.ready]
        for w in self.workers.values():
            claims.extend(a.claim for a in w.queued)
            if w.current is not None:
                claims.append(w.current.claim)
        if not claims:
            return
        renewed = {c.lease.token for c in self.q.renew(claims, lease_s=self.s.lease_s)}
        for w in self.workers.values():
            a = w.current
            if a is None or a.claim.lease.token in renewed or w.kill_reason is not None:
                continue
            lease = self.q.lease_on_disk(a.job_id)
            if lease is not None and lease.token != a.claim.lease.token:
                # Taken over (we were stopped past its expiry): its new holder runs it, and
                # ours would go on doing its work, side effects and all, only to be fenced
                # when it ends (audit CO). Its queued jobs go elsewhere, as for any kill.
                self._kill(w, Outcome.RELEASED, graceful=True)

    # -- cancel and drain --
    def _handle_cancel_requests(self) -> None:
        for jid in self.q.cancel_requests():
            handled = taken_over = False
            for a in self.ready:
                if a.job_id == jid:
                    a.cancel_requested = True
                    handled = True
            for a, _ in self.completions:
                if a.job_id == jid:
                    a.cancel_requested = True  # finished but not yet published: never publish
                    handled = True
            for w in self.workers.values():
                if w.current is not None and w.current.job_id == jid:
                    w.current.cancel_requested = True
                    self._kill(w, Outcome.CANCELLED)
                    handled = True
                # (A job is queued in one place at most: a claim goes to one worker.)
                queued = next((a for a in w.queued if a.job_id == jid), None)
                if queued is not None:
                    queued.cancel_requested = True
                    handled = True
                    # Settled now rather than when the worker reads a Skip (after its current
                    # job, which may take minutes), if the worker has not started it: its
                    # gate says (renderctl.gate), and what else it had not started goes
                    # back in line. Recorded as unstarted on our word alone, a job the
                    # worker had just started ran on, its whole PDF left beside the output
                    # when the run ended first (audit DM). One it started stays queued:
                    # its Started, on its way, has it killed and recorded as an attempt.
                    taken = self._take_back(w, time.monotonic())
                    if taken is None:
                        # The worker holds its gate (starting a job this instant, or stopped
                        # there): its answer to the Skip settles it, or its Started does.
                        self._tell(w, Skip((queued.seq,)))
                        continue
                    if queued in taken:
                        taken.remove(queued)
                        if not self._finish_unrun(queued, State.CANCELLED,
                                                  "cancelled before it started"):
                            # Fenced: its new holder applies the cancel, asked again for it
                            # (review CP: cleared below, and the job ran to done).
                            taken_over = True
                    self._hand_back(w, taken, "taken back with a cancelled job")
            if taken_over:
                continue
            if not handled:
                if jid in self._foreign:
                    # Running under a lease we wait to see expire: kept, and applied once
                    # the job is ours (_take_over_expired), not dropped unapplied.
                    continue
                self.q.cancel_pending(jid)
            self.q.clear_cancel_request(jid)
        self._dispatch()

    def _drain(self, now: float) -> None:
        if self.ready:
            while self.ready:
                self._release_unrun(self.ready.popleft())
        for w in self.workers.values():
            w.retiring = True
            if not w.drain_sent and w.pid is not None:
                self._tell(w, Drain())  # queued jobs come back as Dropped
                w.drain_sent = True
                w.answer_deadline = None  # judged again, by the kill grace (_judge_answer)
            if self.stop_deadline is not None and now >= self.stop_deadline \
                    and w.current is not None and w.kill_reason is None:
                w.stopped_at_grace = True
                self._kill(w, Outcome.RELEASED)

    # -- recording outcomes --
    def _withdraw(self, a: Assignment) -> None:
        """Withdraw the output this commit published for ``a``, a claim lost since, unless
        its job is done (adopted by the new holder's recovery) or the file is not this
        attempt's own any more. Moved to the temporary name (which _fenced removes), so
        that a folder output never stays half removed at its final path."""
        view = self.q.find(a.job_id)
        if view is not None and view.state is State.DONE:
            return
        with contextlib.suppress(OSError):
            if not is_ours(a.tmp, a.final, is_dir=a.output_kind == "dir", job_id=a.job_id,
                           token=a.claim.lease.token):
                return
            if os.path.lexists(a.tmp):
                os.unlink(a.final)  # (a link to it: the temporary stays for _fenced)
            else:
                os.rename(a.final, a.tmp)

    def _fenced(self, a: Assignment) -> None:
        """Drop an attempt whose lease another holder has taken over: nothing of it is
        published or recorded (its temporary output goes). The job is watched as any
        other's lease (the run waits for it, and takes it over if its new holder dies
        too: review CM, a run exited 0 with it left in running/), and a cancel asked of
        it is asked again, for its new holder (it was consumed here, and lost)."""
        discard(a.tmp)
        self.reporter.event({"event": "fenced", "job": a.job_id})
        if a.cancel_requested:
            with contextlib.suppress(OSError):
                self.q.request_cancel(a.job_id)
        with contextlib.suppress(QueueIOError):
            lease = self.q.lease_on_disk(a.job_id)
            if lease is not None and lease.token != a.claim.lease.token:
                self._foreign.observe(a.job_id, lease.token, lease.expires_at,
                                      wall=self.clock.wall(), mono=time.monotonic())

    def _holds(self, claim: Claim) -> bool:
        """Whether our lease on ``claim`` stands; if not, first whether our paths still
        lead to the folder we hold: a queue moved away (and another put at its path) reads
        as every lease taken over, and each job of the commit was fenced, its output
        withdrawn, and charged `crashed` by the folder's next runner (review EI).
        _check_folder stops us instead, the jobs released."""
        if self.q.holds(claim):
            return True
        self._check_folder()
        return False

    def _finish_claim(self, a: Assignment, t: Transition) -> bool:
        """Record an unrun claim's transition unless its lease was taken over (before, or
        during the sync: checked again right before the record is placed; the record, put
        back in pending/ say, would run the job twice). Whether it was recorded."""
        if not self._holds(a.claim) or self.q.finish(
                [t], crash_hook=self._finish_hook([t]),
                held=lambda _: self._holds(a.claim)):
            self._fenced(a)
            return False
        return True

    def _release_unrun(self, a: Assignment) -> None:
        now = self.clock.wall()
        rec = replace(a.claim.record, lease=None, reason="released before it started",
                      changed_at=now)
        t = Transition(rec, State.PENDING, unrun=True)
        if self._finish_claim(a, t):
            self._count(t)  # pending again: the dashboard's pending count and total include it
            self.reporter.event({"event": "released", "job": a.job_id})

    def _finish_unrun(self, a: Assignment, dst: State, reason: str) -> bool:
        """Record an unrun claim's end; False if it was fenced instead."""
        now = self.clock.wall()
        rec = replace(a.claim.record, lease=None, reason=reason, changed_at=now)
        t = Transition(rec, dst, unrun=True)
        if not self._finish_claim(a, t):
            return False
        self._count(t)
        self._report(t)
        return True

    def _complete(self, a: Assignment, fin: Finished) -> None:
        """A finished attempt, for the next group commit; one that will dead-letter its job
        counts towards --max-failures at once (see halted)."""
        self.completions.append((a, fin))
        if self.s.max_failures is not None and not a.cancel_requested \
                and _dead_letters(a.claim.record, fin.outcome):
            self._dead_ahead += 1

    def _record_now(self, a: Assignment, fields: dict[str, Any]) -> None:
        fin = Finished(a.job_id, a.claim.lease.token, fields.pop("outcome"), 0.0, **fields)
        self._complete(a, fin)

    def _attempt(self, a: Assignment, fin: Finished, outcome: str) -> dict[str, Any]:
        assert self.holder is not None
        # When the attempt ended (its start and its time), not when this commit recorded it
        # (a group commit, or a batch waiting out a stopped runner: audit DQ saw 22 attempts
        # "at once" on 2 workers, read from started_at and ended_at).
        ended = (min(self.clock.wall(), a.started_wall + fin.elapsed_s)
                 if a.started_wall is not None and fin.elapsed_s else self.clock.wall())
        att: dict[str, Any] = {
            "n": a.claim.lease.attempt,
            "outcome": outcome,
            "started_at": a.started_wall,
            "ended_at": ended,
            "elapsed_s": round(fin.elapsed_s, 6),
            "host": self.holder.host,
        }
        if a.paused_s:
            att["paused_s"] = round(a.paused_s, 3)  # of elapsed_s: the run was suspended
        for k in ("exit_code", "signal", "peak_memory_bytes", "stderr_tail", "error",
                  "traceback_tail"):
            v = getattr(fin, k)
            if v is not None:
                att[k] = v
        return att

    def _verdict(self, rec: JobRecord, attempt: dict[str, Any], now: float) -> Transition:
        # A failed attempt may have failed because its folder went away: let the next claim
        # of anything there create and check the folder again.
        self._confined.discard((rec.spec.out_root, str(rec.spec.output_path.parent)))
        rec = replace(rec, attempts=rec.attempts + (attempt,), lease=None, changed_at=now)
        outcome = Outcome(attempt["outcome"])
        charged = rec.charged_attempts
        backoff = compute_backoff(charged, base_s=self.s.backoff_base_s,
                                  max_s=self.s.backoff_max_s)
        v = after_attempt(outcome, charged_attempts=charged,
                          max_attempts=rec.spec.max_attempts, backoff_s=backoff,
                          attempt_n=attempt.get("n"))
        rec = replace(rec, reason=v.reason,
                      not_before=(now + v.retry_in_s) if v.state is State.PENDING else 0.0)
        return Transition(rec, v.state)

    def _commit(self) -> None:
        """Group commit of every finished attempt since the last one, with two syncs.

        1. decide each outcome (fencing, confinement, an existing output) and write the new
           records under tmp/;  2. sync: outputs and records are on disk;  3. link outputs;
        4. rename records into place;  5. sync: links and renames are on disk;  6. drop the
        running copies and the outputs' temporary names, and report. Claims made since the
        last commit become durable with the same syncs.
        """
        self.crash_point("commit")
        batch, self.completions = self.completions, []
        # Until it is recorded: a commit that fails as the queue folder is moved away still
        # has them released (_release_where_held).
        self._committing = batch
        self._dead_ahead = 0  # counted for real below
        now = self.clock.wall()
        transitions: list[Transition] = []
        owners: list[Assignment] = []  # whose each transition is
        to_link: list[tuple[Assignment, int, Finished]] = []  # index: in transitions
        faults = self._folder_faults(batch)
        for a, fin in batch:
            outcome = fin.outcome
            problem = None
            if not self._holds(a.claim):
                # Fenced: our lease was taken over (we were stopped or cut off past its
                # expiry); the new holder decides, whatever this attempt's outcome. Checked
                # for completions only, a failure recorded over the new holder's claim put
                # the job in dead/ beside its done record, or ran it again (audit CL).
                self._fenced(a)
                continue
            if a.cancel_requested:
                outcome = Outcome.CANCELLED.value
            elif (problem := faults.get(id(a))):
                # It failed where nothing could have succeeded: not charged, and the run
                # stops (exit 74) rather than spend every job's attempts on the folder.
                # (Only a job that ran: what _accept_claim refused, such as a path out of
                # the output root, is the job's own problem whatever the folder allows.)
                self._output_io(problem)
                outcome = Outcome.RELEASED.value
                fin = replace(fin, error=f"{problem} ({fin.error})" if fin.error else problem)
            elif outcome == Outcome.FAILED.value and self._failed_of_stop(a, fin):
                outcome = Outcome.RELEASED.value
                fin = replace(fin, error=f"{STOPPED_TOO} ({_signame(self.stop_signal or 0)}) "
                                         f"and failed; not charged ({fin.error})")
            t = self._transition(a, fin, outcome, now)
            if problem:  # (more than "released; not charged": the folder stopped it)
                t = replace(t, record=replace(t.record,
                                              reason=f"released: cannot write outputs: {problem}"))
            if t.dst is State.DONE:
                to_link.append((a, len(transitions), fin))
            else:
                discard(a.tmp)
            transitions.append(t)
            owners.append(a)
        staged = self.q.stage(transitions)
        # Protects against: power loss after the links and renames below exposing an empty
        # output or an empty record (data must reach the disk before the names do).
        self._sync(a.final.parent for a, _, _ in to_link)
        self.crash_point("commit:synced")
        if to_link:
            self.crash_point("publish:before_link")
        # Fenced again, right before anything is published or placed: a runner stopped
        # during the sync (or a slow one: seconds on a loaded disk) past its leases' expiry
        # came back and wrote over the claims of the runner that took them over (audit CO:
        # a job in done/ and dead/ both, run three times). What is left is the few
        # syscalls from here to the renames, the limit of fencing by a check on a file
        # system with no compare-and-swap.
        lost = {i for i, a in enumerate(owners) if not self._holds(a.claim)}
        if lost:
            for i in sorted(lost):
                unlink_quiet(staged[i][0])
                self._fenced(owners[i])
            to_link = [x for x in to_link if x[1] not in lost]
        linked: list[Assignment] = []
        restaged = False
        # Each output folder opened once per commit and judged by where its descriptor
        # points (publish.output_folder): the claim's check of the path is long past, and a
        # folder swapped for a symlink out of the root since must not carry the output there.
        folders: dict[tuple[str, str], int] = {}
        # Each root resolved afresh per commit (~10 us): a --follow runner lives for days,
        # and a root that is a symlink may be re-pointed meanwhile.
        roots_real: dict[str, str] = {}
        # Listed once for all of them, outside the jobs' own verdicts below.
        queue_real, queue_ids = self._queue_where() if to_link else (self._queue_real, None)
        try:
            for a, i, fin in to_link:
                token = a.claim.lease.token if fin.owner_tagged else None
                root = a.claim.record.spec.out_root
                verdict = None
                try:
                    key = (root, str(a.final.parent))
                    if key not in folders:
                        real = roots_real.get(root)
                        if real is None:
                            real = roots_real[root] = os.path.realpath(root)
                        folders[key] = output_folder(real, a.final, queue_real, queue_ids)
                    status = publish(a.tmp, a.final, is_dir=a.output_kind == "dir",
                                     token=token, dir_fd=folders[key])
                except OutputEscapes as exc:
                    verdict = Outcome.INVALID_OUTPUT, f"output path: {exc}"
                except (FileNotFoundError, NotADirectoryError) as exc:
                    verdict = Outcome.FAILED, \
                        f"its output was gone before it could be published: {exc}"
                except OSError as exc:
                    verdict = self._publish_refused(
                        a, exc, linking=token is None and a.output_kind != "dir")
                else:
                    if status is Published.EXISTS:
                        # Someone's file is there (this attempt published nothing yet, and
                        # its token is unique to this claim): never overwrite it.
                        verdict = Outcome.OUTPUT_EXISTS, _exists_message(a.final, a.job_id)
                if verdict is None:
                    linked.append(a)
                    if token is not None:
                        a.moved = True  # renamed into place: no temporary name to remove
                    continue
                t = self._transition(a, replace(fin, error=verdict[1]), verdict[0].value, now)
                if verdict[0] is Outcome.RELEASED:
                    t = replace(t, record=replace(
                        t.record, reason=f"released: cannot write outputs: {verdict[1]}"))
                transitions[i] = t
                unlink_quiet(staged[i][0])  # the done record we had staged for it
                staged[i] = self.q.stage([t])[0]
                discard(a.tmp)
                restaged = True
        finally:
            for fd in folders.values():
                os.close(fd)
        if linked:
            self.crash_point("publish:after_link")
        if restaged:
            self._sync(())
        # And a last time, right before the records are placed: the publishes, and a sync
        # when one was refused, came between (review CP: a takeover there left the job in
        # done/ and dead/). An output published for a claim lost by then is taken back if
        # the new holder's recovery judged the job before the publish (it runs the job
        # again, and would find ours in its way: output_exists), never if it found it and
        # completed the job from it (review CR: taking it back then deleted a done job's
        # output). Race-free: recovery places its record before the running copy goes,
        # and a claim is not lost until one of those has happened.
        late = {i for i, a in enumerate(owners) if i not in lost and not self._holds(a.claim)}
        if late:
            published = {id(a) for a in linked}
            for i in sorted(late):
                a = owners[i]
                if id(a) in published:
                    self._withdraw(a)
                unlink_quiet(staged[i][0])
                self._fenced(a)
            gone = {id(owners[i]) for i in late}
            linked = [a for a in linked if id(a) not in gone]
            lost |= late
        if lost:
            staged = [x for i, x in enumerate(staged) if i not in lost]
            transitions = [t for i, t in enumerate(transitions) if i not in lost]
        self.q.place(staged)
        self.crash_point("commit:placed")
        # Protects against: power loss forgetting a link or a record after we report it, or
        # after the running copy is unlinked next (which would lose the job entirely).
        self._sync(a.final.parent for a in linked)
        self._unsynced_claims = False
        self._committing = []
        self._finish_hook(transitions)("finish:before_unlink")
        for a in linked:
            if a.output_kind != "dir" and not a.moved:
                # Only now (the done record is durable): it was the proof the output is ours.
                # Before the running copies go: while one exists, recovery still finds this job
                # and removes the link if we die here.
                unlink_quiet(a.tmp)
            if any(x.get("outcome") == Outcome.RELEASED.value
                   for x in a.claim.record.attempts):
                # A release may have left its temporary where it could not be removed (a
                # folder gone read-only: publish.discard); no recovery sweeps a job that
                # went back to pending, so its completion does (a listing, retried jobs
                # only).
                for leftover in tmp_outputs(a.final, a.job_id):
                    discard(leftover)
        self.q.retire(staged)
        for t in transitions:
            self._count(t)
            self._report(t)
        self._drop_moot_logs()

    def _folder_faults(self, batch: list[tuple[Assignment, Finished]]) -> dict[int, str]:
        """The attempts of ``batch`` (by id of their Assignment) that failed where nothing
        could have succeeded, with why: judged for the whole batch before any of its
        temporaries is removed. One by one, the first job released had its partial output
        discarded, and the room that gave back made every later failure of the batch on
        that full disk look like the job's own: charged, and with max_attempts 1, 6 of 12
        jobs dead-lettered for the disk's fault (audit BV).

        Released at every failure: a folder read-only or not writable to us, or a disk
        full even without this job's own partial output. Released once per job (since its
        last `dead retry`), then charged like any failure: a job that failed saying a disk
        was full when its worker found the output's disk full (``output_full``, judged with
        the partial output there), or that named its output with it (_full_writing_output),
        or that said so where its output's disk was found full in this run. The job may
        have filled the disk itself, with an output that can never fit: released at every
        run it never ended (review BW)."""
        ran = [(a, fin) for a, fin in batch if not a.cancel_requested
               and fin.outcome in (Outcome.FAILED.value, Outcome.INVALID_OUTPUT.value)
               and a.started_wall is not None]
        faults: dict[int, str] = {}
        for a, fin in ran:
            problem = output_folder_problem(a.final, own=a.tmp)
            if problem is None:
                full = fin.output_full or _full_writing_output(a.tmp, a.final, fin)
                problem = _once_per_job(full, a.final, a.claim.record)
            if problem:
                faults[id(a)] = problem
                if says_full(problem) and (dev := _device_of(a.final.parent)) is not None:
                    self._full_devices.setdefault(dev, problem)
        for a, fin in ran:
            if id(a) not in faults \
                    and says_full(fin.error, fin.stderr_tail, fin.traceback_tail) \
                    and (dev := _device_of(a.final.parent)) in self._full_devices:
                problem = _once_per_job(self._full_devices[dev], a.final, a.claim.record)
                if problem:
                    faults[id(a)] = problem
        return faults

    def _publish_refused(self, a: Assignment, exc: OSError,
                         *, linking: bool) -> tuple[Outcome, str]:
        """The verdict on an output whose publish the file system refused. The folder's
        fault (read-only since the job ran, full, no hard links): released, not charged, and
        the run halts (exit 74), as for a job that could not write there; every output in
        it would fail the same way. Anything else (a name this file system refuses): the
        job's own, dead-lettered at once."""
        problem = f"{a.final}: {exc.strerror}"
        if linking and exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            problem += (" (link(2); on a file system without hard links or user xattrs, "
                        "such as FAT or exFAT, renderctl cannot publish without risking an "
                        "overwrite)")
        elif not linking and exc.errno == errno.EINVAL:
            problem += (" (renameat2(RENAME_NOREPLACE) unsupported here, as on NFS and SMB, "
                        "or a name this file system refuses)")
        if exc.errno in FOLDER_IO_ERRNOS or (linking and exc.errno in NO_LINK_ERRNOS):
            self._output_io(problem)
            return Outcome.RELEASED, problem
        return Outcome.INVALID_OUTPUT, f"output path: cannot publish {problem}"

    def _failed_of_stop(self, a: Assignment, fin: Finished) -> bool:
        """Whether ``a``'s failure may be its answer to our stop signal: a job that handles
        SIGTERM itself (cleans up, exits non-zero) when it reaches every process of the
        service (systemd's KillMode=control-group) fails rather than dies of it, and is
        stopped with the runner all the same. Which it was cannot be told, so, as for a
        worker killed by the stop signal, once per job: a failure of its own during the
        grace costs one more attempt, never a charged one too many."""
        if self.stopped_at is None or a.started_mono is None \
                or a.started_worker_mono is None:
            return False
        # Started before the stop by the worker's own clock (we may read its start only
        # after our handler ran), and ended after it: by the worker's elapsed time, or, as
        # we saw it, read after the handler ran. The signal reaches the runner first, but a
        # loaded machine can run the job's answer (and the worker's messages) before our
        # handler: judged by when we read them, the job started after the stop or ended
        # before it, and was dead-lettered for its answer (two CI flakes).
        ended = max(a.started_mono - a.paused_s + fin.elapsed_s, a.read_mono or 0.0)
        # (Monotonic both: by wall times, a clock stepped back during the job made it start
        # "after" the stop, and it was charged, dead-lettered on its last attempt.)
        return a.started_worker_mono < self.stopped_at <= ended \
            and not _stopped_with_runner_before(a.claim.record)

    def _transition(self, a: Assignment, fin: Finished, outcome: str, now: float) -> Transition:
        rec = a.claim.record
        attempt = self._attempt(a, fin, outcome)
        if outcome == Outcome.COMPLETED.value:
            result = {"path": str(a.final), "sha256": fin.sha256, "bytes": fin.bytes,
                      "pages": fin.pages, "attempts": len(rec.attempts) + 1,
                      "peak_memory_bytes": fin.peak_memory_bytes,
                      "elapsed_s": round(fin.elapsed_s, 6),
                      "queued_s": round((a.started_wall or now) - rec.accepted_at, 6)}
            return Transition(replace(rec, attempts=rec.attempts + (attempt,), lease=None,
                                      result=result, reason="", changed_at=now), State.DONE)
        if outcome == Outcome.CANCELLED.value:
            return Transition(replace(rec, attempts=rec.attempts + (attempt,), lease=None,
                                      reason="cancelled", changed_at=now), State.CANCELLED)
        return self._verdict(rec, attempt, now)

    def _sync(self, out_folders: Iterable[Path]) -> None:
        """One syncfs per file system involved (usually one: queue and outputs together):
        judged by each output's own folder, which may be a mount point inside its root."""
        sync_filesystems([self.q.path, *set(out_folders)])

    def _queue_where(self) -> tuple[str, frozenset[tuple[int, int]]]:
        """The queue folder's real path and identities (publish.output_folder) as they are
        now, by the descriptor we hold: its path at our start may lead nowhere by now (a
        `current` symlink switched to a new release, the old one removed), and every job
        that then finished was failed and dead-lettered as if its output were gone (review
        EF). Not the job's fault if this fails: the queue's I/O error."""
        fd = self.q.held_folder_fd()
        real = self._queue_real_now()
        try:
            return real, queue_identities(real if fd is None else fd)
        except OSError as exc:
            raise QueueIOError(f"cannot list the queue folder {self.q.path}: "
                               f"{os_error_message(exc)}") from exc

    def _queue_real_now(self) -> str:
        """The real path of the queue folder we hold, now (~3 us; see _queue_where)."""
        fd = self.q.held_folder_fd()
        if fd is not None:
            with contextlib.suppress(OSError):  # (no /proc: the path of our start)
                now = os.readlink(f"/proc/self/fd/{fd}")
                if now.startswith("/") and not now.endswith(" (deleted)"):
                    return now
        return self._queue_real

    def _check_confined(self, out_root: str, final: Path) -> None:
        # Resolving every component costs ~0.1 ms; a folder checked once this run stays
        # checked here: a symlink swapped in later is caught at publish, which judges the
        # folder by where its descriptor points (publish.output_folder).
        key = (out_root, str(final.parent))
        if key in self._confined:
            return
        try:
            root = Path(out_root).resolve()
        except RuntimeError:  # a loop (Python 3.11's word for ELOOP here), as check_confined
            raise OutputEscapes(f"the output root {out_root} is a symlink loop") from None
        check_confined(root, final, self._queue_real_now())
        if len(self._confined) >= CONFINED_CACHE_MAX:
            # A cache, not a record: one folder per job (out/<customer>/<id>/) would grow
            # it by ~350 bytes a job for as long as a --follow runner lives.
            self._confined.clear()
        self._confined.add(key)

    def _finish_hook(self, transitions: list[Transition]) -> Callable[[str], None]:
        def hook(point: str) -> None:
            if any(t.dst is State.DONE for t in transitions):
                self.crash_point("publish:after_done")
            if any(t.dst is State.DEAD for t in transitions):
                self.crash_point("dead")

        return hook

    def _count(self, t: Transition) -> None:
        if t.dst.terminal:
            self.counts[t.dst.value] += 1
            self._left_pending.pop(t.record.spec.id, None)
        elif t.dst is State.PENDING:
            self.index.add(t.record.entry(), now=self.clock.wall())
            if t.record.attempts and not t.unrun:
                # A release (a stop, an output folder that cannot be written) is not
                # charged and not a retry: `top` counts only `retry` events too.
                if t.record.attempts[-1].get("outcome") != Outcome.RELEASED.value:
                    self.retries += 1
                self._left_pending[t.record.spec.id] = len(t.record.attempts)

    def _forget_vanished(self) -> None:
        """Forget the jobs waiting out a backoff that are no longer in pending/ (`cancel`
        ended them, and wakes us): a run waiting only for those waited, its work done,
        until their retry time came (up to --backoff-max). Only while nothing is claimable:
        then the run has nothing better to do than a stat per waiting job."""
        if self.s.follow:
            # It never finishes for want of jobs, and its wakes are mostly submits: looked
            # at once a second at most (_tick_follow), not a stat per waiting job per wake.
            self._vanish_check_due = True
            return
        self._discard_vanished(self.index.waiting_ids(now=self.clock.wall()))

    def _discard_vanished(self, job_ids: Iterable[str]) -> None:
        """Drop from the index those of ``job_ids`` whose pending record is gone: a stat each."""
        for job_id in job_ids:
            if not os.path.lexists(self.q.record_path(State.PENDING, job_id)):
                self.index.discard(job_id)

    def _tick_follow(self) -> None:
        """Once a second in a --follow run: the jobs another command ended while they
        waited out a backoff are reported now, not at the run's end (weeks away, in
        memory till then), nor when their retry would have come (up to --backoff-max)."""
        if self._vanish_check_due:
            self._vanish_check_due = False
            # Ours only, and whether or not others are claimable now (waiting_ids is empty
            # then: a busy run reported such a job only when its retry came).
            self._discard_vanished([j for j in self._left_pending if j in self.index])
        if self._left_pending:
            self._settle_left_pending(gone_only=True)

    def _settle_left_pending(self, *, gone_only: bool = False) -> None:
        """Count and report the jobs this run tried and left pending that another command
        ended meanwhile (`cancel` settles a pending job itself; `dead`/`expired` by another
        runner after ours): the run handled them, and DESIGN's exit code is of every job the
        command handled. It exited 0 with such a job cancelled, and its JUnit report had it
        as `skipped`, unfinished.

        With ``gone_only`` (a --follow run, each second), only those no longer waiting in
        the index nor in flight."""
        if gone_only:
            gone = [(job_id, attempts) for job_id, attempts in self._left_pending.items()
                    if job_id not in self.index]
            if gone:  # (often none: the in-flight set is built only then)
                flying = {a.claim.record.spec.id for a in self._in_flight()}
                gone = [(job_id, attempts) for job_id, attempts in gone
                        if job_id not in flying]
        else:
            gone = list(self._left_pending.items())
        for job_id, attempts in sorted(gone):
            with contextlib.suppress(OSError):
                view = self.q.find(job_id)
                if gone_only and view is not None and not view.state.terminal:
                    continue  # pending again, not yet in the index (or running elsewhere)
                self._left_pending.pop(job_id, None)
                if view is not None and view.state.terminal:
                    self.counts[view.state.value] += 1
                    # Ended with no attempt since ours (a cancel while it waited): the last
                    # attempt is ours, reported already as its `retry`; its outcome and error
                    # in a `cancelled` event read as the cancel's.
                    unrun = len(view.record.attempts) <= attempts
                    self.reporter.event(transition_event(
                        Transition(view.record, view.state, unrun=unrun)))
        if not gone_only:
            self._left_pending.clear()

    def _report(self, t: Transition) -> None:
        ev = t.event
        # (A release, on a stop or a lost worker's take-back, is not a failure: `top`'s
        # FAILURE_EVENTS leave it out too; audit CN.)
        if t.dst is State.DEAD or ev.get("outcome") not in (None, "completed", "released"):
            self.recent_failures.append(ev)
        self.reporter.event(ev)


def start_worker(ctx: Any, cfg: WorkerConfig, *, name: str,
                 tries: int = 5) -> tuple[Any, mpc.Connection]:
    """Start a worker process; returns it and the runner's end of its pipe.

    A job can kill the fork server (it is a job's grandparent: ``os.kill(os.getppid(), 9)``).
    A start talking to the dying server then fails with EOFError or a connection error;
    CPython starts a new server at the next start once it has reaped the old one, so try
    again shortly instead of letting one job's act end the run. A job can also SIGSTOP the
    server mid-start: the start resumes it (mpstate.helpers_kept_running)."""
    attempt = 0
    while True:
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=worker_main, args=(child, cfg), name=name, daemon=False)
        try:
            with mpstate.helpers_kept_running():
                proc.start()
        except (EOFError, ConnectionError, FileNotFoundError) as exc:
            parent.close()
            child.close()
            attempt += 1
            if attempt == tries:
                raise WorkerStartError(f"cannot start a worker: the fork server keeps "
                                       f"failing ({type(exc).__name__}: {exc})") from None
            time.sleep(0.01 * 2 ** attempt)
            continue
        child.close()
        return proc, parent


def _percentiles(values: deque[float]) -> dict[str, float] | None:
    if not values:
        return None
    xs = sorted(values)

    def q(p: float) -> float:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))], 6)

    return {"p50": q(0.5), "p99": q(0.99), "n": len(xs)}


def _tree(pid: int | None) -> list[Any]:
    """psutil handles of ``pid`` and its descendants (safe against pid reuse when
    signalled)."""
    if pid is None:
        return []
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _processes(pids: list[int]) -> list[Any]:
    """psutil handles of those of ``pids`` still running."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    return procs


def _sigkill_worker(w: WorkerHandle) -> None:
    """SIGKILL ``w``'s process: by its pidfd where it has one, which names that process
    for good (under forkserver the fork server reaps it, and its pid can be another
    process's before we hear of the death)."""
    with contextlib.suppress(OSError):
        if w.pidfd is not None:
            signal.pidfd_send_signal(w.pidfd, signal.SIGKILL)
        elif w.proc.pid is not None:
            os.kill(w.proc.pid, signal.SIGKILL)


def _outside_group(procs: list[Any], pgid: int) -> list[Any]:
    """Those of ``procs`` (psutil handles) not in process group ``pgid``, each once."""
    seen: set[int] = set()
    out = []
    for p in procs:
        if p.pid in seen:
            continue
        seen.add(p.pid)
        try:
            if os.getpgid(p.pid) == pgid:
                continue
        except OSError:
            continue  # gone
        out.append(p)
    return out


def _signal_all(procs: list[Any], sig: int) -> None:
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)  # psutil checks the process is still the one we saw


def _exists_message(final: Path, job_id: str) -> str:
    token = owner_token(final)
    if token:
        # The tag is the attempt's token: name its job.
        _, owner, attempt = parse_token(token)
        if owner and owner != job_id:
            # Two jobs given one output path (in different submits: one manifest's duplicate
            # outputs are refused at validation).
            return (f"{final} already exists: renderctl published it for job {owner} "
                    f"(attempt {attempt}); two jobs name this output; left untouched")
        # Most likely this job's own output from before its record was deleted by hand
        # (README, Housekeeping): say so, so that the fix (move it away) is obvious.
        return (f"{final} already exists: renderctl published it for an earlier life of "
                "this job id that no record of this queue remembers (the job was replaced, "
                "or its done record deleted), or for a job of this id in another queue; "
                "left untouched, move it away to render it again")
    return f"{final} already exists and renderctl did not publish it for this job; left untouched"


# Errors that say the output folder (its permissions, its file system) is at fault, whatever
# the path: a retry of the same job there cannot succeed until someone fixes the folder.
FOLDER_IO_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC,
                              errno.EDQUOT, errno.EIO})
NO_LINK_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENOSYS})  # link(2) not supported at all


def _device_of(folder: Path) -> int | None:
    try:
        return os.stat(folder).st_dev
    except OSError:
        return None


def _full_writing_output(tmp: Path, final: Path, fin: Finished) -> str | None:
    """The folder's fault for a job that failed writing its own output (its temporary
    name and "No space left on device" on one line), though the folder has room by now: a
    tool that removes its partial file on error (cp, most do) gives that room back before
    we look. Charged, every job of a batch of outputs larger than the room left was
    dead-lettered. (Released once per job: the line may be about another disk, a scratch
    file in a full /tmp named after the output; see _once_per_job.)"""
    said = "\n".join(t for t in (fin.error, fin.stderr_tail, fin.traceback_tail) if t)
    # (The worker's messages call the temporary by the output's own name.)
    names = (tmp.name, final.name)
    for line in said.splitlines():
        why = next((w for w in FULL_ERRORS if w in line), None)
        if why is not None and any(f"/{n}" in line or f"'{n}" in line for n in names):
            return f"{final.parent}: {why}"
    return None


def _once_per_job(problem: str | None, final: Path, rec: JobRecord) -> str | None:
    """``problem``, marked as a full disk's release of this job, unless this job had one
    since its last `dead retry` (then None: charged like any failure, so that an output
    that can never fit still ends dead)."""
    if problem is None:
        return None
    mark = f"(writing {final.name})"
    if any(mark in str(att.get("error", "")) for att in rec.attempts[rec.attempt_base:]):
        return None
    return f"{problem} {mark}"


def _path_problem(exc: Exception, final: Path) -> str:
    """Why ``final``'s folder cannot be made, in the user's words."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        for folder in (final.parent, *final.parent.parents):
            if folder.exists() and not folder.is_dir():
                return f"{folder} is a file, where the output's folder must be"
    return str(exc)


def _stopped_with_runner_before(rec: JobRecord) -> bool:
    """Whether an attempt of this job (since its last `dead retry`) was released because its
    worker died of the stop signal of a stopping runner (see Runner._killed): the only
    released attempts that carry a stop signal (a drain's kill is a SIGKILL); or because it
    failed once the stop signal came (Runner._failed_of_stop)."""
    return any(att.get("outcome") == Outcome.RELEASED.value
               and (att.get("signal") in STOP_SIGNALS
                    or str(att.get("error", "")).startswith(STOPPED_TOO))
               for att in rec.attempts[rec.attempt_base:])


def left_ignored(sig: int) -> bool:
    """Whether ``sig`` is ignored here (so, in a fresh process, by the parent's wish)."""
    return signal.getsignal(sig) == signal.SIG_IGN


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _test_number(variable: str) -> float:
    raw = os.environ[variable]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{variable}={raw!r}: must be a number > 0")
    return value


def _dead_letters(rec: JobRecord, outcome: str) -> bool:
    """Whether an attempt ending ``outcome`` will dead-letter the job of ``rec``: what
    after_attempt will decide at the commit (which may still find another reason)."""
    try:
        o = Outcome(outcome)
    except ValueError:
        return False
    charged = rec.charged_attempts + (1 if o.charged else 0)
    return after_attempt(o, charged_attempts=charged, max_attempts=rec.spec.max_attempts,
                         backoff_s=0.0).state is State.DEAD


def _kill_tree_if(pid: int, still_ours: Callable[[int], bool]) -> None:
    """Freeze and kill ``pid``'s whole tree (reaper.kill_tree) if ``still_ours(pid)`` holds
    once a pidfd pins it: with the pidfd held the pid cannot be reused meanwhile."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone already (a death is handled as any other)
    try:
        if still_ours(pid):
            kill_tree(pid, pidfd)
    finally:
        os.close(pidfd)


class Garbled(Exception):
    """Bytes on a worker's connection that are no message of its: a python job runs inside
    its worker and can write to any of its descriptors (a library writing to a wrong fd)."""


def _take_message(inbox: bytearray) -> object | None:
    """The first message in ``inbox`` (bytes from a worker's Connection.send), removed
    from it; None until it is all there. Connection's framing: a signed 32-bit length (its
    64-bit form is for messages over 2 GB, which no worker sends)."""
    if len(inbox) < 4:
        return None
    (size,) = struct.unpack_from("!i", inbox)
    if not 0 <= size <= MESSAGE_MAX:
        raise Garbled(f"a message of {size} bytes announced")
    if len(inbox) < 4 + size:
        return None
    try:
        msg = ForkingPickler.loads(inbox[4:4 + size])
    except Exception as exc:  # whatever unpickling garbage raises
        raise Garbled(f"an unreadable message ({type(exc).__name__})") from None
    del inbox[:4 + size]
    return msg


def _expires_at(a: Assignment) -> float | None:
    """When ``a`` expires unstarted: its deadline, unless an attempt of it ever started."""
    rec = a.claim.record
    return rec.spec.deadline if not rec.attempts else None


def inputs_said(inputs: Sequence[str]) -> str:
    """What a job that met its memory ceiling was given, for its record: a PDF takes ~2x
    its size to stamp, one of many small pages or object streams far more, and the message
    named no file, so a user could not tell a big input from a leak (audit DC). Names only:
    a stat of each, in the runner's loop, could hang it on a stalled mount (review DE).
    Empty if the job had none."""
    if not inputs:
        return ""
    if len(inputs) == 1:
        return f"; its input: {os.path.basename(inputs[0])}"
    named = ", ".join(os.path.basename(p) for p in inputs[:3])
    more = f" and {len(inputs) - 3} more" if len(inputs) > 3 else ""
    return f"; its {len(inputs)} inputs: {named}{more}"


def _own_peak(a: Assignment, peak: int | None) -> int | None:
    """A job's peak as reported and judged: less what earlier jobs left held in its worker,
    which its ceiling was raised by (see Worker._check_leftover_memory)."""
    if not peak:
        return None
    return max(0, peak - a.carried_bytes) or None


def _shortage_said() -> str:
    """What the machine is short of, where workers cannot be started: a pids limit reached,
    or a memory cgroup nearly full (audit FI: the run said "the fork server keeps failing
    (EOFError)" of a container's pids limit, and "died before they were ready (last exit
    status -9)" of its memory limit)."""
    with contextlib.suppress(Exception):
        full = full_pids_cgroup()
        if full is not None:
            return f"; no process could be created: {full} (raise it or lower --workers)"
        room = enclosing_memory_room()
        if room is not None and room < SHORT_ROOM_BYTES:
            return (f"; the memory cgroup renderctl runs in has {room // MB} MB left (the "
                    "kernel's out-of-memory killer may be killing the workers)")
    return ""


def _outside_oom_message(a: Assignment, what: str) -> str:
    return (f"the kernel's out-of-memory killer killed {what} below its "
            f"{a.claim.record.spec.memory_mb} MB ceiling: the memory of the cgroup renderctl "
            "runs in (a container's limit) or of the machine ran out; lower --workers or "
            "--memory-budget")


def _kill_message(reason: Outcome, a: Assignment, peak: int | None) -> str:
    spec = a.claim.record.spec
    if reason is Outcome.MEMORY:
        seen = f"; peak {peak / MB:.0f} MB" if peak else ""
        return (f"crossed its memory ceiling of {spec.memory_mb} MB{seen}; process group "
                f"killed{inputs_said(spec.inputs)}")
    if reason is Outcome.TIMEOUT:
        return f"exceeded timeout_s={spec.timeout_s:g}; process group terminated"
    if reason is Outcome.CANCELLED:
        return "cancelled while running; process group killed, output not published"
    if reason is Outcome.FAILED:
        return ("wrote into its worker's connection to the runner (what came there was not "
                "a message); process group killed")
    return "the runner was stopped; returned to pending (not charged)"
