"""Waiting for a flock with a bound: what a wait given up on leaves behind."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from renderctl.lockwait import MAX_BLOCKED_WAITERS, WAITER_THREAD, flock_within


def waiters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WAITER_THREAD]


def test_waits_given_up_on_a_held_lock_leave_a_bounded_number_of_waiters(
        tmp_path: Path) -> None:
    # Given a lock file held by another open file (a stopped submitter, say)
    lock = tmp_path / ".submit.lock"
    lock.touch()
    holder = os.open(lock, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    fds_before = len(os.listdir("/proc/self/fd"))
    try:
        # When 20 requests wait for it at once, each a moment, and give up (a web tier's),
        # then 20 more one after the other
        def give_up() -> None:
            fd = os.open(lock, os.O_RDWR)
            try:
                assert not flock_within(fd, fcntl.LOCK_EX, 0.05)
            finally:
                os.close(fd)

        together = [threading.Thread(target=give_up) for _ in range(20)]
        for t in together:
            t.start()
        for t in together:
            t.join()
        for _ in range(20):
            give_up()

        # Then only a few waiters stay blocked behind the holder, each with its descriptor
        # (before: one thread and one fd per request, until the holder let go: audit BD;
        # then, counted only once given up, the 20 that waited together left 20: BH)
        assert len(waiters()) <= MAX_BLOCKED_WAITERS
        assert len(os.listdir("/proc/self/fd")) - fds_before <= MAX_BLOCKED_WAITERS
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
    # And once the holder lets go, they take it in turn, let go at once, and are gone
    for t in waiters():
        t.join(timeout=10)
    assert waiters() == []
    fd = os.open(lock, os.O_RDWR)
    try:
        assert flock_within(fd, fcntl.LOCK_EX, 5.0)
    finally:
        os.close(fd)
