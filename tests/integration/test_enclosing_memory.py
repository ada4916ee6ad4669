"""A runner inside a memory cgroup with a limit of its own (a container's, a systemd slice's).

The machine's free memory says nothing of such a limit, and the kernel's OOM killer acts at
it: the default `--memory-budget` is taken from what the limit leaves, and a job killed there,
below its own ceiling, is charged as a crash with the cause named, not dead-lettered as
having crossed a ceiling it never reached (audit FI). Needs root and a writable cgroup v1
memory hierarchy (skipped elsewhere).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    cgroup_v1_writable,
    child_cgroup,
    py_job,
    run_in_cgroup,
    start_in_cgroup,
    wait_until,
)

from renderctl import guards

MB = 1024 * 1024

pytestmark = pytest.mark.skipif(not cgroup_v1_writable(),
                                reason="needs a writable cgroup v1 memory hierarchy")


@pytest.fixture
def limited_group() -> Iterator[Path]:
    """A memory cgroup beside the test's own, for a runner to be started in."""
    own = guards._own_cgroup_dir(True)
    assert own is not None
    with child_cgroup(own, "rctl-test-enclosing") as group:
        yield group


def run_in(group: Path, tmp_path: Path, jobs: list[dict[str, Any]],
           *args: str) -> tuple[int, list[dict[str, Any]]]:
    """`renderctl run --json` of ``jobs``, started inside ``group``: (exit code, events)."""
    res = run_in_cgroup(group, tmp_path, jobs, "--json", *args)
    return res.returncode, [json.loads(line) for line in res.stdout.splitlines()]


