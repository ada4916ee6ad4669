"""The example manifests in ``jobs/`` run as documented, end to end, through the real CLI.

``jobs/demo.toml`` (the README's demo) completes every job with a readable PDF, and
``jobs/faults.toml`` (the fault demo) shows each guard: invalid input, memory ceiling,
timeout and a crash recovered by a retry, next to an ordinary job that completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs"
CLI = [sys.executable, "-m", "renderctl.cli.app"]


def cli(*args: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh process, plain output, no RENDERCTL_* settings inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RENDERCTL_")}
    env["NO_COLOR"] = "1"
    return subprocess.run([*CLI, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def cli_json(*args: str | Path, cwd: Path) -> Any:
    proc = cli(*args, "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def manifest_jobs(name: str) -> list[dict[str, Any]]:
    """The manifest's jobs with their defaults applied (only what these tests need)."""
    doc = tomllib.loads((JOBS / name).read_text())
    defaults = doc.get("defaults", {})
    return [{**defaults, **job} for job in doc["jobs"]]


def job_inputs(job: dict[str, Any]) -> list[Path]:
    names = job["inputs"] if "inputs" in job else [job["input"]] if "input" in job else []
    return [(JOBS / n).resolve() for n in names]


def pages(path: Path) -> int:
    n = len(PdfReader(path).pages)
    assert n >= 1, f"{path}: no pages"
    return n


def run_manifest(name: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path,
                                                       Path]:
    queue, out = tmp_path / "q", tmp_path / "out"
    proc = cli("run", JOBS / name, "--queue", queue, "--out", out, "--backoff-base", "0.2",
               cwd=tmp_path)
    return proc, queue, out


def test_demo_manifest_completes_with_readable_pdfs(tmp_path: Path) -> None:
    proc, queue, out = run_manifest("demo.toml", tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    assert "\x1b[" not in proc.stdout, "NO_COLOR output must carry no ANSI codes"

    jobs = manifest_jobs("demo.toml")
    status = cli_json("status", "--queue", queue, cwd=tmp_path)
    assert status["done"] == len(jobs), status
    assert all(status[s] == 0 for s in ("pending", "running", "dead", "cancelled", "expired",
                                        "corrupt")), status

    for job in jobs:
        target = out / job["output"]
        if job["kind"] == "split":
            parts = sorted(target.glob("*.pdf"))
            assert parts, f"{job['id']}: no parts in {target}"
            assert sum(pages(p) for p in parts) == sum(pages(p) for p in job_inputs(job))
            continue
        assert target.is_file(), f"{job['id']}: {target} missing\n{log}"
        n = pages(target)
        if job["kind"] == "merge":
            assert n == sum(pages(p) for p in job_inputs(job)), job["id"]
        elif job["kind"] == "invoice":
            number = json.loads(job_inputs(job)[0].read_text())["number"]
            text = "".join(page.extract_text() for page in PdfReader(target).pages)
            assert number in text, f"{job['id']}: {number!r} not in its PDF"


def test_faults_manifest_shows_each_guard(tmp_path: Path) -> None:
    proc, queue, out = run_manifest("faults.toml", tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log  # some jobs were dead-lettered

    dead = {d["id"]: d for d in cli_json("dead", "list", "--queue", queue, cwd=tmp_path)}
    assert {k: (v["outcome"], v["attempts"]) for k, v in dead.items()} == {
        "broken-pdf": ("invalid_input", 1),  # max_attempts 3, yet no retry
        "hog": ("memory", 1),
        "hang": ("timeout", 1),
    }, log
    for job_id in dead:
        assert not (out / "faults" / f"{job_id}.pdf").exists()
    assert not (out / "faults" / "broken-stamped.pdf").exists()

    crash = cli_json("show", "crash-once", "--queue", queue, cwd=tmp_path)
    assert crash["state"] == "done", crash
    assert [a["outcome"] for a in crash["attempts"]] == ["crashed", "completed"], crash
    published = out / "faults" / "crash-once.pdf"
    assert pages(published) == 1
    assert "recovered on attempt 2" in PdfReader(published).pages[0].extract_text()

    inv = cli_json("show", "ordinary-invoice", "--queue", queue, cwd=tmp_path)
    assert inv["state"] == "done", inv
    assert [a["outcome"] for a in inv["attempts"]] == ["completed"], inv
    assert pages(out / "faults" / "ordinary-invoice.pdf") >= 1

    status = cli_json("status", "--queue", queue, cwd=tmp_path)
    assert (status["done"], status["dead"], status["pending"], status["running"]) == (2, 3, 0, 0)


@pytest.mark.parametrize("name", ["demo.toml", "faults.toml"])
def test_example_manifests_validate(name: str, tmp_path: Path) -> None:
    proc = cli("validate", JOBS / name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_example_manifests_validate_together() -> None:
    # README's first example, as typed there: `renderctl validate jobs/*.toml` from the repo.
    # Together they must not share a job id or an output path (run them into one queue).
    names = sorted(str(p.relative_to(REPO)) for p in JOBS.glob("*.toml"))
    assert len(names) >= 2, names
    proc = cli("validate", *names, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
