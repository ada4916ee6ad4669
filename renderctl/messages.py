"""Runner <-> worker messages: small frozen dataclasses, dispatched with ``isinstance``.

A message about one job sent to a worker names that assignment by its ``seq`` (its number
in the worker's stream, ``RunJob.seq``), never by job id alone: the same job id can be
queued in a worker again while an answer about its earlier assignment is still on the way
(cancelled then replaced; taken back then sent back), and that answer must not be taken for
the new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# -- runner -> worker ----------------------------------------------------------------------


@dataclass(frozen=True)
class RunJob:
    """Run one attempt of a job, writing its output to ``tmp_output``."""

    job_id: str
    attempt: int
    token: str
    spec: dict[str, Any]
    tmp_output: str
    output_kind: str  # "file" | "dir"
    memory_limit_bytes: int
    # Its deadline (wall clock) if it has never been attempted: DESIGN.md's "not started by
    # then -> expired, never run" holds at the start itself, which may come long after the
    # claim for a job queued behind another in this worker.
    expires_at: float | None = None
    # Its number in this worker's stream of jobs (unique there): what every message about
    # this assignment names it by, and its number at the start gate (renderctl.gate). 0:
    # no gate, always start (a worker driven without a runner, in tests).
    seq: int = 0
    # A renderer kind's "module:function", as the runner's catalogue has it: the worker
    # imports that alone, not every installed plugin's entry point (a slow or large one
    # was charged to whichever job first asked the catalogue; audit CS).
    target: str = ""
    # Whether its lease is the running record's xattr (set before this was sent): then a
    # record without one is another claim's, caught between its rename and its lease.
    lease_xattr: bool = False


@dataclass(frozen=True)
class Skip:
    """Drop these queued (not started) assignments (by ``RunJob.seq``), e.g. cancelled;
    answered with ``Dropped``."""

    seqs: tuple[int, ...]


@dataclass(frozen=True)
class Drain:
    """Drop every queued job (answer ``Dropped``), finish the current one, then exit."""


@dataclass(frozen=True)
class Stop:
    """Exit after the jobs already queued (worker recycling)."""


# -- worker -> runner ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The worker is up (its pid and process group)."""

    pid: int
    pgid: int


@dataclass(frozen=True)
class Started:
    """The worker began this attempt (timeouts and memory are measured from here)."""

    job_id: str
    token: str
    seq: int  # the assignment's RunJob.seq
    wall: float
    # CLOCK_MONOTONIC, the same for every process of the host: compared with the runner's
    # stop time, which a wall-clock step between the two would misorder.
    mono: float = 0.0
    # Memory earlier jobs left held in this worker (below the leftover allowance), which
    # its ceiling is raised by: the sampling guard must judge and report the same way.
    carried_bytes: int = 0


@dataclass(frozen=True)
class Finished:
    """One attempt ended inside the worker (it did not die)."""

    job_id: str
    token: str
    outcome: str
    elapsed_s: float
    error: str | None = None
    traceback_tail: str | None = None
    stderr_tail: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    sha256: str | None = None
    bytes: int | None = None
    pages: int | None = None
    peak_memory_bytes: int | None = None
    owner_tagged: bool = False  # the output file carries this attempt's token (xattr)
    # The output's file system was full (or unwritable) as the attempt failed saying a disk
    # was full, with why (publish.output_folder_problem): the folder's fault, not the job's.
    output_full: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The assignment's RunJob.seq (a worker's message); 0 in a result the runner made
    # itself (a kill, a death), which is matched to nothing.
    seq: int = 0


class DropKind(StrEnum):
    """Why a worker hands queued jobs back (``Dropped.kind``)."""

    SKIP = "skip"  # answer to Skip: those jobs were cancelled
    DRAIN = "drain"  # answer to Drain: the runner is stopping; the current job finishes
    EXPIRED = "expired"  # its deadline passed before the worker could start it
    CANCELLED = "cancelled"  # a cancel was requested before the worker could start it
    RETIRE = "retire"  # the worker is leaving now (a job broke it, or left a thread...)
    LEAKED = "leaked"  # retiring: a job left memory charged to its slot (replace the slot)
    ABOVE_CEILING = "above_ceiling"  # retiring: its slot holds more than the next ceiling
    # Its lease on disk is not this claim's any more, or has run out (the runner stopped
    # renewing it: frozen, and perhaps taken over): the runner, which knows, decides.
    LEASE = "lease"


@dataclass(frozen=True)
class Dropped:
    """These queued assignments (by ``RunJob.seq``) were not started: ``kind`` says why (the
    runner acts on it), ``reason`` says it in words (for logs)."""

    seqs: tuple[int, ...]
    kind: DropKind
    reason: str = ""


@dataclass(frozen=True)
class Broken:
    """The worker cannot go on: its own bookkeeping failed (the queue's disk is full, say),
    not a job. Its last message; the runner stops with the error (exit 74)."""

    error: str
