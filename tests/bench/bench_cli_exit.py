"""What a script waits for around one short command: start to exit, and after `run`'s summary.

Run: ``python tests/bench/bench_cli_exit.py [--runs 10]``

Whole fresh processes, alternating, on the real disk. For `renderctl --help`, `status` and
a one-job `run`, the median time from start until the process has exited and its stdout
(a pipe, as for `$(renderctl ...)`, `| jq` or a CI step) has reached end of file; for
`run`, also how long after its summary line the process exits and the pipe closes (the
fork server, which holds the pipe too, must be gone). Baseline in the same run: the same
one-byte job through ``ProcessPoolExecutor(2)`` in a fresh process, start to end of file,
and a bare interpreter (``python -c pass``).
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RENDERCTL = [sys.executable, "-m", "renderctl"]  # as the `renderctl` script runs it
BENCHFNS = '''
from pathlib import Path


def write_byte(inputs, output, params):
    Path(output).write_bytes(b"x")
'''
POOL = '''
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
sys.path.insert(0, {base!r})
import benchfns

if __name__ == "__main__":
    with ProcessPoolExecutor(2) as ex:
        ex.submit(benchfns.write_byte, [], Path({out!r}), {{}}).result()
'''


def timed(cmd: list[str], cwd: Path, marker: bytes | None = None
          ) -> tuple[float, float | None, float | None]:
    """(start to EOF, marker line to exit, marker line to EOF) in seconds."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert p.stdout is not None
    seen = None
    for line in p.stdout:
        if marker is not None and seen is None and line.startswith(marker):
            seen = time.perf_counter()
            break
    p.wait()
    exited = time.perf_counter()
    p.stdout.read()
    eof = time.perf_counter()
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    if seen is None:
        return eof - t0, None, None
    return eof - t0, exited - seen, eof - seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-exit-", dir=REPO))
    try:
        (base / "benchfns.py").write_text(BENCHFNS)
        (base / "one.toml").write_text(
            '[[jobs]]\nid = "one"\nkind = "python"\ncallable = "benchfns:write_byte"\n'
            'output = "one.bin"\n')
        (base / "pool.py").write_text(POOL.format(base=str(base), out=str(base / "p.bin")))
        rows: dict[str, list[tuple[float, float | None, float | None]]] = {}
        for i in range(args.runs):
            cases = {
                "python -c pass": ([sys.executable, "-c", "pass"], None),
                "pool, one job": ([sys.executable, str(base / "pool.py")], None),
                "renderctl run, one job": ([*RENDERCTL, "run", "one.toml", "--queue",
                                            f"q{i}", "--out", f"o{i}"], b"summary:"),
                "renderctl --help": ([*RENDERCTL, "--help"], None),
                "renderctl status": ([*RENDERCTL, "status", "--queue", f"q{i}"], None),
            }
            for name, (cmd, marker) in cases.items():
                rows.setdefault(name, []).append(timed(cmd, base, marker))
        for name, got in rows.items():
            total = statistics.median(r[0] for r in got)
            line = f"{name:24} start to EOF: median {total * 1000:6.0f} ms"
            if got[0][1] is not None:
                after_exit = statistics.median(r[1] or 0.0 for r in got)
                after_eof = statistics.median(r[2] or 0.0 for r in got)
                line += (f"  (after the summary: exit {after_exit * 1000:.0f} ms, "
                         f"stdout EOF {after_eof * 1000:.0f} ms)")
            print(line)
        pool = statistics.median(r[0] for r in rows["pool, one job"])
        run = statistics.median(r[0] for r in rows["renderctl run, one job"])
        print(f"one-job run vs the pool in a fresh process: {run / pool:.2f}x its time")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
