"""A submit SIGKILLed at random moments is all-or-nothing once the queue is opened again."""

from __future__ import annotations

import json
import os
import random
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from renderctl.lifecycle import State
from renderctl.store import Queue

# 1,000 jobs take ~0.75 s to submit here, ~0.5 s of it past start-up: of 30 kills, ~20 land
# while records and the journal are written (3,000 jobs and 20 kills: ~17, in twice the time)
JOBS = 1000
KILLS = 30
SEED = 20_240_611


@pytest.fixture
def big_manifest(tmp_path: Path) -> Path:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"jobs": [
        {"id": f"j{n:05d}", "kind": "python", "callable": "m:f", "output": f"o/{n:05d}.pdf"}
        for n in range(JOBS)
    ]}))
    return path


def submit_cmd(argv: list[str], queue: Path, manifest: Path) -> list[str]:
    return [*argv, "submit", "--queue", str(queue), "--out", str(queue.parent / "out"),
            str(manifest)]


def wait_or_kill(proc: subprocess.Popen[bytes], delay_s: float) -> bool:
    """Let ``proc`` run for ``delay_s`` (or until it exits), then SIGKILL it. True if killed."""
    fd = os.pidfd_open(proc.pid)
    try:
        exited, _, _ = select.select([fd], [], [], delay_s)
        if not exited:
            os.kill(proc.pid, signal.SIGKILL)
    finally:
        os.close(fd)
    proc.wait()
    return proc.returncode == -signal.SIGKILL


def stale_temporaries(q: Queue, pid: int) -> list[str]:
    # <pid>.<n>.<purpose>, or <pid>-<tag>.<n>.<purpose> (see store._owner_tag)
    return [n for n in os.listdir(q.dir("tmp")) if re.split(r"[.-]", n, maxsplit=1)[0] == str(pid)]


def test_killed_submit_is_all_or_nothing(tmp_path: Path, big_manifest: Path,
                                         renderctl_argv: list[str]) -> None:
    # Given the time a full submit of JOBS jobs takes on this machine
    start = time.monotonic()
    full = subprocess.run(submit_cmd(renderctl_argv, tmp_path / "q-full", big_manifest),
                          capture_output=True)
    duration = time.monotonic() - start
    assert full.returncode == 0, full.stderr.decode()
    assert Queue(tmp_path / "q-full").count(State.PENDING) == JOBS

    rng = random.Random(SEED)
    for i in range(KILLS):
        # When a submit into a fresh queue is SIGKILLed at a random moment of its run
        queue = tmp_path / f"q{i}"
        delay = rng.uniform(0.0, duration)
        proc = subprocess.Popen(submit_cmd(renderctl_argv, queue, big_manifest),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed = wait_or_kill(proc, delay)
        assert killed or proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
        if proc.stderr:
            proc.stderr.close()
        # Then opening the queue (which rolls committed journals forward) shows all or nothing
        q = Queue(queue)
        pending = q.count(State.PENDING)
        assert pending in (0, JOBS), f"kill {i} after {delay:.3f}s left {pending} pending"
        assert not [n for n in os.listdir(q.dir("journal")) if n.endswith(".txn")]
        if pending:
            assert q.get(f"j{JOBS - 1:05d}").state is State.PENDING
            assert sum(q.count(s) for s in State) == JOBS
        # And no temporaries of the dead writer remain
        assert stale_temporaries(q, proc.pid) == []
        # And opening again changes nothing
        assert Queue(queue).count(State.PENDING) == pending


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_open_removes_temporaries_of_dead_writers(queue_dir: Path) -> None:
    # Given a queue whose tmp/ holds the journal temporary of a submit killed before commit
    Queue(queue_dir)
    stale = queue_dir / "tmp" / f"{_dead_pid()}.1.txn"
    stale.write_bytes(b'{"seq": "1", "records": [')
    # When the queue is opened again
    Queue(queue_dir)
    # Then the temporary is gone
    assert not stale.exists()
