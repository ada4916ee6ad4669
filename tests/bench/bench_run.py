"""Whole-process wall time: `renderctl run --workers 2` vs ProcessPoolExecutor(2), same work.

Run: ``python tests/bench/bench_run.py [--rounds 2] [--noop 4000] [--invoices 2000]``

Both sides do the same renders in fresh processes on the real disk, alternating, and the
ratio (pool time / renderctl time = renderctl's throughput relative to the pool) is printed
per round. The pool keeps nothing durable; renderctl fsyncs every state change (batched).
For context, two more pool runs: one that only checks each output the way DESIGN.md
requires (sha256; a PDF opens with pypdf and has a page) and keeps nothing durable, which
bounds what any runner bound by that contract can reach; and one that does what a careful
script around the pool would: each output written to a temporary name, fsynced, checked,
renamed, folder fsynced.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample-inputs" / "invoices" / "0001.json"

BENCHFNS = '''
from pathlib import Path


def write_byte(inputs, output, params):
    Path(output).write_bytes(b"x")
'''

POOL = textwrap.dedent('''
    import functools, json, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path
    sys.path.insert(0, {workdir!r})

    def noop(i):
        import benchfns
        benchfns.write_byte([], Path({out!r}) / f"n{{i}}.bin", {{}})

    def invoice(i):
        from renderctl.render.invoice import render
        render([Path({sample!r})], Path({out!r}) / f"inv{{i}}.pdf", {{}})

    def checked(fn, i, durable):
        # The output checked as DESIGN.md asks (hash; a PDF opens with pypdf and has a page);
        # if durable, also written the plain careful way: temporary name, fsync, rename into
        # place, fsync the folder. No queue state either way.
        import hashlib, io, os
        out = Path({out!r})
        name = f"n{{i}}.bin" if fn is noop else f"inv{{i}}.pdf"
        tmp = out / (f".tmp-{{name}}" if durable else name)
        if fn is noop:
            import benchfns
            benchfns.write_byte([], tmp, {{}})
        else:
            from renderctl.render.invoice import render
            render([Path({sample!r})], tmp, {{}})
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        data = tmp.read_bytes()
        hashlib.sha256(data).hexdigest()
        if fn is invoice:
            from pypdf import PdfReader
            assert len(PdfReader(io.BytesIO(data)).pages) >= 1
        if durable:
            os.rename(tmp, out / name)
            dfd = os.open(out, os.O_RDONLY)
            os.fsync(dfd)
            os.close(dfd)

    MODES = {{"noop": noop, "invoice": invoice}}
    for kind, fn in (("noop", noop), ("invoice", invoice)):
        MODES[kind + "?"] = functools.partial(checked, fn, durable=False)
        MODES[kind + "+"] = functools.partial(checked, fn, durable=True)

    if __name__ == "__main__":
        fn = MODES[sys.argv[1]]
        n = int(sys.argv[2])
        with ProcessPoolExecutor(2) as ex:
            list(ex.map(fn, range(n), chunksize=1))
''')


def write_manifest(path: Path, kind: str, n: int) -> None:
    lines = ["[defaults]"]
    if kind == "noop":
        lines += ['kind = "python"', 'callable = "benchfns:write_byte"']
    else:
        lines += ['kind = "invoice"']
    for i in range(n):
        lines.append("[[jobs]]")
        lines.append(f'id = "{kind}-{i}"')
        if kind == "noop":
            lines.append(f'output = "n/{i}.bin"')
        else:
            lines.append(f'input = "{SAMPLE}"')
            lines.append(f'output = "inv/{i}.pdf"')
    path.write_text("\n".join(lines) + "\n")


def time_cmd(cmd: list[str], *, cwd: Path,
             env: dict[str, str] | None = None) -> tuple[float, str]:
    """(wall seconds, stdout) of ``cmd``."""
    # Flush what the previous command left dirty, so that renderctl's first syncfs does not
    # pay for writing back the pool's thousands of outputs (or the other way round).
    os.sync()
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-2000:] + res.stderr[-2000:])
        raise SystemExit(f"command failed ({res.returncode}): {' '.join(cmd)}")
    return dt, res.stdout


def warm(workdir: Path) -> None:
    # MEASUREMENTS.md: file creation on this ext4 slows 10-25x after idle; warm it first.
    # Keep the files until the end: this ext4 runs without a journal, and then every create
    # scans past the inodes deleted in the last 30-60 s (ext4's recently_deleted()), so
    # deleting 3,000 files here made the timed runs after it 3-5x slower, at random.
    d = workdir / "warm"
    d.mkdir()
    for i in range(3000):
        (d / str(i)).write_bytes(b"")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--noop", type=int, default=4000)
    ap.add_argument("--invoices", type=int, default=2000)
    ap.add_argument("--extra", default="", help="extra args for renderctl run")
    args = ap.parse_args()
    # Both sides read renderctl's bytecode, as from an installed wheel: where
    # PYTHONDONTWRITEBYTECODE is set (as on this machine) nothing writes it, and renderctl's
    # start-up compiled ~20,000 lines on its critical path each run (~0.1 s; the pool's two
    # workers compile only the invoice renderer, in parallel).
    compileall.compile_dir(REPO / "renderctl", quiet=1)
    base = Path(tempfile.mkdtemp(prefix="bench-run-", dir=REPO))
    try:
        (base / "benchfns.py").write_text(BENCHFNS)
        warm(base)
        results: dict[str, list[tuple[float, float]]] = {"noop": [], "invoice": []}
        # Throughput of the other pools relative to the plain one, per round.
        ceiling: dict[str, list[float]] = {"noop": [], "invoice": []}
        checked: dict[str, list[float]] = {"noop": [], "invoice": []}
        pool_py = base / "pool.py"

        def run_pool(mode: str, out: Path, n: int) -> float:
            out.mkdir()
            pool_py.write_text(POOL.format(workdir=str(base), out=str(out), sample=str(SAMPLE)))
            return time_cmd([sys.executable, str(pool_py), mode, str(n)], cwd=base)[0]

        for kind, n in (("noop", args.noop), ("invoice", args.invoices)):
            manifest = base / f"{kind}.toml"
            write_manifest(manifest, kind, n)
            for r in range(args.rounds):
                t_pool = run_pool(kind, base / f"pool-{kind}-{r}", n)
                t_only = run_pool(kind + "?", base / f"poolk-{kind}-{r}", n)
                t_durable = run_pool(kind + "+", base / f"poolc-{kind}-{r}", n)
                cmd = [sys.executable, "-m", "renderctl.cli.app", "run", str(manifest),
                       "--queue", str(base / f"q-{kind}-{r}"),
                       "--out", str(base / f"out-{kind}-{r}"),
                       "--workers", "2", "--quiet", *args.extra.split()]
                t_rc, out = time_cmd(cmd, cwd=base)
                # The summary's "runner CPU 2.20s (1.10 ms/job)": renderctl's own process.
                m = re.search(r"runner CPU ([0-9.]+)s", out)
                runner_ms = float(m.group(1)) * 1000 / n if m else float("nan")
                results[kind].append((t_pool, t_rc))
                ceiling[kind].append(t_pool / t_only)
                checked[kind].append(t_durable / t_rc)
                print(f"{kind:8} n={n:5} round {r}: pool {t_pool:6.2f}s ({n / t_pool:7.0f}/s)  "
                      f"renderctl {t_rc:6.2f}s ({n / t_rc:7.0f}/s)  "
                      f"ratio {t_pool / t_rc:.2f}x (runner CPU {runner_ms:.2f} ms/job)  |  "
                      f"pool that checks outputs "
                      f"{t_only:6.2f}s: {t_pool / t_only:.2f}x of the pool  |  pool with "
                      f"durable, checked outputs {t_durable:6.2f}s: renderctl "
                      f"{t_durable / t_rc:.2f}x of it", flush=True)
        print()
        targets = {"noop": 0.5, "invoice": 0.9}
        for kind, rows in results.items():
            ratios = [p / r for p, r in rows]
            print(f"{kind:8} renderctl/pool throughput ratio: median "
                  f"{statistics.median(ratios):.2f}x (rounds: "
                  f"{', '.join(f'{x:.2f}' for x in ratios)}); target >= {targets[kind]}x")
            print(f"{'':8} the pool doing only DESIGN.md's output check reaches "
                  f"{statistics.median(ceiling[kind]):.2f}x of the pool (the ceiling for any "
                  f"runner bound by that check); renderctl vs the durable, checked pool: "
                  f"{statistics.median(checked[kind]):.2f}x")
        print(json.dumps({k: [[round(p, 3), round(r, 3)] for p, r in v]
                          for k, v in results.items()}))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
