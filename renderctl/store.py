"""The directory queue: one JSON file per job, its state the folder it is in.

::

    submit ──journal/<seq>.txn──▶ pending/ ──claim──▶ running/ ──finish──▶ done/ dead/
                                   ▲   │                 │                 cancelled/
                                   │   └──cancel/expire──┼──────────────▶ cancelled/ expired/
                                   └──────retry/release──┘

Durability (each fsync names the crash it protects against where it is made):

- **submit** is all-or-nothing for the whole command: the batch is written once to
  ``journal/<seq>.txn`` (fsync file, rename, fsync dir: the commit point). Then every job is
  written to ``tmp/``, one ``syncfs`` makes them all durable, they are renamed into
  ``pending/``, the folder is fsynced, and the journal entry gives way to ``<seq>.new`` (a
  doorbell for the runner's in-memory index: each job's claim-order fields, not its
  record). A crash before the commit point leaves only temporaries (removed on the next
  open); after it, the next open (or a running runner's next poll) rolls the batch forward.
  An error after the commit point raises ``SubmitIncomplete`` naming the accepted jobs (the
  next submit of the same object rolls them forward); the doorbell, the runner's wake-up
  and the event log come after acceptance and never fail a submit (``SubmitResult.warnings``).
- **claim** renames ``pending/x`` to ``running/x`` (the single atomic step a concurrent
  cancel races against) and sets the lease on it as an extended attribute
  ``user.renderctl.lease`` (holder, token, attempt, expiry): no new file, no data write,
  so a claim costs one rename and one metadata update. (`renderctl show` and
  ``getfattr -n user.renderctl.lease`` print it; on a file system without user xattrs the
  record is rewritten with the lease inside instead.)
- **finish** writes the new record under ``tmp/``, syncs, renames it into its new folder and
  only then unlinks ``running/x``. A crash in between leaves the job in two folders; the
  later one (never ``running``) wins on recovery.

Batches share one sync: N transitions cost one ``syncfs`` plus one directory fsync per
folder touched, not N fsyncs (MEASUREMENTS.md: fsyncs per job are the cost that matters).

- **dead retry** rewrites ``dead/x`` in place durably, then moves it to ``pending/`` with one
  rename: a crash leaves the job in exactly one of the two.
- **Locks**: ``.submit.lock`` (submits and journal replays, one at a time);
  ``.replace.lock``, held by a ``--replace`` while it re-checks and applies, taken shared
  and non-blocking by each claim batch (a claim skips a round rather than let a job be
  claimed between a replace's check and its rename); one runner per queue: a flock on
  ``runner.lock`` (a regular file, never renamed over: the lock NFS shares between hosts,
  and the one older versions took) and then on the queue folder's descriptor (which no
  rename of a file inside it can swap); readers take both shared for a moment, so a
  starting runner waits for a holder that is not a live runner. ``runner.json`` is the
  holder's record (who, since when).
- **Readers in other processes** (`show`, `status`) may read a running record's file just
  as the runner recycles it: a record is quarantined only if its path still names the file
  that was read, and a record of another id is never taken for the one looked up.

"A crash" here is a process's death (SIGKILL at any point), and a power loss on a file system
with a journal (ext4's default, XFS, btrfs), where a rename reaches the disk whole. Without a
journal (as ext4 on this machine runs) the two folders' blocks are written independently, so a
power loss in the middle of a sync can keep a rename's removal and lose its addition; fsck
then leaves the file in ``lost+found``. Nothing in the layout can prevent that (a move by link,
sync, unlink would, at two more syncs per transition); what the code does ensure is that no
state is reported, and no copy removed, before its successor is synced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import itertools
import json
import math
import os
import re
import reprlib
import secrets
import signal
import socket
import stat
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from renderctl.clock import SYSTEM_CLOCK, Clock
from renderctl.errors import (
    Interrupted,
    JobNotFound,
    ManifestError,
    Problem,
    QueueBusy,
    QueueIOError,
    Saturated,
    SubmitIncomplete,
    UserError,
    os_error_message,
)
from renderctl.events import EventLog
from renderctl.fsutil import (
    atomic_write,
    fill_file,
    fsync_dir,
    fsync_fd,
    holds_users_files,
    makedirs,
    not_a_folder,
    read_file,
    remove_quiet,
    syncfs,
    unlink_quiet,
    write_file,
)
from renderctl.lifecycle import (
    CANCEL_REQUEST_PREFIX,
    EXPIRED_REASON,
    LEASE_XATTR,
    State,
    check_transition,
    lease_xattr_fields,
    make_token,
)
from renderctl.lockwait import (
    WAITER_THREAD,
    HeldOff,
    close_lock,
    describe,
    flock_within,
    held,
    holders,
    open_lock_file,
    wait_for_flock,
)
from renderctl.manifest import (
    JobSpec,
    Limits,
    bad_folder_name,
    is_job_id,
    jobs_from_dicts,
    outputs_in_queue,
)
from renderctl.policy import ClaimIndex, Entry

FORMAT_VERSION = 1
SEQ_FILE = "seq"  # control/seq: the last acceptance stamp given (see _next_stamp)
FREE_PREFIX = "free."  # tmp/free.*: retired record files kept for reuse
HOLDER_FILE = "holder.{}.json"  # control/: who a token prefix is (see _write_lease)
# How long a starting runner waits for the runner lock held by something that is not a live
# runner (a `status` peeking, a `cancel` fixing an orphaned job: both take it briefly).
LOCK_PATIENCE_S = 5.0
RUNNER_LOCK = "runner.lock"  # flocked by the runner (and the queue folder: see runner_lock)
RUNNER_RECORD = "runner.json"  # the holder's record: pid, host, boot id, start, guard
LOCK_WAITER = WAITER_THREAD  # the thread in which a wait for a lock blocks (tests)
SUBMIT_LOCK = ".submit.lock"  # submit, dead retry, prune, placing committed batches
REPLACE_LOCK = ".replace.lock"  # a replace holds it exclusively; a claim batch, shared
# How long a replace or a replay waits for a claim batch to let go of REPLACE_LOCK (a claim
# takes milliseconds: longer is a runner stopped mid-claim), and how long the replay an open
# of the queue makes waits for its locks before leaving the batch to its submit or runner.
CLAIM_LOCK_WAIT_S = 5.0
# How long a sync of pending/ waits for a claim batch to end (see _fsync_pending): a batch
# takes milliseconds; one held longer is stopped (Ctrl-Z), renaming nothing meanwhile.
PENDING_SYNC_LOCK_WAIT_S = 0.25
OPEN_REPLAY_WAIT_S = 1.0
# What reading a damaged record can raise; each means "quarantine it", never "crash".
_CORRUPT = (ValueError, KeyError, TypeError, RecursionError, AttributeError)


def _doorbell_entry(item: Any) -> Entry:
    """One job of a doorbell (as ``_ring_doorbell`` writes it); ValueError if it is not."""
    seq, job_id, priority, group, accepted_at, not_before, deadline = item
    if not (isinstance(seq, str) and isinstance(job_id, str) and is_job_id(job_id)
            and type(priority) is int and isinstance(group, str)
            and all(isinstance(t, int | float) for t in (accepted_at, not_before))
            and (deadline is None or isinstance(deadline, int | float))):
        raise ValueError("not a doorbell's job")
    return Entry(seq, job_id, priority, group, accepted_at, not_before, deadline)
STATE_DIRS = tuple(s.value for s in State)
AUX_DIRS = ("corrupt", "tmp", "journal", "control")
# Where `dead retry` may be cut short in tests (RENDERCTL_CRASH_AT; see crashpoints.py).
DEAD_RETRY_CRASH_POINTS = ("dead_retry:rewritten", "dead_retry:moved")
# The names renderctl gives its temporaries in tmp/, each starting with the writer's pid:
# ``_tmp_name`` (<pid>-<tag>.<n>.<purpose>, the tag naming the writer's host boot and pid
# namespace: see _owner_tag; versions before it wrote <pid>.<n>.<purpose>), the runner's
# state snapshot (<pid>.state, runner.py) and ``fsutil.atomic_write`` of a holder file
# (<pid>.holder.<prefix>.json.<8 hex>). clean_tmp removes nothing else.
_OWN_TMP = re.compile(
    r"(\d+)(?:-([0-9a-f]{8}))?\.(?:\d+\.[a-z]+|state|holder\..+\.json\.[0-9a-f]{8})")
PRUNE_BATCH = 256  # records prune (dead retry) judges per hold of submit's lock, at most
CANCEL_BATCH = 256  # pending jobs a cancel settles with one sync (see settle_cancelled)
PRUNE_HOLD_S = 0.05  # and prune holds it no longer than this
# A record that reached its state this close to (or after) prune's sync: its running copy's
# removal (the runner retires it just after its commit) may not be on the disk yet.
PRUNE_RECENT_S = 30.0
SMALL_BATCH = 8  # up to this many files, per-file fsync beats one syncfs of everything
# A temporary whose writer's pid means nothing here (another host, another pid namespace)
# is swept only once this old: an in-flight one lives for milliseconds to seconds.
TMP_GRACE_S = 900.0
RETRIED_REASON = "retried from dead"  # a `dead retry` record's reason (see _settle_copies)
CANCELLED_PENDING_REASON = "cancelled while pending"  # cancel_pending's (see _settle_copies)
# Terminal folders in the order find() prefers them.
_FINISHED = (State.DONE, State.DEAD, State.CANCELLED, State.EXPIRED)
# A pending record's test against the terminal folders: four access(2) misses (~20 us)
# against a name listed (~0.5 us): list them when that is cheaper (_finished_probe).
LIST_OVER_PROBE = 40


# -- records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough to tell, later, whether it is still alive."""

    host: str
    boot_id: str
    pid: int
    start_time: int | None

    @classmethod
    def current(cls) -> Holder:
        from renderctl import proctree  # lazily: psutil costs ~9 ms of every CLI start

        return cls(socket.gethostname(), proctree.boot_id(), os.getpid(),
                   proctree.process_start_time(os.getpid()))

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "boot_id": self.boot_id, "pid": self.pid,
                "start_time": self.start_time}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Holder:
        return cls(d["host"], d["boot_id"], int(d["pid"]), d.get("start_time"))


class NoRoom(QueueIOError):
    """The queue's file system has no inode for each new file a batch needs."""


def _no_room(exc: BaseException) -> bool:
    """Whether ``exc`` says the queue's file system is full (a batch waits for room)."""
    return isinstance(exc, NoRoom) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT))


# The <n> of temporaries' names: one count for the process, not per Queue object. Two
# objects in one process (a web tier's threads each opening the queue) counted from 1 alike
# and named their temporaries and cancel intents the same: one's O_EXCL create failed, its
# clean-up removed the other's file, and cancels half done went unsettled (audit BD).
# next() of an itertools.count is one C call, atomic under the GIL: threads never get one
# number twice, as ``+= 1`` then a read did.
_TMP_COUNTER = itertools.count(1)


@functools.cache
def _owner_tag() -> str:
    """8 hex digits naming this host's boot and this process's pid namespace: a pid in a
    temporary's name can be judged alive or dead only by a process with the same tag (a
    submitter in a container has pids of its own, dead or another process's out here).
    "" where /proc cannot tell."""
    import zlib

    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as fh:
            boot = fh.read().strip()
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""
    return f"{zlib.crc32(boot + b':' + str(ns).encode()):08x}"


def name_prefix(name: str, fmt: str) -> str | None:
    """The token prefix in the name of a per-runner control file made from ``fmt`` (such as
    ``HOLDER_FILE``), or None if ``name`` is not one."""
    head, tail = fmt.split("{}")
    if len(name) > len(head) + len(tail) and name.startswith(head) and name.endswith(tail):
        return name[len(head):len(name) - len(tail)]
    return None


# A holder nobody recorded (its file was removed by hand): never judged alive here, so its
# jobs come back after their lease expires, like a runner on another host.
UNKNOWN_HOLDER = Holder("", "", 0, None)


@dataclass(frozen=True)
class Lease:
    """A running job's claim: holder, fencing token, attempt number and expiry (wall s)."""

    holder: Holder
    token: str
    attempt: int
    claimed_at: float
    expires_at: float

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder.to_json(), "token": self.token, "attempt": self.attempt,
                "claimed_at": self.claimed_at, "expires_at": self.expires_at}

    def token_prefix(self, job_id: str) -> str:
        """Who took it: the token's prefix if the token is the one ``make_token`` makes of
        this lease (so the compact xattr can rebuild it); "" if it is not."""
        prefix = self.token.partition(":")[0]
        made = make_token(prefix, job_id, self.attempt, self.claimed_at)
        return prefix if made == self.token else ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Lease:
        return cls(Holder.from_json(d["holder"]), d["token"], int(d["attempt"]),
                   float(d["claimed_at"]), float(d["expires_at"]))


@dataclass(frozen=True)
class JobRecord:
    """Everything the queue keeps about one job; the file's content in every folder."""

    spec: JobSpec
    seq: str
    accepted_at: float
    attempts: tuple[Mapping[str, Any], ...] = ()
    attempt_base: int = 0  # attempts before the last `dead retry`; not charged again
    not_before: float = 0.0
    lease: Lease | None = None
    result: Mapping[str, Any] | None = None
    reason: str = ""
    changed_at: float = 0.0
    # The limits the job was submitted with, where `dead retry` gave it others: the same
    # manifest submitted again (cron) is still this job, not one "with a different spec"
    # (review DO: refused, and the rest of the manifest with it, for good).
    limits_before: Mapping[str, Any] | None = None

    def submitted_as(self, spec: JobSpec) -> bool:
        """Whether ``spec`` is this job as it is, or as it was submitted."""
        mine, theirs = self.spec.to_json(), spec.to_json()
        return same_json(mine, theirs) or bool(self.limits_before) and same_json(
            {**mine, **(self.limits_before or {})}, theirs)

    @property
    def charged_attempts(self) -> int:
        return sum(1 for a in self.attempts[self.attempt_base:]
                   if a.get("outcome") != "released")

    def entry(self) -> Entry:
        s = self.spec
        return Entry(seq=self.seq, job_id=s.id, priority=s.priority, group=s.group,
                     accepted_at=self.accepted_at, not_before=self.not_before,
                     deadline=None if self.attempts else s.deadline)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": FORMAT_VERSION,
            "spec": self.spec.to_json(),
            "seq": self.seq,
            "accepted_at": self.accepted_at,
            "attempts": [dict(a) for a in self.attempts],
            "attempt_base": self.attempt_base,
            "not_before": self.not_before,
            "lease": self.lease.to_json() if self.lease else None,
            "result": dict(self.result) if self.result is not None else None,
            "reason": self.reason,
            "changed_at": self.changed_at,
            **({"limits_before": dict(self.limits_before)} if self.limits_before else {}),
        }

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def loads(cls, raw: bytes) -> JobRecord:
        d = json.loads(raw)
        if not isinstance(d, dict) or d.get("v") != FORMAT_VERSION:
            raise ValueError("not a renderctl job record")
        # Read here, not when first used: a record that loads must not crash the runner,
        # `show` or `cancel` later (every step after reading takes these as dicts).
        attempts = d.get("attempts", ())
        if not isinstance(attempts, list | tuple) \
                or not all(isinstance(a, dict) for a in attempts):
            raise ValueError("attempts: not a list of objects")
        result = d.get("result")
        if result is not None and not isinstance(result, dict):
            raise ValueError("result: not an object")
        # (Malformed, it is dropped, not the record: it only helps tell a resubmit of the
        # job from another job; review DP.)
        before = d.get("limits_before")
        if not isinstance(before, dict):
            before = None
        return cls(
            spec=JobSpec.from_json(d["spec"]),
            seq=str(d["seq"]),
            accepted_at=float(d["accepted_at"]),
            attempts=tuple(attempts),
            attempt_base=int(d.get("attempt_base", 0)),
            not_before=float(d.get("not_before", 0.0)),
            lease=Lease.from_json(d["lease"]) if d.get("lease") else None,
            result=result,
            reason=str(d.get("reason", "")),
            changed_at=float(d.get("changed_at", 0.0)),
            limits_before=before,
        )


@dataclass(frozen=True)
class SubmitResult:
    """What a submit did: ids newly accepted, ids already there with the same spec."""

    accepted: tuple[str, ...]
    already: tuple[str, ...]
    replaced: tuple[str, ...] = ()
    # Of ``already``, how many had ended, per terminal state (those will not run again).
    already_ended: Mapping[str, int] = field(default_factory=dict)
    # Steps after acceptance that failed (the runner's doorbell or wake-up, the event log),
    # one line each; also logged as warnings to the "renderctl" logger. The jobs are
    # accepted all the same: a runner finds them at its next rescan of pending/.
    warnings: tuple[str, ...] = ()
    # Accepted jobs that look doomed here (renderctl.advice): a deadline already past, a
    # program or module not found, an output path that holds something. Also logged.
    advice: tuple[Problem, ...] = ()


@dataclass(frozen=True)
class Claim:
    """A job this process now runs, with the lease that fences it."""

    record: JobRecord

    @property
    def job_id(self) -> str:
        return self.record.spec.id

    @property
    def lease(self) -> Lease:
        assert self.record.lease is not None
        return self.record.lease


