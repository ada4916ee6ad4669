"""Time and peak memory of each renderer on the sample inputs (a plain script, not pytest).

Each case runs in a fresh interpreter (so peak RSS is that renderer's alone, as in a worker):
import, ``harden()``, one cold call, then N timed warm calls. Regenerate the inputs first
with ``python scripts/make_samples.py`` if ``sample-inputs/`` is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample-inputs"

# name -> (target, inputs relative to sample-inputs, params, output is a folder)
CASES: dict[str, tuple[str, list[str], dict[str, Any], bool]] = {
    "invoice (1 page)": ("renderctl.render.invoice:render", ["invoices/0001.json"], {}, False),
    "invoice (120 items)": ("renderctl.render.invoice:render", ["invoices/0023.json"], {}, False),
    "report (200 rows, chart)": (
        "renderctl.render.report:render",
        ["reports/sales.csv"],
        {"title": "Sales", "sort_by": "revenue", "descending": True, "chart": "revenue"},
        False,
    ),
    "merge (2+3 pages)": ("renderctl.render.pdfops:merge", ["pdf/a.pdf", "pdf/b.pdf"], {}, False),
    "stamp (2 pages)": ("renderctl.render.pdfops:stamp", ["pdf/a.pdf"], {"text": "DRAFT"}, False),
    "split (3 parts)": ("renderctl.render.pdfops:split", ["pdf/b.pdf"], {}, True),
}


def run_case(name: str, runs: int) -> dict[str, float]:
    """In this process: time one cold and ``runs`` warm calls of a case; report peak RSS."""
    import importlib

    from renderctl.render import safety

    target, inputs, params, is_dir = CASES[name]
    started = time.perf_counter()
    module_name, _, attr = target.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    safety.harden()
    import_ms = (time.perf_counter() - started) * 1000
    paths = [SAMPLES / p for p in inputs]
    timings: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs + 1):
            out = Path(tmp) / f"out-{i}"
            if is_dir:
                out.mkdir()
            else:
                out = out.with_suffix(".pdf")
            t0 = time.perf_counter()
            fn(paths, out, params)
            timings.append((time.perf_counter() - t0) * 1000)
            if is_dir:
                shutil.rmtree(out)
            else:
                out.unlink()
    cold, warm = timings[0], sorted(timings[1:])
    return {
        "import_ms": import_ms,
        "cold_ms": cold,
        "median_ms": statistics.median(warm),
        "p90_ms": warm[min(len(warm) - 1, int(len(warm) * 0.9))],
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    """Run every case in its own subprocess and print a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=50, help="warm calls per case")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.runs)))
        return
    if not SAMPLES.is_dir():
        sys.exit("sample-inputs/ is missing: run python scripts/make_samples.py first")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    header = f"{'renderer':<26}{'import':>9}{'cold':>9}{'median':>9}{'p90':>9}{'peak RSS':>11}"
    print(f"{args.runs} warm runs per case, one fresh process per case; times in ms")
    print(header)
    print("-" * len(header))
    for name in CASES:
        proc = subprocess.run(
            [sys.executable, __file__, "--case", name, "--runs", str(args.runs)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        r = json.loads(proc.stdout)
        print(
            f"{name:<26}{r['import_ms']:>9.1f}{r['cold_ms']:>9.1f}{r['median_ms']:>9.2f}"
            f"{r['p90_ms']:>9.2f}{r['peak_rss_mb']:>9.1f} MB"
        )


if __name__ == "__main__":
    main()
