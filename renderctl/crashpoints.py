"""Crash points for tests: ``RENDERCTL_CRASH_AT=<point>[:n=<N>]`` makes a process SIGKILL
itself the Nth time (default: the first) it passes ``<point>``; ``RENDERCTL_STOP_AT``, SIGSTOP.

A durable change is a sequence of steps (write, sync, rename, sync); a crash point between two
of them lets a test cut the sequence at exactly that window, in a real process with a real
signal, instead of hoping a randomly timed kill lands there.
"""

from __future__ import annotations

import os
import signal

from renderctl.errors import UserError

CRASH_ENV = "RENDERCTL_CRASH_AT"
# Same syntax; SIGSTOP instead: a test freezes the process at a named point, arranges what
# happens meanwhile (another command, a worker moving on), then SIGCONTs it.
STOP_ENV = "RENDERCTL_STOP_AT"


# Every point a process of renderctl passes (tests/unit/test_crashpoints.py checks that the
# code names no other): a misspelt point would otherwise never fire, and a crash test
# written with it would pass without crashing anything.
KNOWN = frozenset({
    # runner
    "locked", "claim", "claim:expiring", "lease", "folders", "start", "commit",
    "commit:synced", "publish:before_link", "publish:after_link", "commit:placed",
    "publish:after_done",
    "dead", "rebalance", "trim:placed",
    "unresponsive", "released", "shutdown", "suspend:stopping", "start_worker",
    # store: submit, finish, dead retry
    "submit:parsed", "submit:listed", "submit:checked", "submit:staged", "submit:placed",
    "submit:before_doorbell",
    "dead_retry:rewritten", "dead_retry:moved",
    # prune: before each record it judges
    "prune:record",
    # cancel: before each id; a batch of pending ones taken and synced, not yet settled
    "cancel:before", "cancel:moved",
    # worker: a job ran and its output was checked, its leftover processes not yet removed;
    # begun, its parent-death signal not yet armed; a command job's command just started,
    # or forked, not yet exec'd (the point passed in the child); a job's start recorded
    # (its gate and started log), the runner not yet told; about to import the renderers
    # (fork, spawn), before the first job that is not a command
    "worker:checked", "worker:born", "worker:command_started", "worker:command_forked",
    "worker:starting", "worker:importing",
})


class BadCrashPoint(UserError):
    """A crash or stop point variable that names no point, or a bad count."""


def _parse(value: str | None, variable: str = CRASH_ENV) -> tuple[str, int] | None:
    if not value:
        return None
    point, sep, nth = value.partition(":n=")
    if point not in KNOWN:
        raise BadCrashPoint(f"{variable}={value!r}: no such point (one of "
                            f"{', '.join(sorted(KNOWN))}; append :n=N for the Nth pass)")
    if not sep:
        return point, 1
    if not nth.isdigit() or int(nth) < 1:
        raise BadCrashPoint(f"{variable}={value!r}: n must be a whole number >= 1")
    return point, int(nth)


def check_env() -> None:
    """Refuse (UserError, exit 2) malformed crash/stop point variables before any work."""
    _parse(os.environ.get(CRASH_ENV), CRASH_ENV)
    _parse(os.environ.get(STOP_ENV), STOP_ENV)


class CrashPoints:
    """The crash (and stop) point this process was given, if any, and how often each point
    was passed."""

    def __init__(self, value: str | None, stop: str | None = None) -> None:
        self._kill = _parse(value, CRASH_ENV)
        self._stop = _parse(stop, STOP_ENV)
        self._passed: dict[str, int] = {}

    @classmethod
    def from_env(cls) -> CrashPoints:
        return cls(os.environ.get(CRASH_ENV), os.environ.get(STOP_ENV))

    def __call__(self, point: str) -> None:
        if self._kill is None and self._stop is None:
            return
        n = self._passed[point] = self._passed.get(point, 0) + 1
        if self._kill == (point, n):
            os.kill(os.getpid(), signal.SIGKILL)
        if self._stop == (point, n):
            os.kill(os.getpid(), signal.SIGSTOP)
