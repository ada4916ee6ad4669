"""Memory guards with real cgroups, real allocations and real kills."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from guardfns import ALLOC_ARGS, ALLOC_LOOP

from renderctl import guards, proctree

MB = 1024 * 1024
LIMIT = 300 * MB

# Waits for a line on stdin (so the test can adopt it into a cgroup first), then allocates
# argv[1] MB in 10 MB chunks touching every page, at most argv[2] MB/s (0: flat out).
ALLOCATOR = ALLOC_ARGS + """
print("ready", flush=True)
sys.stdin.readline()
""" + ALLOC_LOOP + """
print("done", flush=True)
sys.stdin.readline()
"""

# A worker-like parent that runs the allocator as its child and reports the child's fate.
PARENT_OF_ALLOCATOR = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print("child-exit", child.wait(), flush=True)
sys.stdin.readline()
"""


def start_allocator(total_mb: int, rate_mb_s: float = 0, *, parent: bool = False):
    """Start an allocator (optionally under a worker-like parent) in its own group."""
    argv = [sys.executable, "-c", ALLOCATOR, str(total_mb), str(rate_mb_s)]
    if parent:
        argv = [sys.executable, "-c", PARENT_OF_ALLOCATOR, ALLOCATOR, str(total_mb), str(rate_mb_s)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, process_group=0
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def go(proc: subprocess.Popen) -> None:
    proc.stdin.write("\n")
    proc.stdin.flush()


@pytest.fixture
def cgroup_guard():
    try:
        guard = guards.detect_memory_guard(prefer="cgroup-v1")
    except guards.GuardUnavailable as e:
        pytest.skip(f"no writable cgroup v1 memory hierarchy: {e}")
    yield guard
    guard.close()
    assert not guard.parent_dir.exists()


@pytest.fixture
def procs():
    """Processes started by a test; their groups are killed at teardown whatever happened."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        proctree.kill_group(p.pid, signal.SIGKILL)
        p.wait(timeout=10)


def test_detect_prefers_a_cgroup_and_sampling_is_always_available(cgroup_guard):
    assert guards.detect_memory_guard().name in ("cgroup-v1", "cgroup-v2")
    assert guards.detect_memory_guard(prefer="sampling").name == "sampling"
    with pytest.raises(ValueError):
        guards.detect_memory_guard(prefer="rlimit")


def test_kernel_kills_at_the_limit_and_spares_the_neighbour(cgroup_guard, procs):
    # Given two slots: one job heading for 2 GB, one neighbour needing 100 MB
    hog_slot, calm_slot = cgroup_guard.open_slot("w0"), cgroup_guard.open_slot("w1")
    hog, calm = start_allocator(2000), start_allocator(100)
    procs += [hog, calm]
    for slot, p in ((hog_slot, hog), (calm_slot, calm)):
        slot.adopt(p.pid)
        assert slot.pids() == [p.pid]
        guards.set_job_limit(slot.path, LIMIT)
    hog_mark, calm_mark = hog_slot.mark(), calm_slot.mark()
    assert hog_mark.oom_kills is not None, "kernel without memory.oom_control oom_kill"
    # When both run
    go(hog)
    go(calm)
    # Then the kernel SIGKILLs the hog at the limit, and the runner can tell it was the OOM
    assert hog.wait(timeout=20) == -signal.SIGKILL
    assert hog_slot.oom_killed_since(hog_mark)
    peak = hog_slot.peak_bytes()
    assert peak is not None and LIMIT - 20 * MB <= peak <= LIMIT + 1 * MB
    # And the neighbour finished its work untouched
    assert calm.stdout.readline().strip() == "done"
    go(calm)
    assert calm.wait(timeout=10) == 0
    assert not calm_slot.oom_killed_since(calm_mark)
    assert calm_slot.peak_bytes() < LIMIT


def test_v1_kills_one_task_so_the_runner_must_kill_the_group(cgroup_guard, procs):
    # Given a worker-like parent whose child allocates past the slot's limit
    slot = cgroup_guard.open_slot("w0")
    tree = start_allocator(2000, parent=True)
    procs.append(tree)
    for pid in proctree.group_members(tree.pid):  # the child already waits for "go"
        slot.adopt(pid)
    guards.set_job_limit(slot.path, LIMIT)
    mark = slot.mark()
    go(tree)
    # Then only the child (the largest task) is killed; the parent lives on
    assert tree.stdout.readline().split() == ["child-exit", str(-signal.SIGKILL)]
    assert slot.oom_killed_since(mark)
    assert slot.pids() == [tree.pid]
    # And the group kill finishes the job's tree
    assert proctree.stop_group(tree.pid, grace_s=0.5).survivors == ()
    tree.wait(timeout=5)
    assert slot.pids() == []


def test_lowering_below_usage_raises_and_keeps_the_old_limit(cgroup_guard, procs):
    slot = cgroup_guard.open_slot("w0")
    job = start_allocator(100)
    procs.append(job)
    slot.adopt(job.pid)
    guards.set_job_limit(slot.path, LIMIT)
    go(job)
    assert job.stdout.readline().strip() == "done"
    with pytest.raises(guards.LimitBelowUsage) as info:
        guards.set_job_limit(slot.path, 50 * MB)
    assert info.value.usage_bytes is not None and info.value.usage_bytes > 50 * MB
    assert int(Path(slot.path, "memory.limit_in_bytes").read_text()) == LIMIT
    # Closing a slot kills what is still inside it.
    slot.close()
    assert job.wait(timeout=10) == -signal.SIGKILL
    assert not Path(slot.path).exists()


@pytest.mark.parametrize("limits_mb", [(300, 500, 200)])
def test_memsw_follows_the_limit_up_and_down(cgroup_guard, limits_mb):
    slot = cgroup_guard.open_slot("w0")
    memsw = Path(slot.path, "memory.memsw.limit_in_bytes")
    for mb in limits_mb:
        guards.set_job_limit(slot.path, mb * MB)
        assert int(Path(slot.path, "memory.limit_in_bytes").read_text()) == mb * MB
        if memsw.exists():
            assert int(memsw.read_text()) == mb * MB


def test_cleanup_stale_removes_a_dead_runners_cgroups_and_kills_leftovers(cgroup_guard, procs):
    # Given the cgroups of a runner that died, with an orphaned job still inside. The runner
    # is a real process, alive while its folders are set up: every runner's start-up removes
    # dead runners' cgroups, and a test running alongside once took this one's between
    # open_slot and adopt. Killed and reaped before the cleanup: its pid is not reused
    # that fast (pids are handed out in order), and a reused pid keeps its folders by design.
    runner = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                              stdin=subprocess.PIPE, start_new_session=True)
    procs.append(runner)
    stale = guards.CgroupGuard(cgroup_guard.own_dir, cgroup_guard.v1, runner.pid,
                               cgroup_guard.own_pids_dir)
    orphan = start_allocator(10)
    procs.append(orphan)
    slot = stale.open_slot("w3")
    slot.adopt(orphan.pid)
    runner.kill()
    assert runner.wait(timeout=10) == -signal.SIGKILL
    # When a new runner cleans up
    removed = cgroup_guard.cleanup_stale()
    # Then the orphan is dead and the directories are gone (its pids cgroup too, where the
    # task limit is: one was left per dead runner). Gone, whoever removed them: every
    # runner cleans up dead runners' cgroups as it starts, and one a test running alongside
    # starts may take some of them first; run alone, only this cleanup can.
    assert not stale.parent_dir.exists(), removed
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    if stale.pids_parent_dir is not None:
        assert slot.pids_dir is not None
        assert not stale.pids_parent_dir.exists(), removed


CLEANUP = """
import sys
from renderctl import guards
g = guards.detect_memory_guard(prefer="cgroup-v1")
sys.stdin.readline()
g.cleanup_stale()
"""


def test_runners_starting_together_clean_the_same_dead_runners_without_failing(cgroup_guard,
                                                                               procs):
    # Given many dead runners' folders, each with a slot (runners on two queues of one
    # machine start together and both clean them: one removed a folder while the other read
    # it, and the reader raised ENODEV, skipping every dead runner after that one).
    stale = []
    for _ in range(3):
        placeholders = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                         stdin=subprocess.PIPE, start_new_session=True)
                        for _ in range(15)]
        procs.extend(placeholders)
        for runner in placeholders:
            guard = guards.CgroupGuard(cgroup_guard.own_dir, cgroup_guard.v1, runner.pid,
                                       cgroup_guard.own_pids_dir)
            for n in range(4):
                guard.open_slot(f"w{n}")
            stale.append(guard)
            runner.kill()
            runner.wait(timeout=10)
        # When two cleanups start at the same moment (a line on stdin releases both)
        cleaners = [subprocess.Popen([sys.executable, "-c", CLEANUP], stdin=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
                    for _ in range(2)]
        procs.extend(cleaners)
        for c in cleaners:
            assert c.stdin is not None
            c.stdin.write("go\n")
        for c in cleaners:
            assert c.stdin is not None
            c.stdin.flush()
        # Then neither fails, and every dead runner's folders are gone
        for c in cleaners:
            _, err = c.communicate(timeout=60)
            assert c.returncode == 0, err
        assert [g.parent_dir for g in stale if g.parent_dir.exists()] == []


def test_sampling_slot_is_a_no_op():
    guard = guards.detect_memory_guard(prefer="sampling")
    slot = guard.open_slot("w0")
    guards.set_job_limit(slot.path, LIMIT)  # must not touch anything
    assert not slot.oom_killed_since(slot.mark())
    assert guard.cleanup_stale() == []


@pytest.mark.parametrize("rate_mb_s", [500])
def test_sampler_catches_a_grandchild_crossing_the_ceiling(procs, rate_mb_s):
    # Given a worker-like parent whose child allocates towards 2 GB at a known rate
    interval_s = 0.05
    tree = start_allocator(2000, rate_mb_s, parent=True)
    procs.append(tree)
    sampler = guards.TreeSampler(tree.pid, LIMIT)
    go(tree)
    # When the runner samples every 50 ms (waiting on the tree's exit, never a bare sleep)
    pidfd = os.pidfd_open(tree.pid)
    last_under = time.monotonic()  # when the last sample that found it under began
    deadline = last_under + 15
    try:
        while time.monotonic() < deadline:
            began = time.monotonic()
            sample = sampler.sample()
            if sample.exceeded:
                gap = time.monotonic() - last_under
                proctree.kill_group(tree.pid, signal.SIGKILL)
                break
            last_under = began
            assert not select.select([pidfd], [], [], interval_s)[0], "tree exited by itself"
    finally:
        os.close(pidfd)
    # Then it saw both processes, confirmed with USS, and killed at the first sample past
    # the ceiling: its peak is at most what the tree can allocate between two samples (one
    # 50 ms interval on a quiet machine; the measured gap, so a busy CI's late wake-up is
    # not the sampler's fault), plus one 10 MB chunk and the interpreters' own
    assert sample.exceeded and sample.processes == 2
    assert sample.uss_bytes is not None and sample.uss_bytes > LIMIT
    between_samples = rate_mb_s * MB * gap
    print(f"\n[sampler] gap between the last two samples {gap * 1000:.0f} ms, peak "
          f"{sampler.peak_bytes / MB:.0f} MB")
    assert LIMIT < sampler.peak_bytes <= LIMIT + between_samples + 10 * MB + 20 * MB
    assert tree.wait(timeout=10) == -signal.SIGKILL
