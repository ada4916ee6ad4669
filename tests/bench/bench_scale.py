"""Benchmark commands on a big, old queue against the same commands on a small one.

Run: ``python tests/bench/bench_scale.py [--done N] [--dead N] [--pending N]``. A seed job
runs once; its done and dead records (and event-log lines) are copied under new ids, as the
runner writes them, ages spread over a week. Each command runs as a subprocess on the big
queue and on a small one (1/50 of the size) in the same run; the ratio and the big one's
peak RSS are the figures to compare. Also: the worst one-job API submit while `prune` and
`dead retry --all` run (both used to hold submit's lock throughout).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from renderctl.fsutil import write_file  # noqa: E402
from renderctl.lifecycle import State  # noqa: E402
from renderctl.policy import ClaimIndex  # noqa: E402
from renderctl.store import Holder, Queue, Transition  # noqa: E402

WEEK = 7 * 86400.0


def job(jid: str) -> dict[str, object]:
    return {"id": jid, "kind": "python", "callable": "json:f", "output": f"o/{jid}.pdf"}


def build(q: Queue, base: Path, done: int, dead: int, pending: int) -> None:
    q.submit([job("seed-ok"), job("seed-bad")], base=base, out_root=base / "out")
    index = ClaimIndex()
    q.load_index(index)
    claims, _ = q.claim(index, holder=Holder("bench", "boot", os.getpid(), None), lease_s=60,
                        limit=2, token_prefix="b")
    ok = {"n": 1, "outcome": "completed", "elapsed_s": 0.01}
    bad = {"n": 1, "outcome": "failed", "elapsed_s": 0.01, "error": "RuntimeError: no"}
    q.finish([Transition(replace(c.record, attempts=(ok,)), State.DONE)
              if c.job_id == "seed-ok" else
              Transition(replace(c.record, attempts=(bad,)), State.DEAD) for c in claims])
    lines = (q.path / "events.jsonl").read_text().splitlines(keepends=True)
    now = time.time()
    for state, seed, n, prefix in ((State.DONE, "seed-ok", done, "d"),
                                   (State.DEAD, "seed-bad", dead, "x")):
        rec = q.read_record(q.record_path(state, seed))
        mine = [ln for ln in lines if f'"{seed}"' in ln]
        log = []
        for i in range(n):
            jid = f"{prefix}-{i:07d}"
            t = now - WEEK * (1 - i / n)
            path = q.record_path(state, jid)
            write_file(path, replace(rec, spec=replace(rec.spec, id=jid), changed_at=t)
                       .dumps(), fsync=False)
            os.utime(path, (t, t))
            log += [ln.replace(seed, jid) for ln in mine]
            if len(log) > 30000:
                q.events.append(json.loads(ln) for ln in log)
                log.clear()
        q.events.append(json.loads(ln) for ln in log)
    for at in range(0, pending, 10000):
        q.submit([job(f"p-{i:07d}") for i in range(at, min(pending, at + 10000))],
                 base=base, out_root=base / "out")


def cli(queue: Path, *args: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one `renderctl ARGS --queue QUEUE`."""
    t = time.perf_counter()
    # GNU time: a child's ru_maxrss counts this (big) process's pages from before its exec.
    res = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "renderctl",
                          *args, "--queue", str(queue)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t, int(res.stderr.split()[-1]) / 1024


def worst_submit_during(queue: Path, base: Path, *args: str) -> tuple[float, float, float]:
    """The command's wall time, and the worst wait for submit's lock and the worst one-job
    API submit while it ran (a submit also waits for a disk busy with the command's I/O)."""
    import fcntl

    q = Queue(queue)
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "renderctl", *args, "--queue", str(queue)],
                         stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lock_wait = worst = 0.0
    i = 0
    while p.poll() is None:
        fd = os.open(queue / ".submit.lock", os.O_RDWR)
        t = time.perf_counter()
        fcntl.flock(fd, fcntl.LOCK_EX)
        lock_wait = max(lock_wait, time.perf_counter() - t)
        os.close(fd)
        t = time.perf_counter()
        q.submit([job(f"web-{i}")], base=base, out_root=base / "out")
        worst = max(worst, time.perf_counter() - t)
        i += 1
        time.sleep(0.1)
    return time.perf_counter() - t0, lock_wait, worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--done", type=int, default=100_000)
    ap.add_argument("--dead", type=int, default=5_000)
    ap.add_argument("--pending", type=int, default=20_000)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-scale-", dir="."))
    try:
        sizes = {"small": (a.done // 50, a.dead // 50, a.pending // 50),
                 "big": (a.done, a.dead, a.pending)}
        queues = {}
        for name, (d, x, p) in sizes.items():
            t = time.perf_counter()
            queues[name] = scratch / name
            build(Queue(queues[name]), scratch, d, x, p)
            print(f"built {name}: done {d}, dead {x}, pending {p} "
                  f"({time.perf_counter() - t:.1f} s)")
        print(f"  {'command':<30} {'small s':>8} {'big s':>8} {'ratio':>7} {'big RSS MB':>11}")
        for args in (["status"], ["status", "--json"], ["show", "d-0000001"], ["dead", "list"],
                     ["metrics"], ["metrics"], ["prune", "--older-than", "3d", "--dry-run"],
                     ["submit", "--out", str(scratch / "out"), str(ROOT / "jobs/demo.toml")]):
            (ts, _), (tb, mb) = cli(queues["small"], *args), cli(queues["big"], *args)
            print(f"  {' '.join(args)[:30]:<30} {ts:8.2f} {tb:8.2f} {tb / ts:7.1f} {mb:11.0f}")
        for args in (["prune", "--older-than", "3d"], ["dead", "retry", "--all"]):
            wall, lock_wait, worst = worst_submit_during(queues["big"], scratch, *args)
            print(f"  `{' '.join(args)}` (big): {wall:.1f} s; meanwhile submit's lock waited "
                  f"<= {lock_wait * 1000:.0f} ms, a one-job submit took <= {worst * 1000:.0f} ms")
        print(f"  (this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}"
              " MB)")
    finally:
        if not a.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
