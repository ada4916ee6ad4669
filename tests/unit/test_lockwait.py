"""Waiting for a flock with a bound: what a wait given up on leaves behind."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

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


def test_waiters_past_the_bound_are_not_starved_by_a_busy_holder(tmp_path: Path) -> None:
    # Given a lock that another process takes back a moment after each time it lets go
    # (a `dead retry --all`'s batches), for 8 s
    lock = tmp_path / ".submit.lock"
    lock.touch()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(lock)!r}, os.O_RDWR)
        end = time.monotonic() + 8
        while time.monotonic() < end:
            fcntl.flock(fd, fcntl.LOCK_EX); time.sleep(0.03); fcntl.flock(fd, fcntl.LOCK_UN)
        """)])
    took: dict[int, float] = {}

    def wait(i: int) -> None:
        fd = os.open(lock, os.O_RDWR)
        started = time.monotonic()
        try:
            if flock_within(fd, fcntl.LOCK_EX, 20):
                took[i] = time.monotonic() - started
                time.sleep(0.1)  # (the work the lock was for)
        finally:
            os.close(fd)

    # When twice the bound of waiters wait for it at once
    waiting = [threading.Thread(target=wait, args=(i,)) for i in range(2 * MAX_BLOCKED_WAITERS)]
    try:
        for t in waiting:
            t.start()
        for t in waiting:
            t.join()
    finally:
        holder.wait(timeout=30)
    # Then each gets it while the holder is still busy, those past the bound too (before:
    # they only polled, every later waiter took the freed slots first, and they waited
    # until the holder stopped: review BK)
    assert len(took) == len(waiting) and max(took.values()) < 7.5, took


def test_a_forked_child_starts_with_no_waiters_counted(tmp_path: Path) -> None:
    # Given waiters given up on a held lock, still blocked behind its holder
    lock = tmp_path / ".submit.lock"
    lock.touch()
    holder = os.open(lock, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        for _ in range(MAX_BLOCKED_WAITERS):
            fd = os.open(lock, os.O_RDWR)
            assert not flock_within(fd, fcntl.LOCK_EX, 0.01)
            os.close(fd)
        # When the process forks (a preforking web server), then the child counts none of
        # them: their threads are not in it (before: its every wait on that lock polled)
        pid = os.fork()
        if pid == 0:
            from renderctl import lockwait
            os._exit(0 if not lockwait._blocked else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
    for t in waiters():
        t.join(timeout=10)


def test_a_waiter_whose_descriptor_fails_to_close_says_nothing_and_frees_its_slot(
        tmp_path: Path, monkeypatch: Any) -> None:
    import errno

    from renderctl import lockwait

    # Given a held lock, and a close(2) of the waiter's own descriptor that fails with EIO
    # (audit DN: strace's fault injection; a close that fails has freed it all the same)
    lock = tmp_path / ".submit.lock"
    lock.touch()
    holder = os.open(lock, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    real_close = os.close
    failed: list[int] = []

    def close(fd: int) -> None:
        real_close(fd)
        if threading.current_thread().name == WAITER_THREAD:
            failed.append(fd)
            raise OSError(errno.EIO, "Input/output error")

    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    monkeypatch.setattr(lockwait.os, "close", close)
    fd = os.open(lock, os.O_RDWR)
    try:
        # When a wait for it ends as the holder lets go
        threading.Timer(0.2, lambda: fcntl.flock(holder, fcntl.LOCK_UN)).start()
        assert flock_within(fd, fcntl.LOCK_EX, 10.0)
    finally:
        real_close(fd)
        real_close(holder)

    # Then the wait succeeded, its thread raised nothing (it printed a traceback), and its
    # slot among the waiters was given back
    assert failed and not raised, raised
    assert lockwait._blocked == {}, lockwait._blocked
