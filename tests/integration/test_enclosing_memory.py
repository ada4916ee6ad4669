"""A runner inside a memory cgroup with a limit of its own (a container's, a systemd slice's).

The machine's free memory says nothing of such a limit, and the kernel's OOM killer acts at
it: the default `--memory-budget` is taken from what the limit leaves, and a job killed there,
below its own ceiling, is charged as a crash with the cause named, not dead-lettered as
having crossed a ceiling it never reached (audit FI). Needs root and a writable cgroup v1
memory hierarchy (skipped elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import QueueView, cgroup_v1_writable, child_cgroup, py_job, run_in_cgroup

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
    # Given a memory cgroup of 300 MB (the machine has gigabytes free)
    (limited_group / "memory.limit_in_bytes").write_text(str(300 * MB))

    # When a runner started in it takes the default budget
    code, events = run_in(limited_group, tmp_path,
                          [{**py_job("small", "write_pdf"), "memory_mb": 100}])

    # Then its budget is under what the limit allows (it was 80% of the machine's free
    # memory), and the job still runs
    started = next(e for e in events if e["event"] == "runner_started")
    assert 0 < started["budget_mb"] <= 300 * 0.8, started
    assert code == 0, [e for e in events if e["event"] == "dead"]
    assert QueueView(tmp_path / "q").ids("done") == {"small"}


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
