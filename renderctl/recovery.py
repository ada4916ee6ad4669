"""Judging an orphan: a job left in running/ by a runner that is gone.

Two callers must reach the same verdict on the same evidence: the runner's recovery (at
start, and when a lease it could not judge expires) and `cancel` when no runner holds the
queue (control.py). Both come here, holding the queue's runner lock, so that nobody else
moves the job meanwhile:

1. ``kill_stale_workers``: process groups a dead runner's workers left are killed first, so
   that no dying process writes a temporary after step 2 removed it;
2. ``judge_orphan``: an output published and this attempt's own (``publish.is_ours``) means
   the job completed: it is recorded done from that evidence, never run or published again.
   Otherwise the job's output temporaries are discarded, and the attempt the runner died in
   is a ``crashed`` one if it had started (its token is in a started log: workers append it
   before starting), or nothing is charged if the job had only been claimed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from renderctl import proctree
from renderctl.errors import QueueIOError
from renderctl.fsutil import fsync_dir, read_file, sync_filesystems, unlink_quiet
from renderctl.lifecycle import Outcome, State
from renderctl.publish import (
    OutputEscapes,
    Published,
    discard,
    found_tmp_output_path,
    is_ours,
    output_folder,
    publish,
    says_full,
    tmp_outputs,
)
from renderctl.render.base import RendererSpec
from renderctl.store import JobRecord, Queue, Transition, read_lease

STARTED_LOG = "started.{}.log"  # control/: tokens of the attempts a runner's workers began
# control/: tokens of attempts a runner stopped on purpose where it could record nothing else
# (its queue folder moved away under it): released, not charged. Named as a started log of
# that runner, so that it goes with them.
RELEASED_LOG = STARTED_LOG.format("{}.released")
# A release's reason in that log, after its token and a tab: the queue's own file system
# was full (the runner could record nothing else), not moved.
QUEUE_FULL_RELEASE = "queue-full"
QUEUE_IO_RELEASE = "queue-io"  # (failing otherwise: EIO)
QUEUE_RELEASE_ERRORS = {
    QUEUE_FULL_RELEASE: "its runner stopped as the queue's file system was full; not charged "
                        "(once: stopped so again, the attempt is charged)",
    QUEUE_IO_RELEASE: "its runner stopped on an I/O error of the queue's file system; not "
                      "charged (once: stopped so again, the attempt is charged)"}
WORKERS_FILE = "workers.{}.json"  # control/: a runner's worker pids and process groups


@dataclass(frozen=True)
class Orphan:
    """What the evidence says of one orphaned job."""

    done: Transition | None = None  # published and ours: it completed
    published_tmp: Path | None = None  # the output's temporary name, once done is durable
    crashed: Mapping[str, Any] | None = None  # the attempt it died in, if that had started


def cancelled_orphan(rec: JobRecord, orphan: Orphan, now: float) -> Transition:
    """An orphan whose cancel was asked (and not found completed): cancelled, with the
    attempt its runner died in on record if it had started. `cancel` of a job with no
    runner, and a runner recovering one whose cancel its dead runner never acted on."""
    attempts = rec.attempts + ((orphan.crashed,) if orphan.crashed is not None else ())
    return Transition(replace(rec, attempts=attempts, lease=None,
                              reason="cancelled (no runner)", changed_at=now),
                      State.CANCELLED)


def started_tokens(q: Queue, *, last_bytes: int | None = None) -> dict[str, float | None]:
    """Tokens of every attempt a worker of any runner of ``q`` had started, with the time it
    started (None from a line cut short by the crash). With ``last_bytes``, of the lines
    in each log's last that many bytes only: a worker runs one job at a time, so the start
    of the one it runs is its last line (`status`: a log grows by a line a job, for as
    long as its worker lives; review DO timed 4 s at 2,000,000 lines)."""
    started: dict[str, float | None] = {}
    for log in q.dir("control").glob(STARTED_LOG.format("*")):
        if log.name.endswith(RELEASED_LOG.format("")[len("started."):]):
            continue  # (released_tokens)
        try:
            # (read_file: without blocking, should a job have put a FIFO there)
            raw = read_file(log) if last_bytes is None else _read_tail(log, last_bytes)
        except OSError:
            continue
        text = raw.decode(errors="replace")
        if last_bytes is not None:
            text = text.partition("\n")[2]  # (the first line may be cut: not a whole one)
        for line in text.splitlines():
            token, _, wall = line.partition(" ")
            if token:
                try:
                    started[token] = float(wall)
                except ValueError:
                    started[token] = None
    return started


def released_tokens(q: Queue) -> dict[str, str]:
    """Tokens of the attempts a runner released where it could record nothing else (see
    RELEASED_LOG), each with its reason ("" for a moved folder): judged released, not
    crashed."""
    released: dict[str, str] = {}
    for log in q.dir("control").glob(RELEASED_LOG.format("*")):
        with contextlib.suppress(OSError):
            for line in read_file(log).decode(errors="replace").splitlines():
                token, _, reason = line.partition("\t")
                if token:
                    released[token] = reason
    return released


# What a file system failing under a run says (not EMFILE, EACCES, ENOENT...: those are
# the process's or a job's doing, said as they are: review EZ)
# (Not ENXIO or ENODEV: a FIFO or a device a job put in place of a queue file says those.)
FILE_SYSTEM_ERRNOS = frozenset({errno.EIO, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                                errno.ENOTCONN, errno.ESTALE, errno.EUCLEAN,
                                errno.EREMOTEIO})


def queue_failure(exc: BaseException) -> tuple[str, bool] | None:
    """If ``exc`` is the queue's file system failing (what a run meets: full, read-only,
    EIO), the message to report and whether it says the file system is full (ENOSPC,
    EDQUOT); else None."""
    if not isinstance(exc, OSError | QueueIOError):
        return None
    seen: BaseException | None = exc
    for _ in range(8):  # (a cause chain is short; a cycle is not followed for good)
        if isinstance(seen, OSError) and seen.errno is not None:
            if seen.errno not in FILE_SYSTEM_ERRNOS:
                return None
            where = f" ({seen.filename})" if seen.filename else ""
            return (f"I/O error{where}: {seen.strerror}",
                    seen.errno in (errno.ENOSPC, errno.EDQUOT))
        if seen is None or not (seen.__cause__ or seen.__context__):
            break
        seen = seen.__cause__ or seen.__context__
    return str(exc), says_full(str(exc))


def _read_tail(path: Path, size: int) -> bytes:
    """The last ``size`` bytes of ``path`` and one more (the cut line's end), or all of it;
    without blocking, should a job have put a FIFO there."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        end = os.fstat(fd).st_size
        start = max(0, end - size - 1)
        return (b"\n" if start == 0 else b"") + os.pread(fd, end - start, start)
    finally:
        os.close(fd)


def kill_stale_workers(q: Queue, *, own: Path | None = None) -> None:
    """Kill process groups a dead runner's workers left (e.g. a command's grandchild).

    Only for a caller holding the runner lock: every other runner of ``q`` is dead then."""
    doomed: list[int] = []
    boot = proctree.boot_id()
    for f in q.dir("control").glob(WORKERS_FILE.format("*")):
        if f == own:
            continue
        try:
            entries = json.loads(read_file(f))
        except (OSError, ValueError):
            entries = []  # cut by a crash while written: its workers die with their runner
        for e in entries if isinstance(entries, list) else ():
            # A process group only from an entry that names one as a number (hand-edited or
            # another tool's file: kill nothing we cannot name, and go on).
            pgid = e.get("pgid") if isinstance(e, dict) else None
            if type(pgid) is int and pgid > 1 and _still_ours(e, pgid, boot) \
                    and proctree.group_alive(pgid):
                try:
                    proctree.kill_group(pgid, signal.SIGKILL)
                except PermissionError:
                    # Another user's group: the id was reused since (ours were our user's).
                    continue
                doomed.append(pgid)
        unlink_quiet(f)
    # SIGKILL lands asynchronously: a dying worker may still finish the write(2) it is
    # in. Wait (briefly) until they are gone, so that the temporaries recovery removes
    # next cannot reappear behind it.
    deadline = time.monotonic() + 2.0
    while doomed and time.monotonic() < deadline:
        doomed = [g for g in doomed if proctree.group_alive(g)]
        if doomed:
            time.sleep(0.005)


def _still_ours(entry: Mapping[str, Any], pgid: int, boot: str) -> bool:
    """Whether process group ``pgid``, named by a dead runner's ``entry``, can still be
    the one its worker led. Not after a reboot (pids start again), nor while a process
    other than that worker holds the id as its pid (started later: the id was free, so
    the worker's group had ended, and the id went to someone else). While the worker's
    group lives on without it (a command's child after the worker's death), the kernel
    gives the id to no one. Entries of earlier versions, without these fields, count."""
    recorded_boot = entry.get("boot")
    if isinstance(recorded_boot, str) and recorded_boot != boot:
        return False
    start = entry.get("pgid_start")
    now = proctree.process_start_time(pgid)
    return type(start) is not int or now is None or now == start


def judge_orphan(rec: JobRecord, *, started: Mapping[str, float | None], now: float,
                 specs: Mapping[str, RendererSpec] | None = None,
                 released: Mapping[str, str] | Collection[str] = ()) -> Orphan:
    """The verdict on one orphaned job (see the module docstring); discards its output
    temporaries unless its output is published."""
    spec = rec.spec
    lease = rec.lease
    final = spec.output_path
    if specs is None:
        from renderctl.render.registry import all_specs

        specs = all_specs()
    kind = specs.get(spec.kind)
    is_dir = kind is not None and kind.output == "dir"
    if lease is not None:
        tmp = found_tmp_output_path(final, spec.id, lease.token)
        if _exists(final) and is_ours(tmp, final, is_dir=is_dir, job_id=spec.id,
                                      token=lease.token):
            # Published before the crash, not yet recorded: complete, never republish.
            attempt = {"n": lease.attempt, "outcome": Outcome.COMPLETED.value,
                       "started_at": lease.claimed_at, "ended_at": now, "recovered": True}
            result = {"path": str(final), **describe_output(final, is_dir),
                      "attempts": len(rec.attempts) + 1, "recovered": True}
            done = replace(rec, attempts=rec.attempts + (attempt,), lease=None,
                           result=result, reason="", changed_at=now)
            return Orphan(done=Transition(done, State.DONE),
                          published_tmp=None if is_dir else tmp)
    swept = tmp_outputs(final, spec.id)
    if lease is not None and tmp not in swept and os.path.lexists(tmp):
        swept.append(tmp)  # (named by an earlier build: tmp_outputs does not list those)
    for t in swept:
        discard(t)
    if lease is None or lease.token not in started:
        return Orphan()  # it never started (claimed ahead, or the claim was cut short)
    reason = released.get(lease.token) if isinstance(released, Mapping) else (
        "" if lease.token in released else None)
    last = rec.attempts[-1] if rec.attempts else {}
    if reason in QUEUE_RELEASE_ERRORS and not (
            last.get("outcome") == Outcome.RELEASED.value and last.get("queue_full")):
        # Its runner stopped on the queue's full (or failing) disk, where it could record
        # nothing else: not the job's fault (audit EW: charged `crashed`, dead at
        # max_attempts = 1). Once in a row: a job that fills that disk itself must end.
        return Orphan(crashed={"n": lease.attempt, "outcome": Outcome.RELEASED.value,
                               "started_at": max(started[lease.token] or 0, lease.claimed_at),
                               "ended_at": now, "host": lease.holder.host,
                               "queue_full": True, "error": QUEUE_RELEASE_ERRORS[reason]})
    if reason == "":
        # Its runner stopped it on purpose, its queue folder moved away under it: as for a
        # stop, not charged (audit DY: charged `crashed`, dead at max_attempts = 1).
        return Orphan(crashed={"n": lease.attempt, "outcome": Outcome.RELEASED.value,
                               "started_at": max(started[lease.token] or 0, lease.claimed_at),
                               "ended_at": now, "host": lease.holder.host,
                               "error": "its runner stopped it as the queue folder was moved "
                                        "or replaced under it; not charged"})
    h = lease.holder
    if not h.host:  # UNKNOWN_HOLDER: its holder file was gone
        why = "an unknown runner let its lease expire"
    elif proctree.holder_dead_to_lock_holder(host=h.host, boot_id=h.boot_id, pid=h.pid,
                                              start_time=h.start_time or 0):
        # (Died, or ended on an error it could not record the attempt through: review EX)
        why = f"the runner (pid {h.pid} on {h.host}) ended"
    else:
        # On another host, or its pid now names some other process here: that it died is
        # not known, only that it stopped renewing its lease.
        why = f"the runner (pid {h.pid} on {h.host}) let its lease expire"
    # Ended when the runner died, some time before now: its duration is unknown.
    return Orphan(crashed={"n": lease.attempt, "outcome": Outcome.CRASHED.value,
                           # (never before its claim: a torn line's figure is garbage)
                           "started_at": max(started[lease.token] or 0, lease.claimed_at),
                           "ended_at": now, "host": lease.holder.host,
                           "error": f"{why} during the attempt"})


def _exists(path: Path) -> bool:
    """Path.exists(), where a path too long to name (an output accepted before submit
    measured its whole path: every lookup of it fails) is one that does not exist."""
    try:
        return path.exists()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return False
        raise


def restore_lost_output(q: Queue, rec: JobRecord, running: Path, *, is_dir: bool) -> bool:
    """Publish again an output whose done record is on disk but whose publish is not.

    The done record and the output's rename reach the disk in the same sync; a power loss
    during it (no journal: each folder's block is written on its own) can keep the record
    and lose the rename, leaving the output under its temporary name, which the leftover
    running copy's lease names. Published only if it is that very output (its sha256 is
    the record's; a folder's marker names the attempt), and never over anything."""
    final = rec.spec.output_path
    lease = read_lease(running)
    if lease is None:
        try:
            lease = q.read_record(running).lease  # inline, on a file system without xattrs
        except (OSError, ValueError, KeyError, TypeError):
            return False
    if lease is None or os.path.lexists(final):
        return False
    tmp = found_tmp_output_path(final, rec.spec.id, lease.token)
    try:
        if is_dir:
            ok = is_ours(tmp, tmp, is_dir=True, job_id=rec.spec.id, token=lease.token)
        else:
            ok = (rec.result or {}).get("sha256") == describe_output(tmp, False)["sha256"]
        if not ok:
            return False
        folder = output_folder(os.path.realpath(rec.spec.out_root), final,
                               os.path.realpath(q.path))
        try:
            published = publish(tmp, final, is_dir=is_dir, token=lease.token, dir_fd=folder)
        finally:
            os.close(folder)
    except (OSError, OutputEscapes):
        return False
    if published is Published.PUBLISHED:
        fsync_dir(final.parent)  # Protects against: losing it again to the next power loss
    return published is Published.PUBLISHED


def retired_event(q: Queue, rec: JobRecord, state: State, running: Path) -> dict[str, Any]:
    """The event of a finish its runner died in after placing the later record, before
    retiring the running copy (``Queue.retire`` logs each event only after that): the one
    that runner would have logged, judged from the two copies."""
    lease = read_lease(running)
    if lease is None:
        try:
            lease = q.read_record(running).lease  # inline, without xattrs
        except (OSError, ValueError, KeyError, TypeError):
            lease = None
    # Unrun (cancelled before it started, expired in its worker): its record's last
    # attempt is an earlier one, not the one this lease was for.
    last = rec.attempts[-1].get("n") if rec.attempts else None
    unrun = lease is not None and last != lease.attempt
    return Transition(rec, state, unrun=unrun).event


def apply_verdicts(q: Queue, transitions: list[Transition], published_tmps: list[Path], *,
                   logged_after: str | None = None) -> None:
    """Make verdicts durable, then drop the temporary names of outputs found published (only
    now: the done records that replace them as proof are on disk). ``logged_after``: see
    Queue.finish."""
    done = {t.record.spec.output_path.parent for t in transitions if t.dst is State.DONE}
    if done:
        # Protects against: a power loss after the done records below losing the publish
        # they vouch for, which the dead runner may have died before syncing. `finish`
        # syncs the queue's file system only; an output may be on another.
        sync_filesystems([q.path, *done])
    if transitions:
        q.finish(transitions, logged_after=logged_after)
    for tmp in published_tmps:
        unlink_quiet(tmp)


def describe_output(final: Path, is_dir: bool) -> dict[str, Any]:
    """sha256 (files) and size of a published output, for a done record made from evidence."""
    if is_dir:
        total = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
        return {"sha256": None, "bytes": total, "pages": None}
    h = hashlib.sha256()
    with open(final, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return {"sha256": h.hexdigest(), "bytes": final.stat().st_size, "pages": None}
