"""Benchmark the queue: submit latency, bulk submit, claim rate vs depth, CLI start-up.

Run: ``python tests/bench/bench_queue.py [--keep]``. The queues live in a scratch folder under
the current directory (the real disk, never tmpfs: tmpfs hides the cost of fsync). Absolute
figures on this machine vary 5-20x run to run (MEASUREMENTS.md); each figure is printed next
to a baseline measured in the same run, and the ratio is the number to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from renderctl.fsutil import fsync_dir, write_file  # noqa: E402
from renderctl.lifecycle import State  # noqa: E402
from renderctl.manifest import jobs_from_dicts  # noqa: E402
from renderctl.policy import ClaimIndex  # noqa: E402
from renderctl.store import Holder, Queue, Transition  # noqa: E402

CLI = [sys.executable, "-m", "renderctl.cli.app"]
HOLDER = Holder("bench", "boot", os.getpid(), None)


def job(jid: str) -> dict[str, object]:
    # (A module found anywhere, never run: else every submit's advice says and logs that it
    # is not found, and pays a search of sys.path.)
    return {"id": jid, "kind": "python", "callable": "json:f", "output": f"o/{jid}.pdf"}


def warm(folder: Path, n: int = 3000) -> None:
    """File creation here is 10-25x slower after idle until a few thousand creates."""
    d = folder / "warm"
    d.mkdir(exist_ok=True)
    for i in range(n):
        p = d / str(i)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(p)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def line(name: str, value: str, target: str = "", verdict: bool | None = None) -> None:
    mark = "" if verdict is None else ("  [ok]" if verdict else "  [MISSED]")
    print(f"  {name:<44} {value:<30} {target}{mark}")


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_cli(args: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*CLI, *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


# -- 1. one-job submit latency -------------------------------------------------------------


def bench_submit_latency(root: Path, n: int = 300) -> None:
    print("one-job submit latency (Python API, Queue.submit of one dict)")
    q = Queue(root / "q-latency")
    base = root / "baseline-create"
    base.mkdir()
    warm(root)
    submits: list[float] = []
    creates: list[float] = []
    for i in range(n):
        submits.append(timed(lambda i=i: q.submit([job(f"s{i}")], base=root,
                                                   out_root=root / "out")))

        def durable_create(i: int = i) -> None:  # the floor: one durable new file
            tmp = base / f".t{i}"
            write_file(tmp, b"{}", fsync=True)
            os.rename(tmp, base / f"{i}.json")
            fsync_dir(base)

        creates.append(timed(durable_create))
    p50, p99 = pct(submits, 0.5), pct(submits, 0.99)
    line("submit p50", f"{p50 * 1e3:.2f} ms")
    line("submit p99", f"{p99 * 1e3:.2f} ms", "target <= 10 ms", p99 <= 0.010)
    line("baseline durable create p50 / p99",
         f"{pct(creates, 0.5) * 1e3:.2f} / {pct(creates, 0.99) * 1e3:.2f} ms")
    line("submit p50 / durable create p50", f"{p50 / pct(creates, 0.5):.1f}x")


# -- 2. a 20,000-job manifest through the CLI ----------------------------------------------


def bench_bulk_submit(root: Path, n: int = 20_000) -> None:
    print(f"{n}-job manifest via `renderctl submit` (whole process)")
    manifest = root / "bulk.json"
    manifest.write_text(json.dumps({"jobs": [job(f"b{i:06d}") for i in range(n)]}))
    one = root / "one.json"
    one.write_text(json.dumps({"jobs": [job("single")]}))
    warm(root)
    fixed = statistics.median(
        run_cli(["submit", "--queue", str(root / f"q-one-{i}"), str(one)]) for i in range(3))
    warm(root)
    elapsed = run_cli(["submit", "--queue", str(root / "q-bulk"), str(manifest)])
    rate = n / elapsed
    line("whole process", f"{elapsed:.2f} s")
    line("jobs/s", f"{rate:,.0f}", "target >= 5,000 jobs/s", rate >= 5000)
    line("baseline: a 1-job submit process", f"{fixed:.3f} s")
    line("jobs/s excluding the 1-job process time", f"{n / max(1e-9, elapsed - fixed):,.0f}")


# -- 3. claim rate at 100 vs 100,000 pending -----------------------------------------------


def fill(q: Queue, n: int, root: Path, prefix: str) -> None:
    specs = jobs_from_dicts([job(f"{prefix}{i:06d}") for i in range(n)], base=root,
                            out_root=root / "out")
    for start in range(0, n, 20_000):
        q.submit(specs[start:start + 20_000])


def claim_round(q: Queue, index: ClaimIndex, claims: int) -> float:
    """Time ``claims`` single-job claims; each claimed job goes back to pending (untimed)."""
    spent = 0.0
    for _ in range(claims):
        t0 = time.perf_counter()
        got, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=1, token_prefix="b")
        spent += time.perf_counter() - t0
        [c] = got
        back = replace(c.record, lease=None)
        q.finish([Transition(back, State.PENDING)])
        index.add(back.entry(), now=q.clock.wall())
    return spent


def bench_claim_rate(root: Path, claims: int = 500) -> Queue:
    print(f"claim rate, Queue.claim(limit=1) x {claims}, at 100 vs 100,000 pending")
    small, large = Queue(root / "q-100"), Queue(root / "q-100k")
    t_fill = timed(lambda: fill(small, 100, root, "s"))
    t_fill += timed(lambda: fill(large, 100_000, root, "l"))
    line("(setup) filling both queues", f"{t_fill:.1f} s")
    idx_small, idx_large = ClaimIndex(), ClaimIndex()
    t_small_load = timed(lambda: small.load_index(idx_small))
    t_large_load = timed(lambda: large.load_index(idx_large))
    line("load_index at 100 / 100k", f"{t_small_load * 1e3:.1f} ms / {t_large_load:.2f} s")
    warm(root)
    spent = {"100": 0.0, "100k": 0.0}
    for _ in range(claims // 50):  # interleaved batches: both see the same machine state
        spent["100"] += claim_round(small, idx_small, 50)
        spent["100k"] += claim_round(large, idx_large, 50)
    r100, r100k = claims / spent["100"], claims / spent["100k"]
    line("claims/s at 100 pending", f"{r100:,.0f}")
    line("claims/s at 100,000 pending", f"{r100k:,.0f}")
    line("ratio 100k / 100", f"{r100k / r100:.2f}", "target >= 0.80", r100k / r100 >= 0.8)
    return large


# -- 4. CLI start-up -------------------------------------------------------------------------


def bench_startup(large: Queue, runs: int = 10) -> None:
    n = large.count(State.PENDING)
    print(f"CLI start-up, median of {runs} (status on a queue with {n:,} pending)")
    bare = [timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
            for _ in range(runs)]
    helps = [run_cli(["--help"]) for _ in range(runs)]
    stats = [run_cli(["status", "--queue", str(large.path)]) for _ in range(runs)]
    b, h, s = (statistics.median(x) for x in (bare, helps, stats))
    line("baseline: python -c pass", f"{b:.3f} s")
    line("renderctl --help", f"{h:.3f} s ({h / b:.1f}x bare)", "target < 0.3 s", h < 0.3)
    line("renderctl status (100k pending)", f"{s:.3f} s ({s / b:.1f}x bare)", "target < 1 s",
         s < 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the scratch queues")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix=".bench-queue-", dir=os.getcwd()))
    fstype = subprocess.run(["stat", "-f", "-c", "%T", str(root)], capture_output=True,
                            text=True).stdout.strip()
    print(f"scratch folder {root} (file system: {fstype or 'unknown'})")
    if fstype == "tmpfs":
        print("  WARNING: tmpfs hides the cost of fsync; run from a folder on the real disk")
    try:
        bench_submit_latency(root)
        bench_bulk_submit(root)
        large = bench_claim_rate(root)
        bench_startup(large)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
