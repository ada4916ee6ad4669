"""Helpers for the CLI tests that start real processes (imported by the test modules)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

RENDERCTL = [sys.executable, "-m", "renderctl.cli.app"]
T = TypeVar("T")

JOBS_MODULE = '''
import os, sys, time
from pathlib import Path


def write(inputs, output, params):
    Path(output).write_bytes(b"x")


def fail(inputs, output, params):
    sys.stderr.write("about to fail: " + params.get("why", "no reason") + "\\n")
    sys.stderr.flush()
    raise RuntimeError(params.get("why", "this job always fails"))


def sleep(inputs, output, params):
    time.sleep(float(params["s"]))
    Path(output).write_bytes(b"x")
'''


def env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child renderctl: no stray RENDERCTL_* settings, no colour."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("RENDERCTL_")}
    e.update({"NO_COLOR": "1", "COLUMNS": "120"})
    e.update(extra or {})
    return e


def write_jobs(folder: Path, jobs: list[dict[str, Any]]) -> Path:
    """A manifest of python-kind jobs in ``folder``, with ``jobsmod.py`` beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "jobsmod.py").write_text(JOBS_MODULE)
    lines = []
    for j in jobs:
        lines.append("[[jobs]]")
        params = j.pop("params", None)
        for k, v in j.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
        if params:
            inner = ", ".join(f'{k} = "{v}"' for k, v in params.items())
            lines.append(f"params = {{ {inner} }}")
    path = folder / "jobs.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def job(job_id: str, fn: str, **extra: Any) -> dict[str, Any]:
    return {"id": job_id, "kind": "python", "callable": f"jobsmod:{fn}",
            "output": f"{job_id}.bin", **extra}


def cli(*args: Any, cwd: Path, extra_env: Mapping[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RENDERCTL, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env(extra_env), timeout=timeout)


def poll(fn: Callable[[], T | None], *, timeout_s: float = 20, what: str = "") -> T:
    """Call ``fn`` until it returns something truthy, or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or fn}")
        time.sleep(0.02)


def one_line_usage_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 with a single stderr line holding every needle (never a traceback)."""
    stderr = res.stderr
    assert res.returncode == 2, (res.returncode, res.stdout, stderr)
    assert "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP), as /proc says."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False