@dataclass(frozen=True)
class Transition:
    """One finish: the job's next record and the folder it moves to."""

    record: JobRecord
    dst: State
    src: State = State.RUNNING
    unrun: bool = False  # returned to pending before it started: no attempt was made

    @functools.cached_property
    def event(self) -> dict[str, Any]:
        """Its event (see transition_event), built once for the log and the reporter."""
        return transition_event(self)


@dataclass(frozen=True)
class QueueStatus:
    """Counts per state and what is running, for `status`."""

    counts: Mapping[str, int]
    oldest_pending_age_s: float | None
    running: tuple[JobRecord, ...]
    corrupt: int
    runner: Mapping[str, Any] | None


@dataclass(frozen=True)
class JobView:
    """One job as `show` sees it."""

    state: State
    record: JobRecord
    path: Path


# -- the contract a backend keeps ---------------------------------------------------------


@dataclass(frozen=True)
class TakenPending:
    """A pending job a cancel has moved to cancelled/, not yet settled (see take_pending)."""

    job_id: str
    inode: tuple[int, int]  # (device, inode) of the record moved: replaced since if not


class QueueBackend(Protocol):
    """What the runner and the CLI need of a queue; the directory queue below is one
    implementation, and a PostgreSQL one must pass the same contract tests.

    complete / fail / release / dead-letter are all ``finish`` with the job's next record
    (``Transition``): one batched call, so a backend can make a whole group durable at once.
    """

    def submit(self, jobs: Sequence[JobSpec | Mapping[str, Any]], *, replace: bool = False,
               max_pending: int | None = None) -> SubmitResult: ...

    def claim(self, index: ClaimIndex, *, holder: Holder, lease_s: float, limit: int,
              token_prefix: str, crash_hook: Callable[[str], None] | None = None,
              ) -> tuple[list[Claim], list[JobRecord]]: ...

    def renew(self, claims: Iterable[Claim], *, lease_s: float) -> list[Claim]: ...

    def holds(self, claim: Claim) -> bool: ...

    def finish(self, transitions: Sequence[Transition], *,
               crash_hook: Callable[[str], None] | None = None,
               held: Callable[[Transition], bool] | None = None,
               logged_after: str | None = None) -> list[Transition]: ...

    def cancel_pending(self, job_id: str) -> bool: ...

    def request_cancel(self, job_id: str) -> Path: ...

    def find(self, job_id: str) -> JobView | None: ...

    def list_ids(self, state: State) -> list[str]: ...

    def status(self, *, oldest_pending: bool = True) -> QueueStatus: ...


def _check_id(job_id: str) -> None:
    """Refuse, before it becomes a path, what no job can be called: an id given through the
    API is joined to a folder, where "../done/x" named a record outside the folder meant
    (a cancel rewrote a done record, then said "cancelled"; audit CX) and "../../x" a file
    outside the queue."""
    if not is_job_id(job_id):
        raise JobNotFound(f"no job {job_id!r}: not a job id (ids match "
                          "[A-Za-z0-9._-]{1,128} and do not start with '.')")


def _holder_alive(info: Mapping[str, Any]) -> bool | None:
    """Whether the holder record's runner (a runner's Holder) runs: None if it is on
    another host or its record is damaged (nothing here can tell), False if nobody wrote
    one (a reader holds the lock, not a runner)."""
    if not info.get("pid"):
        return False
    from renderctl.proctree import holder_alive

    try:
        return holder_alive(host=str(info.get("host", "")), boot_id=str(info.get("boot_id")),
                            pid=int(info["pid"]), start_time=int(info.get("start_time") or 0))
    except (TypeError, ValueError):
        return None


def _already_here(spec: JobSpec, view: JobView, replace: bool) -> bool:
    """Whether a submit of ``spec`` finds its job already accepted, as ``view``: the same
    spec, or the job as it was submitted, its limits since changed by `dead retry`. That
    one only --replace while it waits replaces, giving it the manifest's limits back
    (review DP); once it ran or runs, a routine resubmit with --replace ran a done job
    again, into output_exists, and refused a whole batch for a running one (review DR)."""
    rec = view.record
    if same_json(rec.spec.to_json(), spec.to_json()):
        return True
    return rec.submitted_as(spec) and not (replace and view.state is State.PENDING)


