"""Crash points for tests: ``RENDERCTL_CRASH_AT=<point>[:n=<N>]`` makes a process SIGKILL
itself the Nth time (default: the first) it passes ``<point>``.

A durable change is a sequence of steps (write, sync, rename, sync); a crash point between two
of them lets a test cut the sequence at exactly that window, in a real process with a real
signal, instead of hoping a randomly timed kill lands there.
"""

from __future__ import annotations

import os
import signal

CRASH_ENV = "RENDERCTL_CRASH_AT"


class CrashPoints:
    """The one crash point this process was given (if any), and how often it was passed."""

    def __init__(self, value: str | None) -> None:
        point, _, nth = (value or "").partition(":n=")
        self._point = point or None
        self._nth = int(nth or 1)
        self._passed = 0

    @classmethod
    def from_env(cls) -> CrashPoints:
        return cls(os.environ.get(CRASH_ENV))

    def __call__(self, point: str) -> None:
        if point != self._point:
            return
        self._passed += 1
        if self._passed == self._nth:
            os.kill(os.getpid(), signal.SIGKILL)
