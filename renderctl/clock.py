"""Time as a parameter: leases, backoff, deadlines and timeouts read an injected clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class Clock(Protocol):
    """Two readings: a monotonic one for durations, a wall one for records and deadlines."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


@dataclass
class FakeClock:
    """A clock tests step by hand; both readings advance together."""

    now_wall: float = 1_800_000_000.0
    now_monotonic: float = 1000.0

    def monotonic(self) -> float:
        return self.now_monotonic

    def wall(self) -> float:
        return self.now_wall

    def advance(self, seconds: float) -> None:
        self.now_wall += seconds
        self.now_monotonic += seconds


SYSTEM_CLOCK = SystemClock()