def same_json(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two specs are the same as JSON, not merely equal in Python, where true == 1
    == 1.0: params {x = true} submitted over {x = 1} was "already accepted", the change
    dropped even with --replace, and a python job's callable sees the difference (audit
    DT). Equality first: it settles every spec that differs, cheaply."""
    return a == b and json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _refusal(spec: JobSpec, view: JobView, replace: bool) -> Problem | None:
    """Why a submit of ``spec`` is refused, its id found as ``view`` (None: it is not;
    the same spec is "already accepted", a changed one replaced, if ``replace``)."""
    if _already_here(spec, view, replace):
        return None
    old, new = view.record.spec.to_json(), spec.to_json()
    if not replace:
        # The fields named: a changed --out or default limit (out_root, memory_mb) is
        # invisible in the manifest the user is looking at. Said here, not by the command
        # line alone: a web tier's caller got no field and a flag it has no use for (audit
        # CX).
        # (As JSON: params {x = true} differ from {x = 1}, though equal in Python.)
        fields = ", ".join(k for k in {**old, **new}
                           if not same_json({"v": old.get(k)}, {"v": new.get(k)}))
        return Problem("<queue>", spec.id, None, f"already in the queue ({view.state.value}) "
                       f"with a different spec (differs in {fields}); use --replace "
                       "(through the API: replace=True) to replace it")
    if view.state is State.RUNNING:
        return Problem("<queue>", spec.id, None, "is running; cancel it before replacing it")
    return None


def parse_token(token: str) -> tuple[str, str, str]:
    """(runner prefix, job id, attempt) of a token made by ``make_token``; "" where absent."""
    prefix, job_id, attempt, *_ = [*token.split(":", 3), "", "", ""]
    return prefix, job_id, attempt


def _queue_path(path: str | os.PathLike[str]) -> Path:
    """The queue's absolute path as shown to people and written into events.

    With a ``..`` in it, the path is resolved: ``w/..`` is where the kernel goes, which is
    not the folder ``w`` is in when ``w`` is a symlink, so dropping the pair by text
    (normpath) could name another folder. Without one it is kept as given (absolute), so a
    queue reached through a symlinked folder keeps the name its user knows it by."""
    p = Path(path).absolute()
    return p.resolve() if ".." in p.parts else p


class NotARecordFile(ValueError):
    """A folder, FIFO or device where a record file should be (put there by hand)."""

    def __init__(self, inode: tuple[int, int]) -> None:
        super().__init__("not a regular file")
        self.inode = inode


def _stale_name(path: Path) -> bool:
    """Whether ``path`` (an unreadable journal entry) is a name a power cut brought back
    for a file since reused: removed if so.

    A committed entry is retired by a rename nothing syncs (a lost rename only means a
    replay, which is idempotent), and the runner then unlinks the retired name. On a file
    system without a journal a cut can keep the old name while the freed inode was
    reused, and made durable, by another file (seen: the runner's holder record, written
    just after). Such an inode has two names (fsck counts them); an entry is written under
    a temporary name and renamed, so a real one has one. A quarantine would report damage
    that is not there, and link a control file into corrupt/."""
    try:
        if os.lstat(path).st_nlink < 2:
            return False
    except OSError:
        return False
    unlink_quiet(path)
    return True


def _read_with_inode(path: Path, *, again: bool = True) -> tuple[bytes, tuple[int, int]]:
    """A file's bytes and the (device, inode) they were read from; NotARecordFile if it is
    not a regular file (O_NONBLOCK: opening a FIFO would wait for a writer, deaf to
    SIGTERM, and hang `status` and the runner's recovery)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # A socket, or a device node with no driver, cannot even be opened: not a record
        # either (review FA: one bound in pending/ stopped every runner with 74)
        if exc.errno not in (errno.ENXIO, errno.ENODEV):
            raise
        # What open() reached (a symlink followed, as quarantine checks it: review FB), and
        # never a regular file (one renamed over the name since is a record: read it then)
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            if again:
                return _read_with_inode(path, again=False)
            raise
        raise NotARecordFile((st.st_dev, st.st_ino)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARecordFile((st.st_dev, st.st_ino))
        with open(fd, "rb", closefd=False) as fh:
            return fh.read(), (st.st_dev, st.st_ino)
    finally:
        os.close(fd)


# -- the queue ----------------------------------------------------------------------------


class Queue:
    """A directory queue; the public API for programs that enqueue and for the runner."""

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock = SYSTEM_CLOCK,
                 create: bool = True, settle: bool = True) -> None:
        if (why := bad_folder_name(path)) is not None:
            # (a ValueError for a NUL, from deep inside; audit CX)
            raise UserError(f"Queue({reprlib.repr(path)}): the queue's path {why}")
        if not os.fspath(path):
            # Path("") is the current folder: its files would get the queue's folders among
            # them (audit BD), where the command line refuses --queue "".
            raise UserError("Queue(''): the queue's path is empty; name its folder "
                            "(e.g. '.renderctl')")
        self.path = _queue_path(path)
        self.clock = clock
        self.events = EventLog(self.path / "events.jsonl", create=settle)
        self._tmp_counter = _TMP_COUNTER
        # In spare names: another Queue object in a process of the same pid (a restarted
        # container's runner is pid 1 every time; tests reopen queues in one process) would
        # count from 0 again, and rename a record over a spare it had adopted and not yet
        # used, which would then be listed twice and filled for two records.
        self._spare_tag = secrets.token_hex(4)
        self._replace_fd: int | None = None  # REPLACE_LOCK, opened by the first claim
        self._replace_holds = 0  # how deep this object holds REPLACE_LOCK (either mode)
        self._pruned_synced_at = 0.0  # when prune's last sync began (wall clock)
        self._replace_held = HeldOff(self.path / REPLACE_LOCK)  # claims it held off
        self._runner_fd: int | None = None  # the queue folder, flocked while runner_lock
        # DESIGN: corrupt files are "quarantined and reported": what this object moved, and
        # whom to tell at once.
        self.quarantined: list[dict[str, Any]] = []
        self.on_quarantine: Callable[[dict[str, Any]], None] | None = None
        # A wait for a lock another process holds (see lockwait): whom to tell who holds
        # it (the command line prints it), and whether a stop signal ends the wait (`run`,
        # `submit`, `cancel` and `prune`, whose handlers only record one: the number of the
        # signal, or None). A prune stops at the next record too (stop_signal).
        self.on_lock_wait: Callable[[str], None] | None = None
        self.stop_requested: Callable[[], int | None] | None = None
        # What this object's last submit put in pending/: load_index need not read those
        # back (a later replace or cancel is caught at claim, which re-reads the file
        # anyway). The last submit's only: a web tier's Queue lives for days and never
        # loads an index, so accumulating them grew its memory by every job it accepted.
        self._submitted: dict[str, Entry] = {}
        # Retired record files kept for reuse (see recycle()): the runner's, under its lock.
        self._free: list[str] = []
        self._xattrs = True  # until the file system says otherwise
        self._dirs: dict[str, Path] = {}
        self._dstr: dict[State, str] = {}
        # A submit of this object left a committed batch not wholly placed (SubmitIncomplete):
        # the next submit places it first (a web tier's Queue is never opened again).
        self._replay_due = False
        # Why accepted jobs of an earlier submit are not in pending/ yet (None: all are):
        # the roll-forward below failed (a full disk). Not raised: `status`, `dead purge`
        # and `prune` must still work on such a queue (the last two free the room the
        # batch needs); `run` and `submit` refuse with it (see unplaced_error).
        self.unplaced: str | None = None
        if create:
            self._refuse_a_users_folder()
            self._create()
        elif not (self.path / "pending").is_dir():
            raise QueueIOError(f"{self.path} is not a renderctl queue (no pending/ folder)")
        self._settled = settle
        if settle:
            self.roll_forward()
        elif n := self.unplaced_count():
            # An open that writes nothing (root in a user's queue): what it would have
            # settled is said, not hidden (review FZ: `show` called such a job unknown).
            self.unplaced = (f"{n} accepted job(s) of an earlier submit may not be in "
                             "pending/ yet: the next command of the queue's owner places "
                             "them")

    def roll_forward(self, *, wait: bool = False) -> None:
        """Place committed batches no submit is placing, settle what a killed cancel took,
        and clean tmp/ (every open does this). ``wait``: for the locks as long as it takes
        (a runner: it must not start without them), not OPEN_REPLAY_WAIT_S."""
        try:
            names = os.listdir(self.dir("journal"))
        except FileNotFoundError:
            return
        cancels = [n for n in names if n.endswith(".cancel")]
        try:
            if cancels:
                # (BlockingIOError: a submit holds its lock; the next open settles them.)
                with contextlib.suppress(BlockingIOError):
                    self._settle_interrupted_cancels(cancels)
        except OSError as exc:
            raise QueueIOError(os_error_message(exc)) from exc
        try:
            self._roll_forward_journals(names, wait=wait)
        except (OSError, QueueIOError) as exc:
            if not _no_room(exc):
                # A failed fsync, an unreadable folder: fatal as anywhere (exit 74).
                if isinstance(exc, OSError):
                    raise QueueIOError(os_error_message(exc)) from exc
                raise
            self.unplaced = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
            self._replay_due = True
            with contextlib.suppress(OSError):
                self.clean_tmp()
            return
        if not self._replay_due:
            self.unplaced = None

    @property
    def settled(self) -> bool:
        """Whether the open settled what killed commands left (False: one that writes
        nothing, root's in a user's queue)."""
        return self._settled

    @property
    def replay_due(self) -> bool:
        """Whether a committed batch may be left unplaced: the open gave up on a held lock,
        or the disk had no room (see roll_forward)."""
        return self._replay_due

    def unplaced_error(self) -> QueueIOError | None:
        """The error of a queue holding accepted jobs it could not place in pending/, for
        the commands that must not go on without them (None if there are none)."""
        if self.unplaced is None:
            return None
        if not self._settled:
            return QueueIOError(self.unplaced)
        return QueueIOError(f"{self.unplaced_count()} accepted job(s) of an earlier submit "
                            f"are not yet in pending/ ({self.unplaced}); free room on the "
                            "queue's file system (`renderctl prune`, `dead purge`), and the "
                            "next command places them")

    def unplaced_count(self) -> int:
        """How many jobs the journal's committed batches hold (placed or not)."""
        return len(self._journal_ids())

    def _journal_ids(self) -> set[str]:
        """The ids of the jobs in the journal's committed batches (placed or not); an
        entry that cannot be read counts for none."""
        ids: set[str] = set()
        with contextlib.suppress(OSError):
            for name in os.listdir(self.dir("journal")):
                if name.endswith(".txn"):
                    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                        txn = json.loads((self.dir("journal") / name).read_bytes())
                        ids.update(r["spec"]["id"] for r in txn["records"])
        return ids

    def close(self) -> None:
        """Close the descriptors this object keeps (the claim lock, the event log)."""
        if self._replace_fd is not None:
            with contextlib.suppress(OSError):
                close_lock(self._replace_fd)
            self._replace_fd = None
        self.events.close()

    # -- layout --
    def dir(self, name: str | State) -> Path:
        key = name.value if isinstance(name, State) else name
        d = self._dirs.get(key)
        if d is None:  # a Path per call was a visible share of the runner's per-job CPU
            d = self._dirs[key] = self.path / key
        return d

    def _refuse_a_users_folder(self) -> None:
        """A new queue takes a missing or empty folder, as the command line's does."""
        try:
            if not holds_users_files(self.path):
                return
        except OSError as exc:
            raise QueueIOError(os_error_message(exc)) from exc
        raise UserError(f"{self.path} is not a renderctl queue and not empty (a new queue "
                        "needs a missing or empty folder)")

    def _create(self) -> None:
        # The folders makedirs is about to make, the queue's own included.
        new = list(itertools.takewhile(lambda d: not d.exists(),
                                       (self.path, *self.path.parents)))
        try:
            makedirs(self.path, mode=0o700)
        except (FileExistsError, NotADirectoryError) as exc:
            # A file where the queue's folder (or one above it) should be: the caller's
            # mistake, as the command line says it (audit FC: an I/O error, 74, here)
            where = "it is a file" if isinstance(exc, FileExistsError) else \
                "a file is in the way on its path"
            raise UserError(f"{self.path} cannot be a queue folder: {where}") from exc
        except OSError as exc:
            raise QueueIOError(f"cannot create queue {self.path}: {exc.strerror}") from exc
        for d in new:
            # Protects against: power loss after "accepted" losing a new folder's entry in
            # its parent, and with it every job just accepted under it. A parent we may not
            # open (a folder readable by others only) cannot be fsynced by us; its fsync's
            # own failure is fatal like any other.
            try:
                fd = os.open(d.parent, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            try:
                fsync_fd(fd, what=f"directory {d.parent}")
            finally:
                os.close(fd)
        made = False
        for name in STATE_DIRS + AUX_DIRS:
            d = self.path / name
            try:
                if not d.is_dir():
                    d.mkdir(mode=0o700, exist_ok=True)
                    made = True
            except OSError as exc:
                # The queue's own folder replaced by a file, say: name it (the message
                # named the queue, "File exists", as if it were the queue that was in the
                # way).
                why = "not a folder" if isinstance(exc, FileExistsError) else exc.strerror
                raise QueueIOError(f"queue {self.path}: {d}: {why}") from exc
        if made:
            # Protects against: power loss leaving the folders unrecorded after we report
            # "accepted" into one of them.
            fsync_dir(self.path)

    def _tmp_name(self, purpose: str) -> Path:
        # The pid prefix tells the cleaner which temporaries belong to a live process.
        n = next(self._tmp_counter)
        tag = _owner_tag()
        return self.dir("tmp") / f"{os.getpid()}{'-' if tag else ''}{tag}.{n}.{purpose}"

    def recycle(self, path: str) -> None:
        """Retire a record file by keeping its inode for a later record instead of unlinking.

        On this ext4 (no journal) every create scans past the inodes deleted in the last
        30-60 s (ext4's recently_deleted()): with one unlink per job, creates (ours and the
        jobs' outputs) grew to a quarter of the machine's CPU. Refilling an old inode needs
        no inode allocation at all, so the steady state deletes and creates no record file.
        """
        free = f"{self.dir('tmp')}/{FREE_PREFIX}{os.getpid()}.{self._spare_tag}." \
            f"{next(self._tmp_counter)}"
        try:
            os.rename(path, free)
        except FileNotFoundError:
            return
        if self._xattrs:
            # A stale lease on a reused inode would name another job's holder and attempt.
            with contextlib.suppress(OSError):
                os.removexattr(free, LEASE_XATTR)
        self._free.append(free)

    def adopt_free(self) -> None:
        """Take over the retired record files a previous runner left (runner lock held)."""
        known = set(self._free)  # a path listed twice would be filled for two records
        self._free.extend(p for n in os.listdir(self.dir("tmp"))
                          if n.startswith(FREE_PREFIX)
                          and (p := f"{self.dir('tmp')}/{n}") not in known)

    def trim_free(self, keep: int = 64) -> None:
        while len(self._free) > keep:
            remove_quiet(self._free.pop())

    def _record_tmp(self, data: bytes) -> str:
        """A temporary file under tmp/ holding ``data``: a reused inode when one is free."""
        while self._free:
            tmp = self._free.pop()
            try:
                fill_file(tmp, data)
            except OSError:
                # Gone, or no longer a file of ours: a job runs as we do and may have put a
                # FIFO there (the runner hung in open(), and again at every restart), a
                # folder or a symlink (exit 74, and the other workers' jobs charged). A
                # spare is only an inode to save a create: drop it. A disk that really
                # fails fails the create below too.
                remove_quiet(tmp)
                continue
            return tmp
        tmp = str(self._tmp_name("finish"))
        write_file(tmp, data, fsync=False)
        return tmp

    def _rpath(self, state: State, job_id: str) -> str:
        """record_path as a str: the runner's per-job path (pathlib cost ~10 us per path)."""
        d = self._dstr.get(state)
        if d is None:
            d = self._dstr[state] = str(self.dir(state))
        return f"{d}/{job_id}.json"

    def record_path(self, state: State | str, job_id: str) -> Path:
        """Where ``job_id``'s record is filed in ``state``'s folder: for ids the queue
        listed or validated (a name listed may be one no job has: quarantined by it). An id
        from outside goes through ``_check_id`` first (take_pending, request_cancel...)."""
        return self.dir(state) / f"{job_id}.json"

    def _fsync_pending(self) -> None:
        """fsync pending/ (what a submit, a cancel or a retry changed there) without
        splitting a runner's claim.

        A claim renames pending/x to running/x and leaves the sync to the runner's next
        group commit (a syncfs: every folder at once). On a file system without a journal
        (this machine's ext4) each folder's block reaches the disk on its own, so an fsync
        of pending/ alone between a claim and that commit puts the claim's removal on the
        disk without its addition, and a power cut then leaves the job in neither folder
        (fsck hands its file to lost+found): an accepted job lost. So running/ is synced
        first, with claims held off meanwhile (a claim batch skips its round while a
        replace lock is held), so that no claim lands between the two. The same for a
        cancel's take (pending/x to cancelled/x, synced when the cancel settles): cancelled/
        first too, and takes are held off by the same lock.
        (tests/integration/test_power_loss.py: after claims, or a take, and a command.)"""
        # (Held here already, in either mode: taking it again would wait on ourselves; the
        # folders are still synced in order.)
        if not self._replace_holds:
            try:
                with self._lock(REPLACE_LOCK, wait_s=PENDING_SYNC_LOCK_WAIT_S):
                    self._fsync_out_of_pending_then_pending()
                return
            except BlockingIOError:
                pass  # held by a claim batch that is stopped: it renames nothing meanwhile
        self._fsync_out_of_pending_then_pending()

    def _fsync_out_of_pending_then_pending(self) -> None:
        for state in (State.RUNNING, State.CANCELLED, State.PENDING):
            fsync_dir(self.dir(state))

    @contextlib.contextmanager
    def _lock(self, name: str, *, blocking: bool = True, shared: bool = False,
              wait_s: float | None = None, busy: str = "",
              doing: str = "nothing was done") -> Iterator[int]:
        """Hold the lock file ``name``; BlockingIOError if not ``blocking`` and it is held,
        or if ``wait_s`` passes before it is free (QueueBusy saying ``busy``, if given).
        Without ``wait_s``, wait as lockwait does (``doing``: what its messages say of the
        command, "nothing was enqueued"). The submit lock is also taken on journal/ (see
        _lock_folder)."""
        path = self.path / name
        fd = open_lock_file(path)
        folder = -1
        try:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            self._flock(fd, mode, path, blocking=blocking, wait_s=wait_s, busy=busy,
                        doing=doing)
            if name == SUBMIT_LOCK:
                folder = self._lock_folder(mode, blocking=blocking, wait_s=wait_s, busy=busy,
                                           doing=doing)
            replace_lock = name == REPLACE_LOCK
            self._replace_holds += replace_lock
            try:
                yield fd
            finally:
                self._replace_holds -= replace_lock
        finally:
            for f in (folder, fd):
                if f >= 0:
                    close_lock(f)

    def _lock_folder(self, mode: int, **wait: Any) -> int:
        """The submit lock's second flock, on the journal/ folder, taken after the file's.

        The file alone was not enough: `rm QUEUE/.submit.lock` under a submit that held it
        (a lock file looks stale to many) let the next submit lock a new file and run beside
        it, and one accepted job's spec was silently replaced by the other's. A folder
        holding the queue's committed batches is not removed by hand. The file stays the
        lock older versions take, so they and this one still exclude each other."""
        path = self.dir("journal")
        try:
            fd = held(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        except (FileNotFoundError, NotADirectoryError):
            # A queue opened without creating its folders, or journal/ replaced by a file:
            # what needs the folder (a batch) fails there, saying so; a one-job submit,
            # which does not, goes on.
            return -1
        except OSError as exc:
            raise QueueIOError(f"cannot open {path}: {exc.strerror}") from exc
        try:
            # (Named as the submit lock in what a wait says: the folder is its second half.)
            self._flock(fd, mode, self.path / SUBMIT_LOCK, **wait)
        except BaseException:
            close_lock(fd)
            raise
        return fd

    def _flock(self, fd: int, mode: int, path: Path, *, blocking: bool,
               wait_s: float | None, busy: str, doing: str) -> None:
        if not blocking:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        elif wait_s is None:
            wait_for_flock(fd, mode, path, doing=doing, notice=self.on_lock_wait,
                           stop_requested=self.stop_requested)
        else:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        if busy:
                            raise self._claims_held(busy) from None
                        raise
                    time.sleep(0.005)

    def _claims_held(self, doing: str) -> QueueBusy:
        """The error of a command that waited CLAIM_LOCK_WAIT_S for a claim to end."""
        return QueueBusy(f"another renderctl process has held {self.path}'s claim lock "
                         f"for {CLAIM_LOCK_WAIT_S:g} s (a claim or a cancel takes "
                         "milliseconds: a runner stopped mid-claim, by Ctrl-Z or SIGSTOP? "
                         f"`kill -CONT` it); {doing}; try again")

    # -- reading --
    def read_record(self, path: Path) -> JobRecord:
        with open(path, "rb") as fh:
            return self._with_lease(path, JobRecord.loads(fh.read()))

    def _with_lease(self, path: Path, rec: JobRecord) -> JobRecord:
        """A running record's lease lives in its xattr (unless written inline)."""
        if rec.lease is not None or path.parent.name != State.RUNNING.value:
            return rec
        lease = read_lease(path)
        return replace(rec, lease=lease) if lease is not None else rec

    def _read_or_quarantine(self, path: Path) -> JobRecord | None:
        """Read a record; an unparseable one is moved to corrupt/ and reported, not lost."""
        return self._read_or_quarantine_inode(path)[0]

    def _read_or_quarantine_inode(
            self, path: Path) -> tuple[JobRecord | None, tuple[int, int] | None]:
        """_read_or_quarantine, with the (device, inode) the record was read from."""
        try:
            raw, inode = _read_with_inode(path)
        except FileNotFoundError:
            if os.path.islink(path):  # never made by renderctl: counted, never run
                self.quarantine(path, "not a regular file (a symlink to nothing)")
            return None, None
        except NotARecordFile as exc:
            self.quarantine(path, str(exc), inode=exc.inode)
            return None, exc.inode
        try:
            rec = JobRecord.loads(raw)
        except _CORRUPT as exc:
            self.quarantine(path, f"unparseable: {exc}", inode=inode)
            return None, inode
        if rec.spec.id != path.stem:
            # Either a recycled record file read as the runner refilled it (the path names
            # another file by now: leave it), or a record filed under the wrong name (moved
            # by hand): that one would never run, so it is reported like a corrupt one.
            self.quarantine(path, f"the record of job {rec.spec.id!r} filed as {path.name}",
                            inode=inode)
            return None, inode
        return self._with_lease(path, rec), inode

    def quarantine(self, path: Path, reason: str,
                   inode: tuple[int, int] | None = None) -> Path:
        """Move an unparseable file to corrupt/. With ``inode`` (what was read), only if the
        path still names that file: a reader in another process may have read a running
        record's file after the runner recycled it (see recycle) and refilled it, torn;
        the path may name the job's next claim by then, which must not be moved."""
        if inode is not None:
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return path
            if (st.st_dev, st.st_ino) != inode:
                return path
        # Unique per quarantine: two damaged copies of one name must both be kept.
        stamp = f"{time.time_ns()}.{os.getpid()}.{os.urandom(3).hex()}"
        dst = self.dir("corrupt") / f"{path.parent.name}.{path.name}.{stamp}"
        try:
            os.rename(path, dst)
        except FileNotFoundError:
            return dst
        # Protects against: power loss losing the move (each folder's block is written on
        # its own). corrupt/ first: synced the other way round, a cut between the two kept
        # the removal from the source folder and lost the name in corrupt/, and the file
        # went to lost+found (a quarantined file is never to be lost). This way a cut keeps
        # it in both at worst, and the next reader quarantines it a second time.
        fsync_dir(self.dir("corrupt"))
        if path.parent == self.dir(State.PENDING):
            self._fsync_pending()  # (not to split a runner's claim: see there)
        else:
            fsync_dir(path.parent)
        ev = {"ts": self.clock.wall(), "event": "corrupt",
              "file": f"{path.parent.name}/{path.name}", "moved_to": dst.name, "reason": reason}
        self.events.append([ev])
        self.quarantined.append(ev)
        if self.on_quarantine is not None:
            self.on_quarantine(ev)  # a runner reports it with its other events
        return dst

    def has_record(self, state: State, job_id: str) -> bool:
        """Whether ``state``'s folder has a record named for ``job_id``."""
        return is_job_id(job_id) and self.record_path(state, job_id).exists()

    def find(self, job_id: str) -> JobView | None:
        """Where a job is. Later states are checked first (a crash may leave two copies)."""
        if not is_job_id(job_id):
            # No job can have it: not a path to look up, where "../pending/x" would find x,
            # and 300 characters would be an I/O error (exit 74).
            return None
        order = (State.DONE, State.DEAD, State.CANCELLED, State.EXPIRED, State.PENDING,
                 State.RUNNING)
        for _ in range(3):  # a job moving between folders during the scan: look again
            for state in order:
                p = self.record_path(state, job_id)
                rec = self._read_or_quarantine(p)
                if rec is not None:
                    return JobView(state, rec, p)
        return None

    def _copies(self, job_id: str) -> list[JobView]:
        """Every copy of a job (normally one; a crash mid-move may leave two)."""
        views = []
        for state in State:
            p = self.record_path(state, job_id)
            rec = self._read_or_quarantine(p)
            if rec is not None:
                views.append(JobView(state, rec, p))
        return views

    def get(self, job_id: str) -> JobView:
        """The job's view; JobNotFound (saying where a damaged record went), or, for a
        queue that cannot be read (its folder removed, a folder of it replaced by a file),
        QueueIOError, as status() and submit() raise: a bare OSError reached the API's
        callers from deep inside (audit BD)."""
        try:
            return self._get(job_id)
        except OSError as exc:
            raise QueueIOError(os_error_message(exc)) from exc

    def _get(self, job_id: str) -> JobView:
        seen = len(self.quarantined)
        view = self.find(job_id)
        if view is None:
            for ev in self.quarantined[seen:]:
                if ev["file"].endswith(f"/{job_id}.json"):
                    raise JobNotFound(f"job {job_id!r}: its record {ev['file']} could not be "
                                      f"read ({ev['reason']}); moved to "
                                      f"{self.dir('corrupt') / ev['moved_to']}",
                                      quarantined=True)
            # Quarantined earlier (by `status`, a runner): say where it is, not "no job".
            if (kept := self.corrupt_copy(job_id)) is not None:
                raise JobNotFound(f"job {job_id!r}: its record could not be read and was "
                                  f"moved to {kept}", quarantined=True)
            raise JobNotFound(f"no job {job_id!r} in queue {self.path}")
        return view

    def corrupt_copy(self, job_id: str) -> Path | None:
        """The latest record of ``job_id`` moved to corrupt/, if any."""
        kept = sorted((n for n in os.listdir(self.dir("corrupt"))
                       if n.split(".", 1)[-1].startswith(f"{job_id}.json.")),
                      key=lambda n: n.rpartition(".json.")[2])  # by time quarantined
        return self.dir("corrupt") / kept[-1] if kept else None

    def list_ids(self, state: State) -> list[str]:
        return sorted(n[:-5] for n in os.listdir(self.dir(state)) if n.endswith(".json"))

    def job_ids(self, state: State) -> list[str]:
        """``list_ids``, less what is filed under a name no job can have (a copy made by
        hand: ``x (copy).json``): moved to corrupt/ and reported, as a runner does in
        pending/. `find` never looks such a name up, so it was counted by `status`, skipped
        by `dead list`, and made `dead retry --all` refuse every job as "not in dead/"."""
        ids = []
        for jid in self.list_ids(state):
            if is_job_id(jid):
                ids.append(jid)
            else:
                self.quarantine(self.record_path(state, jid),
                                f"{jid}.json is not named for a job id")
        return ids

    def records(self, state: State) -> list[JobView]:
        """The readable records in ``state``'s folder, by id (see ``job_ids``)."""
        views = []
        for jid in self.job_ids(state):
            path = self.record_path(state, jid)
            rec = self._read_or_quarantine(path)
            if rec is not None:
                views.append(JobView(state, rec, path))
        return views

    def count(self, state: State | str) -> int:
        with os.scandir(self.dir(state)) as it:
            return sum(1 for e in it if e.name.endswith(".json") or state == "corrupt")

    def oldest_pending_age_s(self) -> float | None:
        """Age of the longest-waiting pending job, from file mtimes: the time its record was
        last written (acceptance or last retry), without reading every file."""
        oldest: float | None = None
        try:
            with os.scandir(self.dir(State.PENDING)) as it:
                for e in it:
                    if not e.name.endswith(".json"):
                        continue  # what `count` counts, or a stray file ages an empty queue
                    try:
                        m = e.stat().st_mtime
                    except FileNotFoundError:
                        continue
                    oldest = m if oldest is None or m < oldest else oldest
        except FileNotFoundError:
            return None
        return None if oldest is None else max(0.0, self.clock.wall() - oldest)

    def status(self, *, oldest_pending: bool = True) -> QueueStatus:
        """Counts, running records, runner; ``oldest_pending=False`` skips the age of the
        oldest pending job (None then): a stat of every pending record, which a caller
        that has the runner's figure need not pay for."""
        try:
            return self._status(oldest_pending=oldest_pending)
        except OSError as exc:
            # As submit's: the queue folder removed or unreadable is renderctl's I/O error.
            raise QueueIOError(os_error_message(exc)) from exc

    def _status(self, *, oldest_pending: bool) -> QueueStatus:
        running = []
        for jid in self.list_ids(State.RUNNING):
            rec = self._read_or_quarantine(self.record_path(State.RUNNING, jid))
            if rec is not None:
                running.append(rec)
        # Counted after the reads above: a record they quarantined is then counted once, as
        # corrupt, not also as running. And each job once, where `find` finds it: a runner
        # renames a job's new record into done/ (pending/, for a retry) before it retires the
        # running copy, and a claim between the listings of pending/ and running/ (listed in
        # that order) shows the job in both. A running copy with a record elsewhere is stale.
        # Only names a job can have: a copy made by hand (`x (copy).json`, `.x.json`) is no
        # job, and a runner moves it to corrupt/ (it was counted as one more pending).
        listed = {s: [n for n in os.listdir(self.dir(s))
                      if n.endswith(".json") and is_job_id(n[:-5])] for s in State}
        # A job that moved backwards between those listings (running -> pending: a retry;
        # dead -> pending: `dead retry`) is in none of them: pending/ once more, last (7 of
        # 3,456 calls beside a runner retrying 100 jobs counted 96-98 of them).
        seen = set(itertools.chain.from_iterable(listed.values()))
        listed[State.PENDING] += [n for n in os.listdir(self.dir(State.PENDING))
                                  if n not in seen and n.endswith(".json")
                                  and is_job_id(n[:-5])]
        in_running = set(listed[State.RUNNING])
        stale = {n for s, names in listed.items() if s is not State.RUNNING
                 for n in names if n in in_running} if in_running else set()
        counts = {s.value: len(names) for s, names in listed.items()}
        counts[State.RUNNING.value] -= len(stale)
        live = in_running - stale
        running = [r for r in running if f"{r.spec.id}.json" in live]
        # Claimed between the reads above and the listings: read now, so that the count and
        # the jobs listed agree (`running: 3` beside two running_jobs, audit AX); one gone
        # again (finished, or quarantined) meanwhile is no longer counted as running.
        read = {f"{r.spec.id}.json" for r in running}
        for name in sorted(live - read):
            rec = self._read_or_quarantine(self.dir(State.RUNNING) / name)
            if rec is not None:
                running.append(rec)
            else:
                counts[State.RUNNING.value] -= 1
        running.sort(key=lambda r: r.spec.id)
        return QueueStatus(counts=counts,
                           oldest_pending_age_s=(self.oldest_pending_age_s() if oldest_pending
                                                 else None),
                           running=tuple(running), corrupt=self.count("corrupt"),
                           runner=self.runner_info())

    # -- submit --
    def submit(
        self,
        jobs: Sequence[JobSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        max_pending: int | None = None,
        base: str | os.PathLike[str] = ".",
        out_root: str | os.PathLike[str] = "out",
        limits: Limits = Limits(),
        crash_hook: Callable[[str], None] | None = None,
        advise: bool = True,
    ) -> SubmitResult:
        """Validate and enqueue atomically: every job of this call is accepted, or none.

        Plain dicts are validated exactly like manifest jobs (inputs relative to ``base``).
        With ``advise``, the accepted jobs that look doomed here are in ``advice``.
        ``crash_hook`` is for tests (see crashpoints.py).
        """
        if isinstance(jobs, str | bytes | Mapping) or not isinstance(jobs, Iterable):
            # A str would be validated character by character, a dict key by key.
            hint = "; put one job in a list" if isinstance(jobs, Mapping) else ""
            raise ManifestError([Problem(
                "<api>", None, None, "submit() takes a list of jobs (dicts or JobSpecs), got "
                f"{type(jobs).__name__} {reprlib.repr(jobs)}{hint}")])
        if max_pending is not None and (isinstance(max_pending, bool)
                                        or not isinstance(max_pending, int) or max_pending < 0):
            # (a TypeError from deep inside, for "5")
            raise UserError(f"max_pending must be a whole number >= 0 or None, got "
                            f"{reprlib.repr(max_pending)}")
        if not isinstance(limits, Limits):
            raise UserError(f"limits must be a renderctl.manifest.Limits, got "
                            f"{type(limits).__name__}")
        if not isinstance(replace, bool):
            # (audit FC: replace="no", truthy, replaced an accepted job's spec)
            raise UserError(f"replace must be True or False, got {reprlib.repr(replace)}")
        jobs = list(jobs)  # once: a generator's first job was taken by the check below
        if any(not isinstance(j, JobSpec) for j in jobs):
            # Anything else (a str, None) goes to validation, which names it: "job #1: a
            # job must be a table", not an AttributeError from here.
            specs = jobs_from_dicts([j.to_json() if isinstance(j, JobSpec) else j
                                     for j in jobs], base=base, out_root=out_root,
                                    limits=limits)
        else:
            specs = list(jobs)  # type: ignore[arg-type]
        if problems := self._placement_problems(specs):
            raise ManifestError(problems)
        existed: set[str] = set()
        if advise:
            from renderctl.advice import existing_outputs

            existed = existing_outputs(specs)  # (before: see existing_outputs)
        try:
            with self._lock(SUBMIT_LOCK, doing="nothing was enqueued"):
                res = self._submit_locked(specs, replace=replace, max_pending=max_pending,
                                          crash_hook=crash_hook)
        except OSError as exc:
            # The API's callers (a web tier) catch RenderctlError, not whatever the file
            # system raised deep inside: the queue folder removed, read-only or full.
            raise QueueIOError(os_error_message(exc)) from exc
        if res.accepted or res.replaced:
            notes = list(res.warnings)
            self._best_effort(notes, "waking the runner", self.wake_runner)
            res = dataclasses.replace(res, warnings=tuple(notes))
        if advise and (res.accepted or res.replaced):
            res = self._advise(res, specs, existed)
        return res

    @staticmethod
    def _advise(res: SubmitResult, specs: Sequence[JobSpec], existed: set[str]) -> SubmitResult:
        """``res`` with the advice on its accepted jobs, also logged as warnings (bounded:
        ``advice.said``; ``res.advice`` has every one)."""
        import logging

        from renderctl import advice

        new = {*res.accepted, *res.replaced}
        taken = [s for s in specs if s.id in new]
        origin = dict.fromkeys(new, "<api>")
        try:
            found = (advice.past_deadlines(taken, origin)
                     + advice.unfound_programs(taken, origin)
                     + advice.outputs_in_the_way(taken, new & existed, origin))
        except Exception as exc:  # (a third-party import finder's, say: the jobs are in)
            msg = f"jobs accepted, but looking them over failed: {exc!r}"
            logging.getLogger("renderctl").warning("%s", msg)
            return dataclasses.replace(res, warnings=(*res.warnings, msg))
        for line in advice.said(found):
            logging.getLogger("renderctl").warning("%s", line)
        return dataclasses.replace(res, advice=tuple(found))

    def _placement_problems(self, specs: Sequence[JobSpec]) -> list[Problem]:
        """Where the jobs' outputs would go that no run could publish to: an output root
        that is a file (or a path through one), or outputs among the queue's own files.
        `submit` and `run` say so first, naming --out; a web tier's submit was accepted,
        and then one such job stopped every run of the queue (exit 74, at every restart),
        or had its output taken for a damaged record (audit BD)."""
        problems = []
        for root in sorted({s.out_root for s in specs}):
            what = not_a_folder(Path(root))
            if what is not None:
                problems.append(Problem("<api>", None, "out_root",
                                        f"{root} is {what}, not a folder (the output root)"))
        return problems or outputs_in_queue(specs, self.path, dict.fromkeys(
            (s.id for s in specs), "<api>"), where="<api>")

    @staticmethod
    def _best_effort(notes: list[str], step: str, fn: Callable[[], object],
                     done: str = "jobs accepted") -> None:
        """Run a best-effort step that follows a change made durable (``done``: a submit's
        jobs are in pending/ by now): its failure is noted and logged, never raised (a
        retry would say "already")."""
        try:
            fn()
        except (OSError, QueueIOError) as exc:
            msg = (f"{done}, but {step} failed: "
                   f"{os_error_message(exc) if isinstance(exc, OSError) else exc}")
            notes.append(msg)
            import logging  # lazily: only a failure needs it

            logging.getLogger("renderctl").warning("%s", msg)

    def _locate_many(self, ids: Sequence[str],
                     crash_hook: Callable[[str], None] | None = None) -> dict[str, State]:
        """Where each of ``ids`` is (a hint: the caller reads the record), under submit's
        lock, while a runner may move the jobs."""
        found: dict[str, State] = {}
        if len(ids) <= 64:
            for jid in ids:
                view = self.find(jid)
                if view is not None:
                    found[jid] = view.state
            return found
        wanted = set(ids)
        # A folder each, in the direction jobs move, so a job a runner moves during the
        # listing is still seen once: pending/ and running/ (twice: a retry moves a job
        # back), then the terminal folders, which jobs leave only under the lock we hold
        # (dead retry, replace) or by deletion. A job seen nowhere moved running -> pending
        # -> running -> pending within the four listings; a retry waits out its backoff.
        # (Terminal folders first, as before, missed a job claimed and finished during the
        # listing: accepted anew beside its done record, run twice.)
        for state in (State.PENDING, State.RUNNING, State.PENDING, State.RUNNING,
                      State.DONE, State.DEAD, State.CANCELLED, State.EXPIRED):
            for name in os.listdir(self.dir(state)):
                jid = name[:-5]
                if jid in wanted and name.endswith(".json"):
                    found.setdefault(jid, state)
            if crash_hook is not None:
                crash_hook("submit:listed")
        return found

    def _next_stamp(self) -> int:
        """A batch's acceptance stamp (its jobs' seq): the wall clock in ns, but never at or
        below the last one given (submit lock held). After a clock step back, stamps from
        the wall clock alone sorted new jobs before those accepted in the hour the clock
        repeated, which then waited behind every newcomer until it caught up.

        Kept in control/seq, rewritten in place (no file created per submit); no fsync:
        lost with a power cut, the order can invert only if the clock also stepped back."""
        stamp = time.time_ns()
        try:
            fd = os.open(self.dir("control") / SEQ_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
        except OSError:
            return stamp  # (the ordering is a nicety; the submit goes on)
        try:
            with contextlib.suppress(OSError, ValueError):
                stamp = max(stamp, int(os.pread(fd, 32, 0).strip() or 0) + 1)
            with contextlib.suppress(OSError):
                os.pwrite(fd, f"{stamp:020d}\n".encode(), 0)
        finally:
            os.close(fd)
        return stamp

    def conflicts(self, specs: Sequence[JobSpec], *, replace: bool) -> list[Problem]:
        """What a submit of ``specs`` would refuse against what the queue holds now. No
        lock and nothing written: advice for a command refused already for other problems,
        so that it lists these with the rest in one round (the submit judges again, under
        its lock)."""
        by_id = {s.id: s for s in specs}
        problems: list[Problem] = []
        for jid in self._locate_many(list(by_id)):
            view = self.find(jid)
            if view is not None and (problem := _refusal(by_id[jid], view, replace)):
                problems.append(problem)
        return problems

    def _submit_locked(
        self, specs: Sequence[JobSpec], *, replace: bool, max_pending: int | None,
        crash_hook: Callable[[str], None] | None = None,
    ) -> SubmitResult:
        if self._replay_due:
            self._replay_leftovers([s.id for s in specs])
        located = self._locate_many([s.id for s in specs], crash_hook)
        new: list[JobSpec] = []
        already: list[str] = []
        ended: dict[str, int] = {}
        replaced: list[str] = []
        problems: list[Problem] = []
        for spec in specs:
            state = located.get(spec.id)
            if state is None:
                new.append(spec)
                continue
            view = self.find(spec.id)
            if view is None:
                new.append(spec)
                continue
            if _already_here(spec, view, replace):
                already.append(spec.id)
                # (Not one a dead runner ended with its running copy still there: the run
                # that recovers it reports it, and `run MANIFEST` counted it twice, ended
                # earlier and recovered; review DG.)
                if view.state.terminal and not os.path.exists(
                        self._rpath(State.RUNNING, spec.id)):
                    ended[view.state.value] = ended.get(view.state.value, 0) + 1
            elif (problem := _refusal(spec, view, replace)) is not None:
                problems.append(problem)
            else:
                new.append(spec)
                replaced.append(spec.id)
        if problems:
            raise ManifestError(problems)
        if crash_hook is not None:
            crash_hook("submit:checked")
        # What pending/ grows by: a replaced job that is pending now only changes its spec.
        adds = sum(1 for spec in new if located.get(spec.id) is not State.PENDING)
        if not replaced:
            res = self._apply_submit(new, already, replaced, max_pending, crash_hook, adds)
            return dataclasses.replace(res, already_ended=ended)
        # A replace must not race a claim: checked "not running" above, the old copy could be
        # claimed before ours lands in pending/, and the job would then be in pending/ and
        # running/ at once, run twice. Claims skip a round while we hold this lock.
        # Bounded: a claim takes milliseconds, a runner stopped mid-claim holds it for good,
        # and every submit would wait behind ours (we hold submit's lock).
        with self._lock(REPLACE_LOCK, wait_s=CLAIM_LOCK_WAIT_S,
                        busy="nothing of this submit was enqueued"):
            for jid in replaced:
                view = self.find(jid)
                if view is not None and view.state is State.RUNNING:
                    problems.append(Problem("<queue>", jid, None,
                                            "is running; cancel it before replacing it"))
            if problems:
                raise ManifestError(problems)
            res = self._apply_submit(new, already, replaced, max_pending, crash_hook, adds)
            return dataclasses.replace(res, already_ended=ended)

    def _apply_submit(self, new: list[JobSpec], already: list[str], replaced: list[str],
                      max_pending: int | None, crash_hook: Callable[[str], None] | None,
                      adds: int) -> SubmitResult:
        if max_pending is not None and adds:
            # A submit adding nothing to pending (jobs already accepted, pending ones
            # replaced) is not refused, however far over the limit a `dead retry` or a
            # lowered limit left pending.
            pending = self.count(State.PENDING)
            if pending + adds > max_pending:
                raise Saturated(requested=adds, pending=pending, max_pending=max_pending)
        if not new:
            return SubmitResult((), tuple(already))
        now = self.clock.wall()
        stamp = f"{self._next_stamp():020d}"
        records = [
            JobRecord(spec=s, seq=f"{stamp}.{i:06d}", accepted_at=now, changed_at=now)
            for i, s in enumerate(new)
        ]
        # Each record is serialised once, for its job file and (spliced) for the journal.
        raws = [r.dumps() for r in records]
        # In parts, written one after another: joined, it was one more copy of every record
        # in memory (a batch of 1,000 jobs of ~1 MB of params each took 2.9 GB; audit CF).
        payload: list[bytes] = [
            b'{"seq":' + json.dumps(stamp).encode() + b',"replace":'
            + json.dumps(replaced, separators=(",", ":")).encode() + b',"records":[']
        for i, raw in enumerate(raws):
            payload += (b"," if i else b"", raw)
        payload.append(b"]}")
        # Before the commit point: a batch committed that cannot be placed would hold its
        # jobs accepted and unrunnable (3,000 jobs on a file system with 2,048 inodes left).
        self._check_room(len(records) + (len(records) > 1 or bool(replaced)),
                         "; nothing of this submit was enqueued")
        bell: Callable[[], object]
        if len(records) == 1 and not replaced:
            # One job is atomic by itself (tmp -> fsync -> rename -> fsync dir): skip the
            # journal and spend two fsyncs instead of four (the web tier's 200 ms budget).
            self._apply_single(records[0], raws[0], crash_hook)
            bell = functools.partial(self._ring_doorbell, stamp, records)
        else:
            journal = self._commit_txn(stamp, payload, records, set(replaced), raws,
                                       crash_hook)
            bell = functools.partial(self._retire_txn, journal, records)
        # Accepted: every job is in pending/. What follows is best effort, never a failure
        # of this call (a retry would only say "already accepted").
        notes: list[str] = []
        self._best_effort(notes, "ringing the runner's doorbell", bell)
        self._best_effort(notes, "logging to the event log", lambda: self.events.append(
            {"ts": now, "event": "accepted", "job": r.spec.id} for r in records))
        self._submitted = {r.spec.id: r.entry() for r in records}
        return SubmitResult(tuple(r.spec.id for r in records if r.spec.id not in replaced),
                            tuple(already), tuple(replaced), warnings=tuple(notes))

    def _check_room(self, files: int, then: str = "") -> None:
        """QueueIOError unless the queue's file system has an inode for each of ``files``
        new files (one per job). Only inodes: they are exact (a record fits in its inode's
        first block), and a file system that reports none (btrfs) is not judged."""
        if not files:
            return
        try:
            st = os.statvfs(self.path)
        except OSError:
            return  # the writes below will say what is wrong
        free = st.f_ffree if os.geteuid() == 0 else st.f_favail
        if st.f_files and free < files:
            raise NoRoom(
                f"{self.path}: its file system has {free} free inode(s), and this needs "
                f"{files} (a file per job): {os.strerror(errno.ENOSPC)}{then}")

    def _incomplete(self, exc: BaseException, ids: Sequence[str],
                    journal: str) -> SubmitIncomplete:
        """The error of a submit whose jobs are accepted but not all placed (see
        SubmitIncomplete): one line naming the jobs not yet in pending/ and the cause."""
        self._replay_due = True
        unplaced = tuple(j for j in ids if not self.has_record(State.PENDING, j))
        shown = ", ".join(unplaced[:5]) + (f" and {len(unplaced) - 5} more"
                                           if len(unplaced) > 5 else "")
        why = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
        if not unplaced:
            # All in pending/, the last sync failed ("but 0 not yet in pending/" read as a
            # contradiction).
            return SubmitIncomplete(
                f"{len(ids)} job(s) accepted and in pending/"
                f"{f' ({journal})' if journal.startswith('journal/') else ''}, but not known "
                f"durable: {why}; submitting them again is safe", accepted=tuple(ids),
                unplaced=unplaced)
        return SubmitIncomplete(
            f"{len(ids)} job(s) accepted ({journal}), but {len(unplaced)} not yet in pending/"
            f"{': ' + shown if shown else ''}; {why}; the next submit or open of the queue "
            "places them, and submitting them again is safe", accepted=tuple(ids),
            unplaced=unplaced)

    def _apply_single(self, rec: JobRecord, raw: bytes,
                      crash_hook: Callable[[str], None] | None = None) -> None:
        tmp = self._tmp_name("job")
        write_file(tmp, raw, fsync=True)
        try:
            os.rename(tmp, self.record_path(State.PENDING, rec.spec.id))
        except OSError:
            unlink_quiet(tmp)
            raise
        # The job is accepted from here: a runner may claim it at once.
        try:
            # Protects against: power loss losing the rename after we report "accepted".
            self._fsync_pending()
        except QueueIOError as exc:
            raise self._incomplete(exc, [rec.spec.id], "in pending/, not known durable"
                                   ) from exc
        if crash_hook is not None:
            crash_hook("submit:before_doorbell")

    def _ring_doorbell(self, stamp: str, records: Sequence[JobRecord]) -> None:
        """Tell a runner which jobs are new in pending/: what it orders them by, not the
        whole records (which are in pending/, where it claims them from). The whole batch,
        kept as the doorbell until a runner came, doubled the queue's size on disk (a
        batch of 950 MB held 1.9 GB; audit CF)."""
        # No fsync: a lost doorbell (or one never rung: the submit was killed before it)
        # only delays a running runner until its next rescan of pending/ (Runner._rescan).
        # (Tuples by hand: dataclasses.astuple took 0.32 s for 50,000; review CJ.)
        entries = [(e.seq, e.job_id, e.priority, e.group, e.accepted_at, e.not_before,
                    e.deadline) for e in map(JobRecord.entry, records)]
        payload = json.dumps({"entries": entries}, separators=(",", ":")).encode()
        tmp = self._tmp_name("bell")
        write_file(tmp, payload, fsync=False)
        try:
            os.replace(tmp, self.dir("journal") / f"{stamp}.new")
        except OSError:
            unlink_quiet(tmp)
            raise

    def _commit_txn(self, stamp: str, payload: Sequence[bytes], records: Sequence[JobRecord],
                    replaced: set[str], raws: Sequence[bytes] | None = None,
                    crash_hook: Callable[[str], None] | None = None) -> Path:
        """Commit a batch (its journal entry) and place it in pending/; returns the entry,
        for the caller to retire (``_retire_txn``: the runner's doorbell)."""
        journal = self.dir("journal") / f"{stamp}.txn"
        tmp = self._tmp_name("txn")
        write_file(tmp, payload, fsync=True)
        try:
            os.rename(tmp, journal)
        except OSError:
            unlink_quiet(tmp)
            raise
        try:
            # Protects against: power loss right after we report "accepted": without this
            # the journal entry (our commit point) could vanish, and with it the whole batch.
            fsync_dir(journal.parent)
        except QueueIOError:
            # Not known committed: take it back, so that what we report ("nothing was
            # enqueued") holds (a replay would otherwise place it later).
            unlink_quiet(journal)
            raise
        # Committed: the jobs are accepted, whatever fails below.
        try:
            self._apply_txn(journal, records, replaced=replaced, raws=raws,
                            crash_hook=crash_hook, retire=False)
        except (OSError, QueueIOError) as exc:
            raise self._incomplete(exc, [r.spec.id for r in records],
                                   f"journal/{journal.name}") from exc
        return journal

    def _durable_temporaries(self, purpose: str, blobs: Sequence[bytes]) -> list[Path]:
        """Each of ``blobs`` in a new temporary under tmp/, on disk before the caller points
        a name at it: a fsync each for up to SMALL_BATCH of them, else one syncfs for all.
        Protects against: power loss after the caller's renames exposing empty records (the
        data must reach the disk before a name does). If a write fails (a full disk), those
        already written are removed: they would hold its space until this process exits."""
        small = len(blobs) <= SMALL_BATCH
        tmps: list[Path] = []
        try:
            for data in blobs:
                tmps.append(self._tmp_name(purpose))
                write_file(tmps[-1], data, fsync=small)
            if not small:
                syncfs(self.path)
        except BaseException:
            for tmp in tmps:
                unlink_quiet(tmp)
            raise
        return tmps

    def _retire_txn(self, journal: Path, records: Sequence[JobRecord]) -> None:
        """A placed batch's journal entry gives way to the runner's doorbell: "these jobs
        are new in pending/". No fsync: if the removal is lost, the next open replays the
        .txn, which is idempotent (and rings again: a runner indexes a job once)."""
        try:
            self._ring_doorbell(journal.stem, records)
        except OSError:
            # No room for the small doorbell (a disk full to its last inode, a batch that
            # filled it): the entry itself becomes it, as before (a rename needs none).
            # Left, the .txn was replayed, and its jobs said "not yet in pending/", at every
            # open (review CJ).
            os.replace(journal, journal.with_suffix(".new"))
            return
        unlink_quiet(journal)

    def _apply_txn(self, journal: Path, records: Sequence[JobRecord], *,
                   replaced: set[str], replay: bool = False,
                   raws: Sequence[bytes] | None = None,
                   crash_hook: Callable[[str], None] | None = None,
                   retire: bool = True) -> None:
        """Roll a committed batch forward into pending/ (idempotent: replays are safe).

        The caller holds the replace lock if ``replaced`` (no claim runs meanwhile)."""
        staged: list[tuple[Path, Path]] = []
        try:
            self._place_txn(records, staged, replaced=replaced, replay=replay, raws=raws,
                            crash_hook=crash_hook)
        except (OSError, QueueIOError):
            # A full disk: the temporaries not placed would hold its space until this
            # process exits (a web tier's lives for days). The journal entry keeps them.
            for tmp, _ in staged:
                unlink_quiet(tmp)
            raise
        if retire:
            self._retire_txn(journal, records)

    def _place_txn(self, records: Sequence[JobRecord], staged: list[tuple[Path, Path]], *,
                   replaced: set[str], replay: bool, raws: Sequence[bytes] | None,
                   crash_hook: Callable[[str], None] | None) -> None:
        placing: list[tuple[bytes, Path]] = []
        for i, rec in enumerate(records):
            jid = rec.spec.id
            if replay:
                # Every copy, not just the one find() prefers: a replace cut short after
                # placing ours leaves the old finished copy beside it (see below).
                copies = self._copies(jid)
                if any(c.record.seq == rec.seq for c in copies):
                    continue  # applied already (and perhaps claimed or finished since)
                if any(c.state is State.RUNNING for c in copies):
                    # The copy it was to replace is running (or a power cut brought back a
                    # running copy whose removal never reached the disk): placing ours would
                    # make two copies. Not replaced, then: its finished copy must stay too
                    # (dropped below, the stale running copy was all that was left, and
                    # recovery ran the old job again: a cancelled job, say).
                    replaced = replaced - {jid}
                    continue
                if any(c.state is not State.PENDING for c in copies) and jid not in replaced:
                    continue  # finished after an earlier roll-forward
            placing.append((raws[i] if raws is not None else rec.dumps(),
                            self.record_path(State.PENDING, jid)))
        # Said at once, instead of writing and removing a file per job in vain (at every
        # command, for a replay).
        self._check_room(len(placing))
        tmps = self._durable_temporaries("job", [data for data, _ in placing])
        staged.extend(zip(tmps, (dst for _, dst in placing), strict=True))
        if crash_hook is not None:
            crash_hook("submit:staged")
        for tmp, dst in staged:
            os.replace(tmp, dst)
        if staged:
            # Protects against: power loss losing the renames into pending/ after the
            # journal entry is retired below.
            self._fsync_pending()
        if crash_hook is not None:
            crash_hook("submit:placed")
        if replaced:
            # Only now, with the new copies in place, drop the finished ones they replace:
            # a `cancel` or `show` in between then finds the job somewhere (a crash in
            # between leaves two copies, and the replay of this journal entry drops the old).
            seqs = {r.spec.id: r.seq for r in records}
            touched = {c.state for jid in replaced for c in self._copies(jid)
                       if c.state.terminal and c.record.seq != seqs.get(jid)
                       and unlink_quiet(c.path)}
            for state in touched:
                # Protects against: power loss after the journal entry is retired bringing
                # an old copy back beside the new one (the job in two folders).
                fsync_dir(self.dir(state))
            for jid in replaced:
                # A cancel asked of the old job (left by a runner that stopped before acting
                # on it) is not a cancel of the new one.
                self.clear_cancel_request(jid)

    def _roll_forward_journals(self, names: Sequence[str], *, wait: bool) -> None:
        if not any(n.endswith(".txn") for n in names):
            self.clean_tmp()
            return
        try:
            # Bounded: a submit places its own batch meanwhile, and a runner stopped
            # mid-claim (Ctrl-Z) would hold every command at its open (status included).
            wait_s = None if wait else OPEN_REPLAY_WAIT_S
            doing = "no job was run"  # (only a runner waits: wait_s None)
            with self._lock(SUBMIT_LOCK, wait_s=wait_s, doing=doing):
                self._replay_journals(wait_s=wait_s, doing=doing)
            self._replay_due = False
        except BlockingIOError:
            self._replay_due = True  # a submit through this object tries again first
        self.clean_tmp()

    def _replay_leftovers(self, ids: Sequence[str]) -> None:
        """Place what an earlier submit of this object committed and could not place (the
        submit lock held). If that fails again, so does this submit, saying which of its
        ``ids`` were accepted before."""
        try:
            self._replay_journals(wait_s=CLAIM_LOCK_WAIT_S)
        except BlockingIOError:
            raise self._claims_held("nothing of this submit was enqueued") from None
        except (OSError, QueueIOError) as exc:
            pending = self._journal_ids()
            ours = [j for j in ids if j in pending]
            if ours:
                raise self._incomplete(exc, ours, "by an earlier submit") from exc
            why = os_error_message(exc) if isinstance(exc, OSError) else str(exc)
            raise QueueIOError(f"jobs accepted by an earlier submit could not be placed in "
                               f"pending/: {why}; nothing of this submit was enqueued"
                               ) from exc
        self._replay_due = False
        self.unplaced = None

    def _place_orphaned_batches(self) -> None:
        """Place committed batches that no submit is placing: its writer killed after the
        commit point, or failed (SubmitIncomplete). Every open does this; a `--follow`
        runner calls it at each poll, or such jobs (accepted) would wait for some command
        to open the queue. Never blocks: a submit holding the lock places its own."""
        try:
            if not any(n.endswith(".txn") for n in os.listdir(self.dir("journal"))):
                return
        except FileNotFoundError:
            return
        try:
            with self._lock(SUBMIT_LOCK, blocking=False):
                # One try (wait_s=0): this is the runner's loop, which must not sit out a
                # held lock (a cancel taking jobs); the next poll tries again.
                self._replay_journals(wait_s=0)
        except BlockingIOError:
            return  # a submit in progress, or a cancel holding the replace lock
        except (OSError, QueueIOError):
            return  # the disk is still full, say: the entry stays for the next poll

    def _replay_journals(self, *, wait_s: float | None = None,
                         doing: str = "nothing was done") -> None:
        """Roll every committed journal entry forward (the submit lock held); BlockingIOError
        if a claim holds the replace lock for ``wait_s`` (None: as lockwait waits)."""
        with self._lock(REPLACE_LOCK, wait_s=wait_s, doing=doing):
            for name in sorted(os.listdir(self.dir("journal"))):
                if not name.endswith(".txn"):
                    continue
                path = self.dir("journal") / name
                try:
                    txn = json.loads(path.read_bytes())
                    records = [JobRecord.loads(json.dumps(r).encode()) for r in txn["records"]]
                except FileNotFoundError:
                    continue
                except _CORRUPT as exc:
                    if _stale_name(path):
                        continue
                    self.quarantine(path, f"unreadable journal entry: {exc}")
                    continue
                self._apply_txn(path, records, replaced=set(txn.get("replace", ())),
                                 replay=True)
                self.events.append({"ts": self.clock.wall(), "event": "accepted",
                                    "job": r.spec.id, "recovered": True} for r in records)

    def clean_tmp(self) -> int:
        """Remove renderctl's own temporaries whose writer (named by the pid prefix) is no
        longer alive; returns how many. A name tagged by another host boot or pid namespace
        (see _owner_tag: a submitter in a container sharing the queue) has a pid that means
        nothing here: such a temporary is removed once older than TMP_GRACE_S, never while
        it may be in flight.

        Only files named as renderctl names them (``_OWN_TMP``): any command, `status`
        included, runs this on open, and whatever else is in tmp/ (a person's notes, a
        folder) is not ours to delete. The spare record files (``free.*``, see recycle) are
        kept for the next runner to adopt."""
        with os.scandir(self.dir("tmp")) as it:
            # d_type from the listing: no stat per name; symlinks and folders are never ours.
            doomed = [(e.path, int(m[1]), m[2]) for e in it
                      if (m := _OWN_TMP.fullmatch(e.name)) and e.is_file(follow_symlinks=False)]
        if not doomed:
            return 0  # the usual case: no psutil import on a read-only open (`status`)
        from renderctl.proctree import pid_alive

        removed = 0
        ours = _owner_tag()
        for path, pid, tag in doomed:
            if tag is not None and tag != ours:
                try:
                    old = time.time() - os.stat(path).st_mtime > TMP_GRACE_S
                except FileNotFoundError:
                    continue
                if old:
                    removed += unlink_quiet(path)
            elif not pid_alive(pid):
                removed += unlink_quiet(path)
        return removed

    # -- the runner's side --
    def take_doorbells(self) -> list[Path]:
        """Journal entries whose jobs are in pending/ but not yet in the runner's index."""
        return [self.dir("journal") / n for n in sorted(os.listdir(self.dir("journal")))
                if n.endswith(".new")]

    def load_index(self, index: ClaimIndex) -> int:
        """Fill ``index`` from pending/ (the full scan at runner start); returns its size."""
        bells = self.take_doorbells()  # listed first: anything they name is in the scan
        now = self.clock.wall()
        submitted, self._submitted = self._submitted, {}
        doubled: list[str] = []
        names = os.listdir(self.dir(State.PENDING))
        with self._finished_probe(len(names) - len(submitted)) as finished_too:
            for name in names:
                if not name.endswith(".json"):
                    continue
                entry = submitted.get(name[:-5])
                if entry is not None:
                    # Ours: submit looked in every folder first, so it has no finished twin.
                    index.add(entry, now=now)
                    continue
                if finished_too(name):
                    doubled.append(name[:-5])
                    continue
                rec = self._read_or_quarantine(self.dir(State.PENDING) / name)
                if rec is None:
                    continue
                index.add(rec.entry(), now=now)  # the index orders by seq, not this listing
        for rec in self._settle_copies(doubled):
            index.add(rec.entry(), now=now)
        for b in bells:
            unlink_quiet(b)
        return len(index)

    @contextlib.contextmanager
    def _finished_probe(self, probes: int = 0) -> Iterator[Callable[[str], bool]]:
        """A test of whether a terminal folder also holds record file ``name``: four
        access(2) probes, relative to the folders' descriptors (opened at the first test);
        or, when ``probes`` (how many tests are coming) would cost more than listing those
        folders, one look in a listing of them taken now.

        Paid at runner start and on rescans, for pending records read then anyway; never
        per claim. Probing by name keeps the cost to the pending jobs (done/ grows with
        every job until it is pruned): ~5 us a miss, four a test, against ~0.5 us a name
        listed. A runner starting behind 20,000 pending jobs probed 80,000 times (~0.3 s of
        its ~1.8 s before the first claim). A name the listing misses cannot matter: no
        operation makes a finished copy of a job while a pending one exists, and a pair
        found is judged again, under submit's lock (_settle_copies)."""
        if probes > 0 and self._finished_names_bound() < LIST_OVER_PROBE * probes:
            listed = {n for s in _FINISHED for n in os.listdir(self.dir(s))}
            yield listed.__contains__
            return
        fds: list[int] = []

        def finished_too(name: str) -> bool:
            if not fds:
                fds.extend(os.open(self.dir(s), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                           for s in _FINISHED)
            return any(os.access(name, os.F_OK, dir_fd=fd) for fd in fds)

        try:
            yield finished_too
        finally:
            for fd in fds:
                os.close(fd)

    def _finished_names_bound(self) -> int:
        """About how many names the terminal folders hold, from their sizes (no listing),
        on the high side: ext4 keeps a record's name in ~34 bytes of its folder (names of
        ~20 characters), counted here as 24; a folder never shrinks, so after deletions
        this says more. Too high only means probing where a listing was cheaper."""
        return sum(os.stat(self.dir(s)).st_size for s in _FINISHED) // 24

    def _settle_copies(self, job_ids: Sequence[str]) -> list[JobRecord]:
        """Leave each job of ``job_ids`` (found in pending/ and in a terminal folder) in one
        folder; returns the pending records that stay, to be indexed.

        No renderctl operation leaves a job pending and finished at once, but for a `dead
        retry` cut by a power loss between its two directory syncs (the rename kept on both
        sides, see dead_retry): the retry was asked for, so the pending copy stays and the
        dead one goes (it holds nothing the pending one lacks). A cancel of a pending job
        cut the same way leaves the record it cancelled in pending/: that copy goes. Any
        other pair is a copy made by hand (`cp done/x.json pending/`): running it again
        would publish twice or file the job in two folders, so the finished record stays and
        the pending copy is quarantined into corrupt/ and reported, never deleted."""
        won: list[JobRecord] = []
        if not job_ids:
            return won
        # Submit's lock: a replace places its pending copy before it drops the finished one
        # it replaces, and a dead retry moves dead -> pending; neither is a pair to settle,
        # and neither runs while we hold it.
        with self._lock(SUBMIT_LOCK, doing="no job was run"):
            for jid in job_ids:
                path = self.record_path(State.PENDING, jid)
                rec, inode = self._read_or_quarantine_inode(path)
                if rec is None:
                    continue  # gone since listed (cancelled), or quarantined as unreadable
                finished = [v for state in _FINISHED
                            if (v := self._view(state, jid)) is not None]
                if not finished:
                    won.append(rec)  # its twin was pruned (or unreadable, now quarantined)
                    continue
                first = finished[0]
                if len(finished) == 1 and first.state is State.DEAD \
                        and first.record.reason == RETRIED_REASON \
                        and (first.record.seq, first.record.attempt_base) \
                        == (rec.seq, rec.attempt_base):
                    unlink_quiet(first.path)
                    # Protects against: power loss bringing the dead copy back after the
                    # retried job has moved on (done, say): then it would be in two folders.
                    fsync_dir(self.dir(State.DEAD))
                    self.events.append([{"ts": self.clock.wall(), "event": "revived",
                                         "job": jid, "recovered": True}])
                    won.append(rec)
                    continue
                if len(finished) == 1 and first.state is State.CANCELLED \
                        and first.record.reason == CANCELLED_PENDING_REASON \
                        and (first.record.seq, first.record.attempts) \
                        == (rec.seq, rec.attempts):
                    # A cancel of this very record, cut by a power loss between its fsyncs of
                    # cancelled/ and pending/ (see cancel_pending): the cancel stands, and
                    # the copy it moved is no damage to report.
                    unlink_quiet(path)
                    self._fsync_pending()
                    continue
                kept = first.state.value
                hint = f"; `renderctl dead retry {jid}` runs it again" if kept == "dead" else ""
                self.quarantine(path, f"a second copy of job {jid!r}, which is {kept} "
                                f"({kept}/{jid}.json is kept; not run again){hint}",
                                inode=inode)
        return won

    def _view(self, state: State, job_id: str) -> JobView | None:
        p = self.record_path(state, job_id)
        rec = self._read_or_quarantine(p)
        return None if rec is None else JobView(state, rec, p)

    def pending_mtime_ns(self) -> int:
        """When a name last came into or left pending/ (for a cheap "anything new?")."""
        return os.stat(self.dir(State.PENDING)).st_mtime_ns

    def index_unknown_pending(self, index: ClaimIndex) -> int:
        """Add the jobs in pending/ that ``index`` does not know (whose doorbell was never
        rung); returns how many. Reads only their records: the others cost a name each."""
        now = self.clock.wall()
        added = 0
        doubled: list[str] = []
        with self._finished_probe() as finished_too:
            for name in os.listdir(self.dir(State.PENDING)):
                if not name.endswith(".json") or name[:-5] in index:
                    continue
                if finished_too(name):
                    doubled.append(name[:-5])  # copied in by hand while we run: see above
                    continue
                rec = self._read_or_quarantine(self.dir(State.PENDING) / name)
                if rec is not None:
                    index.add(rec.entry(), now=now)
                    added += 1
        for rec in self._settle_copies(doubled):
            index.add(rec.entry(), now=now)
            added += 1
        return added

    def poll_new(self, index: ClaimIndex) -> int:
        """Add jobs submitted since the last look (doorbells), cheaply: no pending/ scan."""
        added = 0
        now = self.clock.wall()
        self._place_orphaned_batches()
        damaged = False
        for bell in self.take_doorbells():
            try:
                txn = json.loads(bell.read_bytes())
                if "entries" in txn:
                    entries = [_doorbell_entry(e) for e in txn["entries"]]
                else:  # (a batch's whole journal entry, as an earlier version rang)
                    entries = [JobRecord.loads(json.dumps(r).encode()).entry()
                               for r in txn["records"]]
            except FileNotFoundError:
                continue
            except _CORRUPT:
                # Torn by a power cut (doorbells are not fsynced), or not ours: the jobs it
                # names are in pending/ all the same.
                damaged = True
                unlink_quiet(bell)
                continue
            for entry in entries:
                index.add(entry, now=now)
                added += 1
            unlink_quiet(bell)
        for bell in sorted(self.dir("journal").glob("*.revive")):
            try:
                ids = json.loads(bell.read_bytes())
                views = [self.find(jid) for jid in ids if isinstance(jid, str)]
            except FileNotFoundError:
                continue
            except _CORRUPT:
                damaged = True
                unlink_quiet(bell)
                continue
            for view in views:
                if view is not None and view.state is State.PENDING:
                    index.add(view.record.entry(), now=now)
                    added += 1
            unlink_quiet(bell)
        if damaged:
            # Rather than leave what it named to the next full rescan (up to RESCAN_FULL_S).
            added += self.index_unknown_pending(index)
        return added

    def claim(
        self, index: ClaimIndex, *, holder: Holder, lease_s: float, limit: int,
        token_prefix: str, crash_hook: Callable[[str], None] | None = None,
    ) -> tuple[list[Claim], list[JobRecord]]:
        """Claim up to ``limit`` jobs in policy order; returns (claims, expired records).

        Claims nothing while a replace is being applied (see _submit_locked): the runner's
        loop comes back when the submit wakes it, and a replace takes milliseconds."""
        with self._no_replace() as free:
            if not free:
                # Said after a second: a replace stopped by Ctrl-Z held the runner's claims
                # off for good, with nothing said.
                assert self._replace_fd is not None  # (opened by _no_replace)
                self._replace_held.held(self._replace_fd, self.on_lock_wait)
                return [], []
            self._replace_held.free()
            return self._claim_unlocked(index, holder=holder, lease_s=lease_s, limit=limit,
                                        token_prefix=token_prefix, crash_hook=crash_hook)

    @contextlib.contextmanager
    def _no_replace(self) -> Iterator[bool]:
        """Hold off replaces while pending/ records are taken (True), or yield False if a
        replace is being applied now."""
        if self._replace_fd is None:
            self._replace_fd = open_lock_file(self.path / REPLACE_LOCK)
        try:
            fcntl.flock(self._replace_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        self._replace_holds += 1
        try:
            yield True
        finally:
            self._replace_holds -= 1
            fcntl.flock(self._replace_fd, fcntl.LOCK_UN)

    def _claim_unlocked(
        self, index: ClaimIndex, *, holder: Holder, lease_s: float, limit: int,
        token_prefix: str, crash_hook: Callable[[str], None] | None = None,
    ) -> tuple[list[Claim], list[JobRecord]]:
        now = self.clock.wall()
        claims: list[Claim] = []
        expired: list[Transition] = []
        while len(claims) < limit:
            entry = index.pop(now=now)
            if entry is None:
                break
            dst = self._rpath(State.RUNNING, entry.job_id)
            rec = self._take_pending(entry, index, now)
            if rec is None:
                continue
            if self._expiring(rec, now, expired, crash_hook):
                continue
            if crash_hook is not None:
                crash_hook("claim")
            attempt = len(rec.attempts) + 1
            # Milliseconds: what the compact xattr keeps (see _write_lease).
            claimed_at = round(now, 3)
            lease = Lease(holder, make_token(token_prefix, rec.spec.id, attempt, claimed_at),
                          attempt, claimed_at, round(now + lease_s, 3))
            rec = replace(rec, lease=lease)
            self._write_lease(dst, rec)
            claims.append(Claim(rec))
        # No sync here: the caller's next group commit makes claims durable together with
        # the batch it commits. A power loss before that returns the job to pending with
        # this attempt uncounted (the job is never lost: whoever syncs pending/ meanwhile
        # syncs running/ first, see _fsync_pending).
        if claims:
            self.events.append({"ts": now, "event": "claimed", "job": c.job_id,
                                "attempt": c.lease.attempt} for c in claims)
        if expired:
            self.finish(expired)
        return claims, [t.record for t in expired]

    def expire_past_deadline(self, index: ClaimIndex, *,
                             crash_hook: Callable[[str], None] | None = None,
                             ) -> list[JobRecord]:
        """Expire the pending jobs whose deadline has passed, without waiting for a claim.

        A job behind a long queue, or waiting while every worker is busy, was expired only
        when a claim reached it: `status` and `wait` showed it pending for as long."""
        now = self.clock.wall()
        expired: list[Transition] = []
        with self._no_replace() as free:
            if not free:
                return []  # the submit applying it wakes the runner when done
            for entry in index.pop_past_deadline(now=now):
                rec = self._take_pending(entry, index, now)
                if rec is not None and not self._expiring(rec, now, expired, crash_hook):
                    # It has had an attempt after all (the index was older than its record):
                    # back where it was, as a claim that is not taken would leave it.
                    os.rename(self._rpath(State.RUNNING, entry.job_id),
                              self._rpath(State.PENDING, entry.job_id))
                    index.add(rec.entry(), now=now)
            if expired:
                self.finish(expired)
        return [t.record for t in expired]

    def _take_pending(self, entry: Entry, index: ClaimIndex, now: float) -> JobRecord | None:
        """Move an indexed pending job to running/ (the claim's atomic step); its record, or
        None if it is not there to take as indexed (then it is reindexed if it should be)."""
        src = self._rpath(State.PENDING, entry.job_id)
        try:
            raw = read_file(src)
            rec = JobRecord.loads(raw)
        except FileNotFoundError:
            return None  # cancelled (or claimed by a previous life) since it was indexed
        except (IsADirectoryError, *_CORRUPT) as exc:  # (a FIFO reads as b"": see read_file)
            self.quarantine(Path(src), f"unparseable: {exc}")
            return None
        if rec.seq != entry.seq or (rec.not_before > now and rec.not_before != entry.not_before):
            # Replaced or re-delayed: reindex as it is. (A due time the index capped is
            # the record as indexed, taken on the index's word.)
            index.add(rec.entry(), now=now)
            return None
        try:
            # The atomic step: whoever renames pending/x first (we, or a cancel) wins.
            # An expiring job takes it too: writing expired/x over a pending/x that a
            # cancel may be renaming away at the same moment would leave it in two
            # folders. (If we die before finishing it, recovery finds it in running/
            # with no lease, returns it to pending, and the next claim expires it.)
            os.rename(src, self._rpath(State.RUNNING, entry.job_id))
        except FileNotFoundError:
            return None
        return rec

    @staticmethod
    def _expiring(rec: JobRecord, now: float, expired: list[Transition],
                  crash_hook: Callable[[str], None] | None) -> bool:
        """Whether a job just taken into running/ is past its deadline (then it joins
        ``expired``, to be finished as expired, never run)."""
        if rec.spec.deadline is None or rec.spec.deadline >= now or rec.attempts:
            return False
        expired.append(Transition(replace(rec, reason=EXPIRED_REASON, changed_at=now),
                                  State.EXPIRED, State.RUNNING, unrun=True))
        if crash_hook is not None:
            crash_hook("claim:expiring")
        return True

    def _write_lease(self, path: str | Path, rec: JobRecord) -> None:
        """Set a running record's lease: an xattr, compact when its holder is on file.

        Compact is "<token prefix> <attempt> <claimed_at> <expires_at>" (about 50 bytes),
        with the holder recorded once per runner in control/holder.<prefix>.json. That fits
        inside an ext4 inode (in-inode xattr space is ~56 bytes here); the ~210-byte JSON
        form needed an xattr block of its own, allocated per claim and freed per job, and
        with this file system (no journal, mounted with discard) a freed block costs ~100 us
        of synchronous discard on the runner's thread."""
        lease = rec.lease
        assert lease is not None
        prefix = lease.token_prefix(rec.spec.id)
        if prefix and not any(c.isspace() for c in prefix):
            self._ensure_holder(prefix, lease.holder)
            data = (f"{prefix} {lease.attempt} {lease.claimed_at:.3f} "
                    f"{lease.expires_at:.3f}").encode()
        else:
            data = json.dumps(lease.to_json(), separators=(",", ":")).encode()
        if self._xattrs:
            try:
                os.setxattr(path, LEASE_XATTR, data)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
                    raise
                self._xattrs = False  # this file system has no user xattrs: inline leases
        tmp = self._tmp_name("lease")
        write_file(tmp, rec.dumps(), fsync=True)
        os.replace(tmp, path)

    def _ensure_holder(self, prefix: str, holder: Holder) -> None:
        if _HOLDERS.get((str(self.dir("control")), prefix)) == holder:
            return
        # Durable before any lease names it: a lease whose holder is unknown is judged only
        # by its expiry, which would delay recovery after a crash.
        atomic_write(self.dir("control") / HOLDER_FILE.format(prefix),
                     json.dumps(holder.to_json()).encode(), tmp_dir=self.dir("tmp"))
        _HOLDERS[(str(self.dir("control")), prefix)] = holder

    def lease_prefixes(self) -> set[str]:
        """Token prefixes of the leases on running records (whose holder files must stay)."""
        out: set[str] = set()
        for jid in self.list_ids(State.RUNNING):
            lease = read_lease(self.record_path(State.RUNNING, jid))
            if lease is not None:
                out.add(lease.token_prefix(jid))
        return out

    def forget_holder(self, prefix: str) -> None:
        """Remove one holder file (a runner leaving with no lease left naming it)."""
        _HOLDERS.pop((str(self.dir("control")), prefix), None)
        unlink_quiet(self.dir("control") / HOLDER_FILE.format(prefix))

    def forget_holders(self, keep: set[str]) -> None:
        """Remove holder files no running record names any more (the runner, after recovery)."""
        for name in os.listdir(self.dir("control")):
            prefix = name_prefix(name, HOLDER_FILE)
            if prefix is not None and prefix not in keep:
                _HOLDERS.pop((str(self.dir("control")), prefix), None)
                unlink_quiet(self.dir("control") / name)

    def renew(self, claims: Iterable[Claim], *, lease_s: float) -> list[Claim]:
        """Extend leases still ours; returns the renewed claims."""
        now = self.clock.wall()
        out: list[Claim] = []
        for c in claims:
            if not self.holds(c):
                continue  # fenced: someone else owns it now
            rec = replace(c.record, lease=replace(c.lease, expires_at=round(now + lease_s, 3)))
            path = self.record_path(State.RUNNING, c.job_id)
            if self._xattrs:
                self._write_lease(path, rec)
            else:
                current = self._read_or_quarantine(path)
                if current is None:
                    continue
                self._write_lease(path, replace(current, lease=rec.lease))
            out.append(Claim(rec))
        return out

    @property
    def leases_in_xattrs(self) -> bool:
        """Whether leases are set as xattrs here (else inline in the running record)."""
        return self._xattrs

    def holds(self, claim: Claim) -> bool:
        """Fencing: is ``claim``'s lease still the one on disk? False when another's is, or
        the job has left running/ (settled by whoever took it over). A lease that cannot be
        read is the queue's I/O error (QueueIOError), not a takeover: read as one, a failed
        attempt was dropped and its job left in running/ under our own lease (review CM)."""
        lease = self.lease_on_disk(claim.job_id)
        return lease is not None and lease.token == claim.lease.token

    def lease_on_disk(self, job_id: str) -> Lease | None:
        """The lease of ``job_id``'s running record as it is on disk now (None: no running
        record, or none set); QueueIOError if it cannot be read."""
        path = self._rpath(State.RUNNING, job_id)
        try:
            raw: bytes | None = os.getxattr(path, LEASE_XATTR)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise QueueIOError(os_error_message(exc)) from exc
            raw = None
        if raw is not None:
            return _parse_lease(path, raw)
        if self._xattrs:
            return None
        try:
            return self.read_record(Path(path)).lease
        except FileNotFoundError:
            return None
        except _CORRUPT:
            return None
        except OSError as exc:
            raise QueueIOError(os_error_message(exc)) from exc

    def finish(self, transitions: Sequence[Transition], *,
               crash_hook: Callable[[str], None] | None = None,
               held: Callable[[Transition], bool] | None = None,
               logged_after: str | None = None) -> list[Transition]:
        """Move a batch of jobs to their next folders with two syncs for the whole batch.

        ``held``: asked of each transition after the first sync, right before its record is
        placed; one it answers False for (its lease taken over by another runner while
        this one was stopped, in the sync or before) is dropped and returned.
        ``logged_after`` (what was done: "jobs cancelled"): the event log's failure, once
        the batch is durable, is said rather than raised (a command's, not a runner's,
        which stops on it)."""
        if not transitions:
            return []
        staged = self.stage(transitions)
        # Protects against: power loss after the renames below exposing empty records.
        syncfs(self.path)
        dropped: list[Transition] = []
        if held is not None:
            keep = []
            try:
                for tmp, t in staged:
                    if held(t):
                        keep.append((tmp, t))
                    else:
                        unlink_quiet(tmp)
                        dropped.append(t)
            except BaseException:
                for tmp, _ in staged:  # (not left in tmp/ for the next command to sweep)
                    unlink_quiet(tmp)
                raise
            staged = keep
        self.place(staged)
        # Protects against: power loss forgetting a record after we report it (and after
        # the running copy is unlinked below, which would lose the job entirely).
        syncfs(self.path)
        if crash_hook is not None:
            crash_hook("finish:before_unlink")
        self.retire(staged, logged_after=logged_after)
        return dropped

    def stage(self, transitions: Sequence[Transition]) -> list[tuple[str, Transition]]:
        """Phase 1 of finish: write each new record under tmp/ (the caller syncs next)."""
        staged: list[tuple[str, Transition]] = []
        for t in transitions:
            check_transition(t.src, t.dst)
            staged.append((self._record_tmp(t.record.dumps()), t))
        return staged

    def place(self, staged: Sequence[tuple[str, Transition]]) -> None:
        """Phase 2: rename each staged record into its folder (the caller syncs next)."""
        for tmp, t in staged:
            os.replace(tmp, self._rpath(t.dst, t.record.spec.id))

    def retire(self, staged: Sequence[tuple[str, Transition]], *,
               logged_after: str | None = None) -> None:
        """Phase 3, after the sync: drop the old copies and log the events (see finish)."""
        for _, t in staged:
            if t.src is not t.dst:
                # No fsync: if this is lost, recovery sees two copies; the later wins.
                self.recycle(self._rpath(t.src, t.record.spec.id))
        now = self.clock.wall()

        def log() -> None:
            self.events.append({"ts": now, **t.event} for _, t in staged)

        if logged_after is None:
            log()
        else:
            self._best_effort([], "logging to the event log", log, done=logged_after)

    # -- cancel, dead-letter management --
    def cancel_pending(self, job_id: str) -> bool:
        """Cancel a pending job atomically; False if it is not pending (any more)."""
        taken = self.take_pending(job_id)
        if taken is None:
            return False
        self.settle_cancelled([taken])
        return True

    def note_cancels(self, job_ids: Sequence[str]) -> Path:
        """Name the jobs a cancel is about to take (journal/<pid>.<n>.cancel), for the next
        open to settle if the cancel dies first. Not fsynced: what a power loss forgets of
        it, it forgets of the takes too (neither is synced before settle_cancelled)."""
        path = self.dir("journal") / f"{self._tmp_name('cancel').name}"
        write_file(path, json.dumps(list(job_ids)).encode(), fsync=False)
        return path

    @staticmethod
    def forget_cancels(intent: Path) -> None:
        unlink_quiet(intent)

    def _settle_interrupted_cancels(self, names: Sequence[str]) -> None:
        """Settle what a cancel killed mid-way took from pending/ and never settled (its
        record in cancelled/ still has its pending reason): the cancel happened (the rename
        is the cancel), but no reason, event or sync said so, and `prune` could delete it
        as if it were an old record. Intents of a live cancel are left alone."""
        from renderctl.proctree import pid_alive

        ours = _owner_tag()
        for name in names:
            m = _OWN_TMP.fullmatch(name)
            path = self.dir("journal") / name
            if m is None or (m[2] is not None and m[2] != ours) or pid_alive(int(m[1])):
                continue  # (another pid namespace's: left to its own cancel)
            with self._lock(SUBMIT_LOCK, wait_s=OPEN_REPLAY_WAIT_S):
                try:
                    ids = json.loads(path.read_bytes())
                except FileNotFoundError:
                    continue  # settled by another open meanwhile
                except ValueError:
                    ids = []  # cut short while written: nothing was taken after it yet
                taken: list[TakenPending] = []
                for jid in ids if isinstance(ids, list) else []:
                    if not isinstance(jid, str) or not is_job_id(jid):
                        continue
                    rec_path = self.record_path(State.CANCELLED, jid)
                    rec, inode = self._read_or_quarantine_inode(rec_path)
                    if rec is None or inode is None or rec.reason.startswith("cancelled"):
                        continue  # not taken, settled, or cancelled some other way
                    taken.append(TakenPending(jid, inode))
                self.settle_cancelled(taken)
                unlink_quiet(path)

    def take_pending(self, job_id: str) -> TakenPending | None:
        """Step 1 of a cancel: rename pending/x to cancelled/x (the one step that races a
        claim); None if it is not pending (any more). Not durable and not to be reported
        until ``settle_cancelled`` has made it so: a batch of cancels takes its jobs one by
        one, then settles them all with one sync (``cancel --all`` of 20,000 jobs took a
        minute at a file fsync and two folder fsyncs each)."""
        _check_id(job_id)
        src = self._rpath(State.PENDING, job_id)
        dst = self._rpath(State.CANCELLED, job_id)
        # Shared with claims, exclusive to a replace: a replace checks what it replaces, then
        # writes pending/x; our rename in between would leave x in cancelled/ and pending/.
        with self._lock(REPLACE_LOCK, shared=True,
                        doing="the jobs not cancelled yet stay as they were"):
            try:
                os.rename(src, dst)  # races with a claim's rename: exactly one wins
            except FileNotFoundError:
                return None
            st = os.lstat(dst)
        return TakenPending(job_id, (st.st_dev, st.st_ino))

    def settle_cancelled(self, taken: Sequence[TakenPending], *,
                         crash_hook: Callable[[str], None] | None = None) -> None:
        """Step 2: mark each taken record "cancelled while pending" and make the batch
        durable: one syncfs for a batch (a file fsync each for a small one), then one fsync
        of cancelled/ and of pending/, and one append to the event log. Only then may the
        caller report the jobs cancelled."""
        if not taken:
            return
        now = self.clock.wall()
        # Held throughout (shared: claims go on): a replace of a job we took (it sees x in
        # cancelled/, places its new pending/x and drops cancelled/x) must not come between
        # our look at cancelled/x and our rewrite of it, which would bring back a cancelled
        # copy of the old job beside the new pending one. A replace waits one batch at most.
        # (Given up, the jobs taken stay in cancelled/ for the next open of the queue to
        # settle: their journal entry names this process, dead by then.)
        with self._lock(REPLACE_LOCK, shared=True,
                        doing="the next command to open the queue completes this cancel"):
            blobs: list[bytes] = []
            dsts: list[str] = []
            for t in taken:
                dst = self._rpath(State.CANCELLED, t.job_id)
                rec, inode = self._read_or_quarantine_inode(Path(dst))
                if rec is None or inode != t.inode:
                    continue  # pruned or replaced since taken: its cancel happened all the same
                blobs.append(replace(rec, reason=CANCELLED_PENDING_REASON,
                                     changed_at=now).dumps())
                dsts.append(dst)
            # New files, never spare record files (tmp/free.*, see recycle): those are a
            # runner's, and a runner starting now adopts every one it finds: two processes
            # would fill one inode for two records. (A batch's syncfs also makes its takes
            # durable: pending/x gone, cancelled/x there.)
            tmps = self._durable_temporaries("cancel", blobs)
            if crash_hook is not None:
                crash_hook("cancel:moved")
            for tmp, dst in zip(tmps, dsts, strict=True):
                os.replace(tmp, dst)
        # Protects against: power loss bringing a cancelled job back to pending after we
        # report it cancelled. cancelled/ first: a power loss between the two syncs can then
        # leave a job in both folders (settled by _settle_copies: the cancel stands), never
        # in neither. (After the shared hold: pending/'s sync holds claims off, exclusively.)
        fsync_dir(self.dir(State.CANCELLED))
        self._fsync_pending()
        # Cancelled, durably: a log that cannot be written (a full disk) is said, not the
        # cancel's failure (audit DN: exit 74 for a cancel made).
        self._best_effort([], "logging to the event log", lambda: self.events.append(
            {"ts": now, "event": "cancelled", "job": t.job_id} for t in taken),
            done="jobs cancelled")

    def live_ids(self, group: str | None = None) -> list[str]:
        """The ids in pending/, then those in running/ (each sorted): of ``group`` only, if
        given (each record read; an unreadable one is quarantined, as any reader does)."""
        ids: list[str] = []
        for state in (State.PENDING, State.RUNNING):
            listed = self.list_ids(state)
            if group is not None:
                listed = [j for j in listed
                          if (r := self._read_or_quarantine(self.record_path(state, j)))
                          is not None and r.spec.group == group]
            ids += listed
        return ids

    def request_cancel(self, job_id: str) -> Path:
        """Ask the runner to cancel a running job (it polls control/ and is signalled)."""
        _check_id(job_id)
        path = self.dir("control") / f"{CANCEL_REQUEST_PREFIX}{job_id}"
        tmp = self._tmp_name("ctl")
        write_file(tmp, b"", fsync=True)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return path

    def cancel_requests(self) -> list[str]:
        """The ids of the jobs a cancel was requested for. A request named for no job id
        (a file made by hand, or by an API call of a version that took any id) is removed:
        passed on, it stopped every run of the queue (exit 2, "not a job id"; review CY)."""
        ids = []
        for n in os.listdir(self.dir("control")):
            if not n.startswith(CANCEL_REQUEST_PREFIX):
                continue
            jid = n[len(CANCEL_REQUEST_PREFIX):]
            if is_job_id(jid):
                ids.append(jid)
            else:
                # (One that cannot be removed, a folder say, is left: skipped all the same;
                # review CZ.)
                with contextlib.suppress(OSError):
                    unlink_quiet(self.dir("control") / n)
        return ids

    def clear_cancel_request(self, job_id: str) -> bool:
        """Drop a cancel request for ``job_id``; whether there was one."""
        _check_id(job_id)
        return unlink_quiet(self.dir("control") / f"{CANCEL_REQUEST_PREFIX}{job_id}")

    def dead_retry(self, job_ids: Sequence[str], *,
                   crash_hook: Callable[[str], None] | None = None,
                   changes: Mapping[str, Any] | None = None) -> list[str]:
        """Return dead jobs to pending with a fresh attempt budget (history kept), their
        spec's ``changes`` made (new limits: ``memory_mb``, ``timeout_s``, ``max_attempts``,
        checked by the caller).

        Each job moves with one rename, so that a crash at any point leaves it in exactly
        one folder. Its new record is written over the dead one first: a crash right after
        leaves a dead job whose record already says "retried from dead" with a fresh budget,
        and retrying it again makes the same record. (Rewriting it after the move instead
        would race a runner, whose claim renames pending/x away: the rewrite would bring a
        second copy back into pending/.)"""
        revived: list[str] = []
        now = self.clock.wall()
        hook = crash_hook or (lambda point: None)
        job_ids = [j for j in job_ids if is_job_id(j)]  # (no job has another: not in dead/)
        # In batches, each under one hold of submit's lock and one sync for its records: a
        # fsync per job and the lock held throughout made `dead retry --all` of 20,000 jobs
        # take 115 s, every submit waiting behind it.
        for at in range(0, len(job_ids), PRUNE_BATCH):
            if at and self.stop_signal() is not None:
                break  # (the command reports what was retried, and that it was stopped)
            done = (f"{len(revived)} job(s) were retried before that; the others stay in "
                    "dead/") if revived else "nothing was retried"
            with self._lock(SUBMIT_LOCK, doing=done):
                revived += self._dead_retry_batch(job_ids[at:at + PRUNE_BATCH], now, hook,
                                                  changes or {})
        if revived:
            self.wake_runner()
        return revived

    def _dead_retry_batch(self, job_ids: Sequence[str], now: float,
                          hook: Callable[[str], None],
                          changes: Mapping[str, Any]) -> list[str]:
        revived: list[str] = []
        found: list[tuple[str, Path]] = []
        blobs: list[bytes] = []
        for jid in job_ids:
            src = self.record_path(State.DEAD, jid)
            rec = self._read_or_quarantine(src)
            if rec is None:
                continue
            spec, before = rec.spec, rec.limits_before
            if changes:
                spec = replace(rec.spec, **changes)
                # (As first submitted: a second retry with new limits keeps those.)
                before = {**{k: getattr(rec.spec, k) for k in changes}, **(before or {})}
            blobs.append(replace(rec, spec=spec, attempt_base=len(rec.attempts),
                                 not_before=0.0, lease=None, reason=RETRIED_REASON,
                                 changed_at=now, limits_before=before).dumps())
            found.append((jid, src))
        tmps = self._durable_temporaries("revive", blobs)
        # A cancel asked while the job ran, left by a runner that dead-lettered it and
        # stopped before acting on the request, is not a cancel of its retry: the next
        # runner would cancel the job the user just asked to run again.
        cleared = [jid for jid, _ in found if self.clear_cancel_request(jid)]
        if cleared:
            # Protects against: power loss bringing the request back once the job is pending.
            fsync_dir(self.dir("control"))
        for (jid, src), tmp in zip(found, tmps, strict=True):
            os.replace(tmp, src)
            hook("dead_retry:rewritten")
            try:
                os.rename(src, self.record_path(State.PENDING, jid))
            except FileNotFoundError:
                continue  # purged since we read it
            hook("dead_retry:moved")
            revived.append(jid)
        if revived:
            # Protects against: power loss after we report "retried" undoing the moves.
            # pending/ first: a power loss between the two syncs can then leave a job in
            # both folders (on a file system that does not keep a rename whole), never
            # in neither.
            self._fsync_pending()
            fsync_dir(self.dir(State.DEAD))
            # Retried, durably: what follows is best effort (audit DN: a full disk here
            # made the command exit 74 for a retry it had made, its event never logged).
            self._best_effort([], "ringing the runner's doorbell",
                                   lambda: self._ring_revived(revived), done="jobs retried")
            self._best_effort([], "logging to the event log", lambda: self.events.append(
                {"ts": now, "event": "revived", "job": j, **changes} for j in revived),
                done="jobs retried")
        return revived

    def _ring_revived(self, revived: Sequence[str]) -> None:
        bell = self.dir("journal") / f"{time.time_ns():020d}.revive"
        tmp = self._tmp_name("bell")
        # No fsync: a lost doorbell only delays a running runner until its next rescan of
        # pending/ (Runner._rescan).
        write_file(tmp, json.dumps(list(revived)).encode(), fsync=False)
        try:
            os.replace(tmp, bell)
        except OSError:
            unlink_quiet(tmp)
            raise

    def dead_purge(self, *, crash_hook: Callable[[str], None] | None = None) -> int:
        """Delete every dead-lettered record (prune at any age: the same lock, and the same
        care for a record a killed runner left beside its running copy)."""
        return self.prune([State.DEAD], -math.inf, crash_hook=crash_hook)[State.DEAD.value]

    def stop_signal(self) -> int | None:
        """The stop signal ``stop_requested`` says has come, if any."""
        return self.stop_requested() if self.stop_requested is not None else None

    def prune(self, states: Sequence[State], older_than_s: float, *,
              dry_run: bool = False,
              only: Collection[str] | None = None,
              pruned_ids: set[str] | None = None,
              crash_hook: Callable[[str], None] | None = None) -> dict[str, int]:
        """Delete the records in the terminal folders ``states`` that reached them more than
        ``older_than_s`` ago (their ``changed_at``); returns how many per state. With
        ``only``, of those job ids alone (to render one done job afresh); ``pruned_ids``
        collects the ids deleted (counted, if ``dry_run``).

        Only file modification times older than the cutoff are read: a record is written
        when it reaches its state, so a newer file cannot hold an old enough record."""
        if any(not s.terminal for s in states):
            raise ValueError("only terminal records can be pruned")
        cutoff = self.clock.wall() - older_than_s
        only = None if only is None else frozenset(only)
        if not dry_run:
            # Protects against: a power loss after the deletions bringing back a journal
            # entry whose retirement was never synced (it is not: replays are idempotent
            # while the jobs' records exist). Replayed with the records gone, it would put
            # a job that ended (cancelled, say) back in pending, to run. Once, before any
            # deletion and outside submit's lock (per batch under it, every submit waited
            # for the sync): a job accepted after this reached its state after the cutoff
            # (or, for `dead purge`, through a runner's commit, which syncs everything).
            self._pruned_synced_at = self.clock.wall()
            syncfs(self.path)
        counts: dict[str, int] = {}
        for state in states:
            folder = self.dir(state)
            n = 0
            batch: list[str] = []
            # Listed as it goes (done/ holds every job until pruned: a list of 300,000
            # entries took 300 MB), and judged PRUNE_BATCH records at a time under submit's
            # lock, never the whole folder: a submit waited for all of it (9 s at 300,000).
            with os.scandir(folder) as it:
                for e in it:
                    if self.stop_signal() is not None:
                        break  # (what is pruned so far is counted: the command says so)
                    if not e.name.endswith(".json") or (
                            only is not None and e.name[:-5] not in only):
                        continue
                    try:
                        if e.stat().st_mtime >= cutoff:
                            continue
                    except FileNotFoundError:
                        continue
                    batch.append(e.path)
                    if len(batch) >= PRUNE_BATCH:
                        n += self._prune_batch(batch, cutoff, dry_run=dry_run,
                                               ids=pruned_ids, crash_hook=crash_hook)
            while batch and self.stop_signal() is None:
                n += self._prune_batch(batch, cutoff, dry_run=dry_run, ids=pruned_ids,
                                       crash_hook=crash_hook)
            counts[state.value] = n
        return counts

    def _prune_batch(self, paths: list[str], cutoff: float, *, dry_run: bool,
                     ids: set[str] | None = None,
                     crash_hook: Callable[[str], None] | None = None) -> int:
        """Delete (count, if ``dry_run``) the records of ``paths`` that changed before
        ``cutoff``, taking them off the list, for up to PRUNE_HOLD_S (an unlink here took
        2-13 ms after many deletions). Under submit's lock: a submit (`--replace`, or a
        repeat of an id it finds here), a `dead retry` and a journal replay each decide by
        what they read in these folders, and each record is judged and deleted within one
        hold of it."""
        if not paths:
            return 0
        folder = os.path.dirname(paths[0])  # one folder's records in each batch
        n = 0
        recent: list[tuple[str, str]] = []  # (path, job id): judged, deleted after a sync
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self._lock(SUBMIT_LOCK,
                                              doing="the records not removed yet stay"))
            except Interrupted:
                # A stop came while a lock was waited for: nothing of this batch was
                # judged, and what was pruned before is the command's to report.
                paths.clear()
                return 0
            until = time.monotonic() + PRUNE_HOLD_S
            while paths and time.monotonic() < until and self.stop_signal() is None:
                if crash_hook is not None:
                    crash_hook("prune:record")
                path = paths.pop()
                if dry_run:
                    try:
                        rec = JobRecord.loads(read_file(path))
                    except (FileNotFoundError, IsADirectoryError, *_CORRUPT):
                        continue
                else:
                    # One that cannot be read is moved to corrupt/ and reported, as every
                    # reader does (it was skipped without a word, and stayed for good).
                    found = self._read_or_quarantine(Path(path))
                    if found is None:
                        continue
                    rec = found
                if rec.changed_at >= cutoff:
                    continue
                if os.path.exists(self._rpath(State.RUNNING, rec.spec.id)):
                    # A runner died between recording this state and dropping the running
                    # copy: recovery finishes that by the later record. Without it, the
                    # job would look orphaned and run again.
                    continue
                if dry_run:
                    n += 1
                    if ids is not None:
                        ids.add(rec.spec.id)
                elif rec.changed_at >= self._pruned_synced_at - PRUNE_RECENT_S:
                    recent.append((path, rec.spec.id))
                else:
                    n += self._prune_one(path, rec.spec.id, ids)
            if recent:
                # Protects against: a power loss after the deletion bringing back the running
                # copy a runner retired just before we looked (its removal not synced yet:
                # the runner's next commit does that), beside no later record: recovery
                # would take the job for orphaned and run it again (`dead purge` right after
                # a job was dead-lettered by a live runner). Once a batch, only for such.
                started = self.clock.wall()
                syncfs(self.path)
                self._pruned_synced_at = started
                n += sum(self._prune_one(path, jid, ids) for path, jid in recent)
            if n and not dry_run:
                # Protects against: power loss bringing back a record whose id a submit,
                # let in once we release the lock, reads as free and accepts anew: the job
                # would then be both finished and pending, and its new copy quarantined
                # (settle_copies), never run. So the deletions are durable before it can.
                fsync_dir(folder)
        return n

    def _prune_one(self, path: str, job_id: str, ids: set[str] | None = None) -> int:
        # A request left for a job now forgotten would cancel the next job submitted under
        # its id.
        self.clear_cancel_request(job_id)
        n = unlink_quiet(path)
        if n and ids is not None:
            ids.add(job_id)
        return n

    # -- the runner lock --
    # Two flocks, taken in this order and held together while a runner runs:
    #
    # - runner.lock, a regular file that renderctl never renames over, opened read-write. On
    #   NFS it is the one that works across hosts: a flock on a regular file goes to the
    #   server (nfs_flock), while one on a folder stays local to one client (NFS has no flock
    #   for folders), and the design has leases held by runners elsewhere. It is also the
    #   file that versions before the folder lock flocked, so an older runner and this one
    #   exclude each other, whichever starts first.
    # - the queue folder itself: a file can be removed or renamed over while its runner holds
    #   it (`rm QUEUE/runner.lock`), and a second runner would then lock the new file and,
    #   believing every other runner dead, kill the first one's workers in recovery. The
    #   folder cannot be swapped under a runner that works in it: renamed away, it takes its
    #   lock along, and a runner started on it there is refused.
    #
    # Removing runner.lock under a runner on one host still lets a runner on another host in
    # (the folder lock cannot reach it, and nothing at start-up can tell). The holder's
    # record is runner.json, replaced by rename (never seen torn, and never renamed over the
    # locked file); `status`, `cancel` and the exit-75 message read it, and scripts may.
    def _open_folder(self) -> int:
        return held(os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))

    def _open_lock_file(self, folder: int) -> int:
        """runner.lock in the folder open as ``folder`` (not wherever the path leads by
        now), read-write: NFS grants an exclusive flock only on a file open for writing."""
        return open_lock_file(self.path / RUNNER_LOCK, dir_fd=folder)

    @contextlib.contextmanager
    def runner_lock(self, holder: Holder) -> Iterator[None]:
        """Hold the one-runner-per-queue lock, or raise ``QueueBusy`` naming the holder."""
        deadline = time.monotonic() + LOCK_PATIENCE_S
        folder = lock = -1
        try:
            while True:
                folder = self._open_folder()
                lock = self._open_lock_file(folder)
                self._take(lock, deadline)
                self._take(folder, deadline)
                if os.path.samestat(os.fstat(folder), os.stat(self.path)):
                    break
                # The folder was renamed away between our open and our lock, and another
                # put in its place: that one is the queue we were asked to run.
                for fd in (folder, lock):
                    close_lock(fd)
                folder = lock = -1
            st = os.fstat(lock)
            if st.st_size:
                # An older version's record, kept inside its lock file: readers take a
                # record found there for the holder's, and ours is runner.json. Only in a
                # file of the queue's own: one hard-linked to a user's file (a job runs as
                # we do) would be emptied with it.
                if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                    raise QueueIOError(
                        f"{self.path / RUNNER_LOCK} is not a file of the queue's own (a "
                        f"{'hard link' if stat.S_ISREG(st.st_mode) else 'special file'} "
                        "holding data); renderctl will not empty it: remove it")
                try:
                    os.ftruncate(lock, 0)
                except OSError as exc:
                    raise QueueIOError(f"cannot empty {self.path / RUNNER_LOCK}: "
                                       f"{exc.strerror}") from exc
            self._runner_fd = folder
            self.write_runner_info({**holder.to_json(), "started_at": self.clock.wall()})
            yield
        finally:
            self._runner_fd = None
            for fd in (folder, lock):
                if fd >= 0:
                    close_lock(fd)

    def _take(self, fd: int, deadline: float) -> None:
        """flock ``fd`` exclusively, waiting until ``deadline`` if its holder is not a live
        runner (`status` peeking, a `cancel` settling a dead runner's orphan: a cron run
        must not be refused for those); else raise ``QueueBusy`` naming the holder."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        info = self._holder_of(fd)
        alive = _holder_alive(info)
        if alive is False:
            if flock_within(fd, fcntl.LOCK_EX, deadline - time.monotonic()):
                return
            info = self._holder_of(fd)  # who holds it now
            alive = _holder_alive(info)
        else:
            # The holder may have let go since we tried: a runner's record names it until
            # it exits, after it released the lock.
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
        # A record judged dead is not who holds it now, and one of a live runner may not be
        # either (a `flock` run by hand, a process that is no runner): ask the kernel.
        pid = info.get("pid") if alive is not False else None
        kernel = holders(fd)
        if pid is not None and (not kernel or pid in kernel):
            raise QueueBusy(f"another runner (pid {pid}) holds queue {self.path}",
                            holder_pid=pid)
        who = describe(kernel[0]) if kernel else "another process"
        raise QueueBusy(f"{who} holds queue {self.path}'s runner lock, and it is not the "
                        "runner its record names", holder_pid=kernel[0] if kernel else None)

    def write_runner_info(self, info: Mapping[str, Any]) -> None:
        """Replace runner.json, the holder record (the lock holder's to call).

        Renamed into place, so a reader sees the old record or the new one, never a torn
        one. No fsync: after a power loss nobody holds the lock, and a record naming a
        runner of an earlier boot is judged dead."""
        tmp = self._tmp_name("lock")
        write_file(tmp, json.dumps(dict(info)).encode(), fsync=False)
        os.replace(tmp, self.path / RUNNER_RECORD)

    def held_folder_fd(self) -> int | None:
        """The descriptor of the queue folder this runner locked (None: it holds none),
        which stays that folder wherever it is moved."""
        return self._runner_fd

    def runner_lock_intact(self) -> bool:
        """Whether the queue's path still names the folder this runner locked (False once
        it was renamed away and another put in its place: a runner started there holds that
        one, and our paths now lead into it). One stat and one fstat."""
        fd = self._runner_fd
        if fd is None:
            return False
        held = os.fstat(fd)  # (failing, it says nothing of the path: raised as ever)
        try:
            return os.path.samestat(held, os.stat(self.path))
        except OSError:
            # Any failure of the path, not only ENOENT: a file put where a folder on the way
            # was (ENOTDIR), a loop: the folder we hold is elsewhere, and its jobs were
            # charged `crashed` when only ENOENT counted (review EK).
            return False

    def runner_info(self) -> dict[str, Any] | None:
        """The live runner's holder record, or None if no runner holds the queue.

        Peeks in the runner's order, runner.lock then the folder, each locked shared for a
        moment (a starting runner waits for that)."""
        try:
            folder = self._open_folder()
        except (FileNotFoundError, NotADirectoryError):
            return None
        lock = -1
        try:
            with contextlib.suppress(OSError):  # none yet: only the folder can tell
                # O_NONBLOCK: a FIFO put there by hand must not hang `status`. A symlink
                # is not followed: the runner refuses one (see lockwait.open_lock_file).
                lock = held(os.open(RUNNER_LOCK, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                                    | os.O_NOFOLLOW, dir_fd=folder))
            for fd in (lock, folder):
                if fd < 0:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return self._holder_of(fd)
            return None  # we could lock both: nobody holds them
        finally:
            for fd in (folder, lock):
                if fd >= 0:
                    close_lock(fd)

    def _holder_of(self, fd: int) -> dict[str, Any]:
        """Who holds ``fd``'s file locked, as far as we can tell: the holder record or, if
        none names a pid (runner.json removed by hand; a reader holds it, not a runner), the
        process /proc/locks shows holding it exclusively; {} if neither does."""
        info = self._holder_record()
        if not info.get("pid"):
            info = _flock_holder(fd) or info
        return info

    def _holder_record(self) -> dict[str, Any]:
        """The holder record: runner.lock's content if it is one (versions before runner.json
        kept their record inside their lock file, which this one empties once it holds it),
        else runner.json's; {} if neither is."""
        old = _read_record(self.path / RUNNER_LOCK)
        return old if old.get("pid") else _read_record(self.path / RUNNER_RECORD)

    def busy_runner(self) -> dict[str, Any] | None:
        """The holder record of a runner that holds the queue, judged as ``runner_lock``
        judges it (a holder that may be alive is busy; a `status` or `cancel` holding the
        lock briefly is not); None if a new runner could start."""
        info = self.runner_info()
        if not info or _holder_alive(info) is False:
            return None
        return info

    def wake_runner(self) -> bool:
        """Tell a live runner (a --follow one waits for work) to look at pending/ now.

        Done by whoever enqueues, the Python API included: a web tier's job otherwise
        waited for the runner's next poll (0.5-1 s, longer with --poll-interval)."""
        info = self.runner_info()
        if info and info.get("pid") == os.getpid():
            return False  # `run` submitting its own manifests: nobody else to wake
        return self.signal_runner(signal.SIGUSR1)

    def signal_runner(self, sig: int) -> bool:
        info = self.runner_info()
        try:
            # The descriptor names one process for good: judged alive below, it is the
            # runner the record names, and a pid reused since (the runner gone, a new
            # process under its number) can no longer receive the signal (kill(2) after
            # the check had that window).
            if not info:
                return False
            pidfd = os.pidfd_open(int(info["pid"]))
        except (OSError, TypeError, ValueError, KeyError):
            return False  # gone, or no pid to speak of
        try:
            # Only a live runner: while a `cancel` holds the lock to fix a dead runner's
            # orphan, the record still names the dead runner, whose pid may be another's now.
            if _holder_alive(info) is not True:
                return False
            signal.pidfd_send_signal(pidfd, sig)
        except (ProcessLookupError, PermissionError):
            # Gone, or run by a user we may not signal (a service account; the web tier that
            # submits may only write the queue): it finds the work at its next poll. Never a
            # failure of what we did before (a submit's jobs are accepted by now).
            return False
        finally:
            os.close(pidfd)
        return True

    @contextlib.contextmanager
    def try_runner_lock(self) -> Iterator[bool]:
        """Hold the runner lock if free (True), else yield False; for offline fixes."""
        folder = self._open_folder()
        lock = -1
        try:
            lock = self._open_lock_file(folder)
            for fd in (lock, folder):  # the runner's order
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
            yield True
        finally:
            for fd in (folder, lock):
                if fd >= 0:
                    close_lock(fd)


def _read_record(path: Path) -> dict[str, Any]:
    """A holder record file's JSON object, or {} if it is missing or not one (a person's
    file there: O_NONBLOCK so that a FIFO cannot hang us, and 4 KiB is more than a record
    needs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            info = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _flock_holder(fd: int) -> dict[str, Any] | None:
    """A holder record for a process holding ``fd``'s file locked (lockwait.holders),
    judged as a runner's would be (only an exclusive holder: a runner holds it so, and one
    holding it shared is a reader peeking, `status`); None if none is known."""
    pids = holders(fd, exclusive=True)
    if not pids:
        return None
    pid = pids[0]
    from renderctl import proctree

    return Holder(socket.gethostname(), proctree.boot_id(), pid,
                  proctree.process_start_time(pid)).to_json()


def transition_event(t: Transition) -> dict[str, Any]:
    """The one event for a state change, as both events.jsonl and `run --json` carry it."""
    rec = t.record
    # An unrun job's last attempt is an earlier one (its outcome, its retry_at): not this news.
    last = rec.attempts[-1] if rec.attempts and not t.unrun else {}
    if t.dst is State.PENDING:
        name = "released" if t.unrun or last.get("outcome") == "released" else "retry"
    else:
        name = {State.DONE: "completed", State.DEAD: "dead", State.CANCELLED: "cancelled",
                State.EXPIRED: "expired"}.get(t.dst, t.dst.value)
    ev: dict[str, Any] = {"event": name, "job": rec.spec.id, "kind": rec.spec.kind,
                          "state": t.dst.value}
    for k in ("n", "outcome", "elapsed_s", "paused_s", "peak_memory_bytes", "error",
              "exit_code", "signal"):
        if last.get(k) is not None:
            ev["attempt" if k == "n" else k] = last[k]
    if rec.result:
        ev["output"] = rec.result.get("path")
    if name == "retry":
        ev["retry_at"] = rec.not_before
    if rec.reason:
        ev["reason"] = rec.reason
    return ev


# Holders by (control folder, token prefix); a holder file never changes once written.
_HOLDERS: dict[tuple[str, str], Holder] = {}


def _holder(control: str, prefix: str) -> Holder:
    key = (control, prefix)
    holder = _HOLDERS.get(key)
    if holder is None:
        try:
            raw = read_file(f"{control}/{HOLDER_FILE.format(prefix)}")
            holder = Holder.from_json(json.loads(raw))
        except (OSError, ValueError, KeyError, TypeError):
            return UNKNOWN_HOLDER  # not cached: it may be written in a moment
        _HOLDERS[key] = holder
    return holder


def read_lease(path: str | os.PathLike[str]) -> Lease | None:
    """The lease xattr of a running record, or None (none set, or the file is gone)."""
    try:
        raw = os.getxattr(path, LEASE_XATTR)
    except OSError:
        return None
    return _parse_lease(path, raw)


def _parse_lease(path: str | os.PathLike[str], raw: bytes) -> Lease | None:
    """A lease xattr's value (JSON, or the compact form: see Queue._write_lease)."""
    if raw.startswith(b"{"):
        try:
            return Lease.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None
    queue_dir, _, name = os.fspath(path).rpartition("/")  # QUEUE/running, x.json
    fields = lease_xattr_fields(raw, name.removesuffix(".json"))
    if fields is None:
        return None
    token, attempt, claimed_at, expires_at, prefix = fields
    control = f"{queue_dir.rpartition('/')[0]}/control"
    return Lease(_holder(control, prefix), token, attempt, claimed_at, expires_at)


