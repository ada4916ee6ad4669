"""Job states, attempt outcomes, and the one table of allowed state changes."""

from __future__ import annotations

from enum import StrEnum


class State(StrEnum):
    """Where a job is; each state is a folder of the queue."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


# The reason an expired record gives, wherever the deadline was found passed (claim,
# dispatch, or the worker about to start it).
EXPIRED_REASON = "deadline passed before it started"
# control/cancel.<id>: `cancel` asks for a job a runner holds; the runner acts on it when
# woken, and a worker checks it before starting a queued job (so a job whose cancel was
# requested before it started never starts, however late the runner wakes).
CANCEL_REQUEST_PREFIX = "cancel."

TERMINAL = frozenset({State.DONE, State.DEAD, State.CANCELLED, State.EXPIRED})

# Every rename the queue may make. Anything else is a bug, caught where it is attempted.
TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.CANCELLED}),
    # -> expired: a claim takes a job out of pending/ first, then sees its deadline passed.
    State.RUNNING: frozenset({State.PENDING, State.DONE, State.DEAD, State.CANCELLED,
                              State.EXPIRED}),
    State.DEAD: frozenset({State.PENDING}),  # `renderctl dead retry`
    State.DONE: frozenset(),
    State.CANCELLED: frozenset(),
    State.EXPIRED: frozenset(),
}


def check_transition(src: State, dst: State) -> None:
    """Raise if ``src -> dst`` is not in the table."""
    if dst not in TRANSITIONS[src]:
        raise ValueError(f"illegal transition {src.value} -> {dst.value}")


class Outcome(StrEnum):
    """How one attempt ended (DESIGN.md, Failure semantics)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CRASHED = "crashed"
    MEMORY = "memory"
    TIMEOUT = "timeout"
    INVALID_INPUT = "invalid_input"
    INVALID_OUTPUT = "invalid_output"
    OUTPUT_EXISTS = "output_exists"
    CANCELLED = "cancelled"
    RELEASED = "released"

    @property
    def retryable(self) -> bool:
        return self in RETRYABLE

    @property
    def charged(self) -> bool:
        """Whether the attempt counts against ``max_attempts``."""
        return self is not Outcome.RELEASED


RETRYABLE = frozenset({Outcome.FAILED, Outcome.CRASHED, Outcome.MEMORY, Outcome.TIMEOUT})


# A running record's lease, as an extended attribute (see store.Queue._write_lease): here,
# where a worker can read it without importing the store.
LEASE_XATTR = "user.renderctl.lease"


def make_token(prefix: str, job_id: str, attempt: int, claimed_at: float) -> str:
    """An attempt's token: ``<runner prefix>:<job id>:<attempt>:<claimed at, ms>``.

    Unique per claim, not just per attempt number: attempt numbers restart when a job is
    replaced, or resubmitted after its done record was deleted, and a claim released before
    its attempt started (prefetched, never run: nothing recorded) is claimed again under the
    same number (an attempt that started and was released is recorded, so the next claim is
    the next number); the claim time (the lease keeps it, so the compact xattr needs no new
    field) tells those lives apart. Job ids hold no ':'."""
    return f"{prefix}:{job_id}:{attempt}:{round(claimed_at * 1000)}"


def lease_xattr_fields(raw: bytes, job_id: str) -> tuple[str, int, float, float, str] | None:
    """A lease xattr's (token, attempt, claimed_at, expires_at, token prefix; "" for the
    JSON form, whose holder is in it) for ``job_id``'s running record, or None if it is
    not one. The compact form is "<prefix> <attempt> <claimed_at> <expires_at>" (see
    store.Queue._write_lease). Here, for the store and for a worker that does not import
    it."""
    import json

    try:
        if raw.startswith(b"{"):
            d = json.loads(raw)
            return (str(d["token"]), int(d["attempt"]), float(d["claimed_at"]),
                    float(d["expires_at"]), "")
        prefix, attempt, claimed_at, expires_at = raw.decode().split(" ")
        return (make_token(prefix, job_id, int(attempt), float(claimed_at)), int(attempt),
                float(claimed_at), float(expires_at), prefix)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
