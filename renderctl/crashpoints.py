"""Crash points for tests: ``RENDERCTL_CRASH_AT=<point>[:n=<N>]`` makes a process SIGKILL
itself the Nth time (default: the first) it passes ``<point>``; ``RENDERCTL_STOP_AT``, SIGSTOP.

A durable change is a sequence of steps (write, sync, rename, sync); a crash point between two
of them lets a test cut the sequence at exactly that window, in a real process with a real
signal, instead of hoping a randomly timed kill lands there.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "RENDERCTL_CRASH_AT"
# Same syntax; SIGSTOP instead: a test freezes the process at a named point, arranges what
# happens meanwhile (another command, a worker moving on), then SIGCONTs it.
STOP_ENV = "RENDERCTL_STOP_AT"


def _parse(value: str | None) -> tuple[str, int] | None:
    point, _, nth = (value or "").partition(":n=")
    return (point, int(nth or 1)) if point else None


class CrashPoints:
    """The crash (and stop) point this process was given, if any, and how often each point
    was passed."""

    def __init__(self, value: str | None, stop: str | None = None) -> None:
        self._kill = _parse(value)
        self._stop = _parse(stop)
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
