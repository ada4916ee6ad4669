"""End-to-end wall time of the README demo: `renderctl run jobs/demo.toml` vs a bare pool.

Run: ``python tests/bench/bench_demo.py [--runs 3]``

Each run is a whole fresh process on the real disk (a temporary folder under the repo,
removed afterwards) with a fresh queue and output root: ``renderctl run jobs/demo.toml
--workers 2``. The baseline does the same renders (kind -> renderer function from the
registry, inputs resolved relative to ``jobs/``) in ``ProcessPoolExecutor(2)``, also as a
whole fresh process, with nothing durable: no queue, no fsync, no output check, no publish.
Prints the median wall time and jobs/s of each, and the ratio (pool time / renderctl time:
renderctl's throughput relative to the pool).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs"
DEMO = JOBS / "demo.toml"


def demo_jobs() -> list[dict[str, Any]]:
    doc = tomllib.loads(DEMO.read_text())
    defaults = doc.get("defaults", {})
    return [{**defaults, **job} for job in doc["jobs"]]


def render_one(target: str, inputs: list[str], output: str, params: dict[str, Any],
               is_dir: bool) -> None:
    import importlib

    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        out.mkdir()
    fn([Path(p) for p in inputs], out, params)


def pool_child(out_root: Path) -> None:
    """The baseline: the demo's renders in ProcessPoolExecutor(2) (run in its own process)."""
    from renderctl.render.registry import all_specs

    specs = all_specs()
    with ProcessPoolExecutor(2) as pool:
        futures = []
        for job in demo_jobs():
            spec = specs[job["kind"]]
            names = job.get("inputs") or [job["input"]]
            inputs = [str((JOBS / n).resolve()) for n in names]
            futures.append(pool.submit(render_one, spec.target, inputs,
                                       str(out_root / job["output"]),
                                       dict(job.get("params", {})), spec.output == "dir"))
        for f in futures:
            f.result()


def renderctl_cmd() -> list[str]:
    exe = shutil.which("renderctl")
    return [exe] if exe else [sys.executable, "-m", "renderctl.cli.app"]


def timed(argv: list[str], cwd: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RENDERCTL_")}
    env["NO_COLOR"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} exited {proc.returncode}:\n{proc.stderr}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pool-child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pool_child:
        pool_child(args.pool_child)
        return

    n_jobs = len(demo_jobs())
    rc_times: list[float] = []
    pool_times: list[float] = []
    base = Path(tempfile.mkdtemp(prefix=".bench-demo-", dir=REPO))
    try:
        for i in range(args.runs):  # alternate the two sides so drift hits both alike
            run = base / f"run{i}"
            run.mkdir()
            rc_times.append(timed([*renderctl_cmd(), "run", str(DEMO), "--queue",
                                   str(run / "q"), "--out", str(run / "out"), "--workers", "2"],
                                  cwd=run))
            pool_times.append(timed([sys.executable, __file__, "--pool-child",
                                     str(run / "pool-out")], cwd=run))
            print(f"run {i + 1}: renderctl {rc_times[-1]:.3f}s, pool {pool_times[-1]:.3f}s",
                  flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    rc, pool = statistics.median(rc_times), statistics.median(pool_times)
    print(f"demo: {n_jobs} jobs, {args.runs} runs, whole process, median wall time")
    print(f"  renderctl run --workers 2 : {rc:.3f}s  {n_jobs / rc:6.1f} jobs/s")
    print(f"  ProcessPoolExecutor(2)    : {pool:.3f}s  {n_jobs / pool:6.1f} jobs/s")
    print(f"  ratio pool/renderctl      : {pool / rc:.2f}")


if __name__ == "__main__":
    main()
