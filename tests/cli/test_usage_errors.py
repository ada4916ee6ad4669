"""Bad options, variables and ids: one line naming the culprit, exit 2, nothing changed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from clihelp import cli, job, write_jobs

from renderctl import guards


def one_line_usage_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2 with a single stderr line holding every needle (never a traceback)."""
    stderr = res.stderr
    assert res.returncode == 2, (res.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    for needle in needles:
        assert needle in stderr, (needle, stderr)


def nothing_enqueued(queue: Path) -> bool:
    return not (queue / "pending").exists() or not any((queue / "pending").iterdir())


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_jobs(tmp_path / "m", [job("j1", "write")])


# -- C1: the memory guard ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env"])
def test_an_unknown_memory_guard_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                  how: str) -> None:
    q = tmp_path / "q"
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]
    if how == "option":
        res = cli(*args, "--memory-guard", "bogus", cwd=tmp_path)
        label = "--memory-guard"
    else:
        res = cli(*args, cwd=tmp_path, extra_env={"RENDERCTL_MEMORY_GUARD": "bogus"})
        label = "RENDERCTL_MEMORY_GUARD"
    one_line_usage_error(res, label, "'bogus'", "auto, cgroup-v1, cgroup-v2 or sampling")
    assert nothing_enqueued(q)


def _missing_guard() -> str | None:
    for name in ("cgroup-v2", "cgroup-v1"):
        try:
            guards.require_memory_guard(name)
        except guards.GuardUnavailable:
            return name
    return None


def test_a_memory_guard_this_machine_lacks_is_a_usage_error(tmp_path: Path,
                                                            manifest: Path) -> None:
    missing = _missing_guard()
    if missing is None:
        pytest.skip("both cgroup guards work here")
    q = tmp_path / "q"
    res = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "--memory-guard",
              missing, cwd=tmp_path)
    one_line_usage_error(res, "--memory-guard", missing, "not usable here")
    assert nothing_enqueued(q)  # checked before the manifest was submitted
