"""`run` under scarce operating-system limits: said up front, or raised within what is allowed.

Audit FI: under `ulimit -n 32`, `run --workers 4` failed at a worker's start with "I/O error:
Too many open files" (exit 74, naming neither the limit nor a file), its claimed jobs left
for the next run's recovery.
"""

from __future__ import annotations

import errno
import json
import resource
import subprocess
from pathlib import Path

from jobfns import RENDERCTL, QueueView, py_job, stage

from renderctl.errors import os_error_message


def run_limited(tmp_path: Path, soft: int, hard: int,
                *args: str) -> subprocess.CompletedProcess[str]:
    stage(tmp_path)
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"jobs": [py_job(f"j{i}", "write_pdf") for i in range(6)]}))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return subprocess.run([*RENDERCTL, "run", str(manifest), "--queue", str(tmp_path / "q"),
                           "--out", str(tmp_path / "out"), "--quiet", *args],
                          preexec_fn=limit, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_workers_the_hard_open_files_limit_cannot_carry_are_a_usage_error(
        tmp_path: Path) -> None:
    # When `run --workers 4` starts where at most 48 files may be open
    res = run_limited(tmp_path, 48, 48, "--workers", "4")

    # Then it exits 2 before enqueuing anything, naming the limit and what fits
    assert res.returncode == 2, res.stderr
    assert "64 open files" in res.stderr and "hard limit 48" in res.stderr
    assert "at most 2 worker(s)" in res.stderr, res.stderr
    assert QueueView(tmp_path / "q").all_ids() == set()


def test_a_low_soft_open_files_limit_is_raised_within_the_hard_one(tmp_path: Path) -> None:
    # When `run --workers 4` starts under a soft limit of 24, the hard one higher
    res = run_limited(tmp_path, 24, 4096, "--workers", "4")

    # Then the run raises its own soft limit and completes every job
    assert res.returncode == 0, res.stderr
    assert QueueView(tmp_path / "q").ids("done") == {f"j{i}" for i in range(6)}


def test_too_many_open_files_names_the_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    msg = os_error_message(OSError(errno.EMFILE, "Too many open files", "q/pending/x.json"))
    assert msg.startswith("I/O error (q/pending/x.json): Too many open files")
    assert f"may have {soft} open at once" in msg and "ulimit -n" in msg