def test_the_default_budget_is_what_the_enclosing_limit_leaves(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a memory cgroup of 512 MB (the machine has gigabytes free)
    (limited_group / "memory.limit_in_bytes").write_text(str(512 * MB))

    # When a runner started in it takes the default budget, for a job of the default
    # 400 MB ceiling
    code, events = run_in(limited_group, tmp_path, [py_job("default", "write_pdf")])

    # Then its budget is what the limit leaves (it was 80% of the machine's free memory;
    # then, for a moment, 80% of the room, where no default job fitted: review FJ), and
    # the job runs
    started = next(e for e in events if e["event"] == "runner_started")
    assert 400 <= started["budget_mb"] <= 512, started
    assert code == 0, [e for e in events if e["event"] == "dead"]
    assert QueueView(tmp_path / "q").ids("done") == {"default"}


def test_a_job_the_enclosing_limit_cannot_hold_is_told_why(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a memory cgroup of 300 MB, and a job of the default 400 MB ceiling
    (limited_group / "memory.limit_in_bytes").write_text(str(300 * MB))
    code, events = run_in(limited_group, tmp_path, [py_job("big", "write_pdf")])

    # Then it is dead-lettered unrun, the reason naming the container's limit as what set
    # the budget (it named --memory-budget, which nobody had given)
    (dead,) = [e for e in events if e["event"] == "dead"]
    assert code == 1
    assert "can never fit the memory budget" in dead["reason"], dead
    assert "the limit of the memory cgroup renderctl runs in" in dead["reason"], dead


@contextlib.contextmanager
def memory_held(group: Path, mb: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process in ``group`` holding ``mb`` MB (touched) until it is killed."""
    hold = (f"import sys; b = bytearray({mb} << 20); b[::4096] = b'x' * len(b[::4096]); "
            "print('held', flush=True); sys.stdin.read()")
    hog = subprocess.Popen(
        ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$0" -c "$1"',
         sys.executable, hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert hog.stdout is not None and hog.stdout.readline() == b"held\n"
        yield hog
    finally:
        hog.kill()
        hog.wait()


def test_a_follow_runner_started_while_memory_was_held_measures_its_budget_again(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a --follow runner started in a memory cgroup of 900 MB while another process
    # (another runner's jobs, a build) held 550 MB of it: its default budget under 400 MB
    (limited_group / "memory.limit_in_bytes").write_text(str(900 * MB))
    with memory_held(limited_group, 550):
        first = {**py_job("first", "write_pdf"), "memory_mb": 100}
        run = start_in_cgroup(limited_group, tmp_path, [first], "--json", "--follow")
        assert run.stdout is not None
        started = json.loads(run.stdout.readline())
    assert started["event"] == "runner_started" and started["budget_mb"] < 400, started
    try:
        # When, the memory freed, a job of the default 400 MB ceiling is submitted
        view = QueueView(tmp_path / "q")
        wait_until(lambda: view.ids("done") == {"first"}, what="the first job")
        (tmp_path / "big.json").write_text(json.dumps({"jobs": [py_job("big", "write_pdf")]}))
        sub = subprocess.run([*RENDERCTL, "submit", "big.json", "--queue", str(tmp_path / "q"),
                              "--out", str(tmp_path / "out")], cwd=tmp_path, text=True,
                             capture_output=True, timeout=60)
        assert sub.returncode == 0, sub.stderr

        # Then it runs: the budget was measured again, as a runner started now would (it
        # was dead-lettered as one that can never fit the budget measured at the start,
        # however long ago that memory was freed: audit FQ), and status shows the new one
        ended = wait_until(lambda: next((s for s in ("done", "dead") if "big" in view.ids(s)),
                                        None), what="the big job's end")
        assert ended == "done", view.record("dead", "big")
        status = json.loads(subprocess.run(
            [*RENDERCTL, "status", "--json", "--queue", str(tmp_path / "q")],
            capture_output=True, text=True, timeout=60).stdout)
        assert status["runner"]["budget_mb"] >= 400, status["runner"]
    finally:
        run.terminate()
        run.communicate(timeout=60)


def test_a_job_killed_for_the_enclosing_limit_is_a_crash_not_its_ceiling(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a runner in a memory cgroup of 160 MB, told a budget the limit cannot honour,
    # and two jobs of 120 MB each, far under their 400 MB ceilings, at once
    (limited_group / "memory.limit_in_bytes").write_text(str(160 * MB))
    jobs = [{**py_job(f"big{i}", "allocate", mb=120, hold_s=3), "memory_mb": 400,
             "max_attempts": 1} for i in range(2)]
    code, events = run_in(limited_group, tmp_path, jobs, "--workers", "2",
                          "--memory-budget", "2000")

    # Then the kernel killed at least one, and each it killed is dead as a crash whose
    # error names the out-of-memory killer below the ceiling (it was "crossed its memory
    # ceiling of 400 MB; peak 120 MB")
    dead = [e for e in events if e["event"] == "dead"]
    assert dead and code == 1, events
    for e in dead:
        assert e["outcome"] == "crashed", e
        assert "out-of-memory killer" in e["error"] and "below its 400 MB ceiling" in \
            e["error"], e
    records = [json.loads(p.read_text()) for p in (tmp_path / "q" / "dead").glob("*.json")]
    assert {r["attempts"][-1]["outcome"] for r in records} == {"crashed"}


def test_page_cache_read_twice_in_the_limit_still_counts_as_room(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a memory cgroup of 600 MB, 300 MB of it a file's page cache, read twice (the
    # kernel's active list, which it reclaims as readily when it must)
    (limited_group / "memory.limit_in_bytes").write_text(str(600 * MB))
    data = tmp_path / "cached.bin"
    procs = str(limited_group / "cgroup.procs")
    script = (f"echo $$ > {procs}; head -c {300 * MB} /dev/zero > {data}; sync; "
              f"cat {data} > /dev/null; cat {data} > /dev/null")
    subprocess.run(["sh", "-c", script], check=True, timeout=120)
    stat = dict(line.split() for line in (limited_group / "memory.stat").read_text()
                .splitlines())
    assert int(stat["total_active_file"]) > 100 * MB, stat  # (the premise)

    # When a runner started there takes the default budget, for a default 400 MB job
    code, events = run_in(limited_group, tmp_path, [py_job("default", "write_pdf")])

    # Then the cache counted as room: the job ran (with the inactive list alone counted,
    # the budget fell under 300 MB and the job was dead-lettered unrun: review FJ)
    started = next(e for e in events if e["event"] == "runner_started")
    assert started["budget_mb"] >= 400, started
    assert code == 0


def test_a_cgroup_namespace_made_after_the_mount_gets_no_slots_outside_the_container(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a "container": a memory cgroup of 512 MB, and a cgroup namespace entered in it
    # without mounting the hierarchy anew (/proc/self/cgroup says "/", the mount's root
    # is "/../..": our cgroup is below it by names the namespace does not show)
    (limited_group / "memory.limit_in_bytes").write_text(str(512 * MB))
    mount = guards._mount_point("cgroup", "memory")
    assert mount is not None
    before = {p.name for p in mount[0].iterdir()}

    # When a runner runs a job in it
    res = run_in_cgroup(limited_group, tmp_path, [py_job("j", "write_pdf")], "--json",
                        wrapper=["unshare", "--cgroup", "--fork"])

    # Then it does not take the hierarchy's root for its own cgroup (its slots were made
    # there, outside the container's limit, shared by every such container: audit FK):
    # it samples instead, and the job completes
    events = [json.loads(line) for line in res.stdout.splitlines()]
    started = next(e for e in events if e["event"] == "runner_started")
    assert started["guard"] == "sampling", started
    assert res.returncode == 0, res.stderr
    assert {p.name for p in mount[0].iterdir()} - before == set()


def test_a_cgroup_namespace_with_its_own_mount_of_the_hierarchy_keeps_the_guard(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a "container" that mounts the memory hierarchy anew inside its cgroup namespace
    # (the copied host mount, rooted above the namespace, is still listed before it)
    (limited_group / "memory.limit_in_bytes").write_text(str(512 * MB))
    script = ("mount -t tmpfs rctl-test /sys/fs/cgroup && mkdir /sys/fs/cgroup/memory && "
              "mount -t cgroup -o memory rctl-test-memory /sys/fs/cgroup/memory && "
              'exec "$@"')
    res = run_in_cgroup(limited_group, tmp_path, [py_job("j", "write_pdf")], "--json",
                        wrapper=["unshare", "--cgroup", "--mount", "--fork", "sh", "-c",
                                 script, "sh"])

    # Then the runner finds its own cgroup through the namespace's mount: the cgroup guard,
    # the container's budget (review FL: the first, host's, mount listed made it sample,
    # with the machine's memory as its budget), and the job completes
    events = [json.loads(line) for line in res.stdout.splitlines()]
    started = next(e for e in events if e["event"] == "runner_started")
    assert started["guard"] == "cgroup-v1", started
    assert started["budget_mb"] <= 512, started
    assert res.returncode == 0, res.stderr


def test_a_bind_mount_of_another_cgroup_is_not_taken_for_the_hierarchy(
        tmp_path: Path, limited_group: Path) -> None:
    # Given a runner's cgroup of 512 MB, and another cgroup of 100 MB bind-mounted
    # elsewhere (listed in mountinfo after the hierarchy's own mount)
    (limited_group / "memory.limit_in_bytes").write_text(str(512 * MB))
    with child_cgroup(limited_group.parent, "rctl-test-other") as other:
        (other / "memory.limit_in_bytes").write_text(str(100 * MB))
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        script = f'mount --bind {other} {mnt} && exec "$@"'

        # When a runner runs a job
        res = run_in_cgroup(limited_group, tmp_path, [py_job("j", "write_pdf")], "--json",
                            wrapper=["unshare", "--mount", "--propagation", "private",
                                     "sh", "-c", script, "sh"])

    # Then its slots and budget are its own cgroup's (review FM: that other cgroup's,
    # 100 MB: the default job was dead-lettered unrun)
    events = [json.loads(line) for line in res.stdout.splitlines()]
    started = next(e for e in events if e["event"] == "runner_started")
    assert started["guard"] == "cgroup-v1" and 400 <= started["budget_mb"] <= 512, started
    assert res.returncode == 0, res.stderr
