"""Process groups, kills and liveness, with real processes and real signals."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from renderctl import proctree

REPO = str(Path(__file__).resolve().parents[2])
ENV = {**os.environ, "PYTHONPATH": REPO}

# A child that starts a grandchild ignoring SIGTERM, prints both pids, then waits.
STUBBORN_TREE = """
import os, signal, subprocess, sys
gc = subprocess.Popen([sys.executable, "-c",
    "import signal, sys, time\\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "print('ready', flush=True)\\n"
    "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
gc.stdout.readline()
print(os.getpid(), gc.pid, flush=True)
gc.wait()
"""


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait for any process (child or not) to exit, via its pidfd; True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return bool(ready)
    finally:
        os.close(fd)


@pytest.fixture
def stubborn_group():
    """A process group whose grandchild ignores SIGTERM; yields (popen, grandchild pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN_TREE], stdout=subprocess.PIPE, text=True, process_group=0
    )
    _, grandchild = (int(x) for x in proc.stdout.readline().split())
    yield proc, grandchild
    proctree.kill_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)


def test_stop_group_escalates_to_sigkill_and_leaves_no_survivor(stubborn_group):
    # Given a group whose grandchild ignores SIGTERM
    proc, grandchild = stubborn_group
    assert grandchild in proctree.descendants(proc.pid)
    assert set(proctree.group_members(proc.pid)) == {proc.pid, grandchild}
    # When we stop it with a short grace
    result = proctree.stop_group(proc.pid, grace_s=0.3)
    # Then SIGTERM was not enough, SIGKILL was used, and nothing in the group runs
    assert result.signal_used == signal.SIGKILL
    assert result.survivors == ()
    assert 0.3 <= result.elapsed_s < 5
    assert not proctree.group_alive(proc.pid)
    assert proc.wait(timeout=5) == -signal.SIGTERM  # the child itself obeyed SIGTERM
    assert _wait_exit(grandchild, 0)


def test_stop_group_stops_at_sigterm_when_obeyed():
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    proc.stdout.readline()
    result = proctree.stop_group(proc.pid, grace_s=5)
    assert result.signal_used == signal.SIGTERM
    assert result.elapsed_s < 5
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_kill_group_on_a_gone_group_is_success_not_error():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], process_group=0)
    proc.wait(timeout=10)
    assert proctree.kill_group(proc.pid, signal.SIGKILL) is False
    assert proctree.group_alive(proc.pid) is False
    assert proctree.stop_group(proc.pid, grace_s=1).signal_used is None


@pytest.mark.parametrize("pgid", [0, 1, -5])
def test_kill_group_refuses_own_group_and_init(pgid):
    with pytest.raises(ValueError):
        proctree.kill_group(pgid, signal.SIGKILL)


def test_process_start_time_and_holder_alive():
    me, start = os.getpid(), proctree.process_start_time(os.getpid())
    assert isinstance(start, int) and start > 0
    here = {"host": socket.gethostname(), "boot_id": proctree.boot_id()}
    assert proctree.holder_alive(**here, pid=me, start_time=start) is True
    # Same pid, different start time: what a recycled pid looks like.
    assert proctree.holder_alive(**here, pid=me, start_time=start - 1) is False
    assert (
        proctree.holder_alive(host="elsewhere", boot_id=here["boot_id"], pid=me, start_time=start)
        is None
    )
    assert (
        proctree.holder_alive(host=here["host"], boot_id="another-boot", pid=me, start_time=start)
        is False
    )

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = proctree.process_start_time(dead.pid)
    dead.wait(timeout=10)
    assert proctree.process_start_time(dead.pid) is None
    assert proctree.holder_alive(**here, pid=dead.pid, start_time=dead_start or 0) is False


# The intermediate process starts a child that arms PR_SET_PDEATHSIG, then blocks.
PDEATHSIG_PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import time\\n"
    "from renderctl.proctree import set_parent_death_signal\\n"
    "set_parent_death_signal()\\n"
    "print('armed', flush=True)\\n"
    "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
child.wait()
"""


def test_parent_death_signal_kills_the_orphan():
    # Given a child that armed the parent-death signal under an intermediate parent
    parent = subprocess.Popen(
        [sys.executable, "-c", PDEATHSIG_PARENT], stdout=subprocess.PIPE, text=True, env=ENV
    )
    child = int(parent.stdout.readline())
    assert proctree.process_start_time(child) is not None
    # When the intermediate parent is SIGKILLed
    parent.kill()
    parent.wait(timeout=5)
    # Then the kernel kills the child too
    assert _wait_exit(child, 5), "child survived its parent's death"


def test_parent_death_signal_refuses_when_parent_already_gone():
    code = (
        "from renderctl.proctree import ParentGone, set_parent_death_signal\n"
        "try:\n    set_parent_death_signal(expected_parent=1)\n"
        "except ParentGone:\n    raise SystemExit(7)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=ENV, timeout=10).returncode == 7


def test_set_oom_score_adj_raises_in_a_child_only():
    code = (
        "import sys\nfrom renderctl.proctree import set_oom_score_adj\n"
        "ok = set_oom_score_adj(500)\n"
        "sys.exit(0 if ok and open('/proc/self/oom_score_adj').read().strip() == '500' else 1)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=ENV, timeout=10).returncode == 0


def test_descendants_of_a_gone_process_is_empty():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=10)
    assert proctree.descendants(proc.pid) == []


def test_pidfd_exited_takes_descriptors_past_1024() -> None:
    # Given a child's pidfd numbered past select()'s limit (a runner of a few hundred
    # workers holds such descriptors)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    fd = os.pidfd_open(child.pid)
    high = os.dup2(fd, 1500)
    os.close(fd)
    try:
        # Then it says whether the process has exited, before and after it does
        assert proctree.pidfd_exited(high) is False
        assert child.stdin is not None
        child.stdin.close()
        assert proctree.pidfd_exited(high, 10) is True
    finally:
        os.close(high)
        child.kill()
        child.wait()
