"""Cancel latency of a running job: from `cancel` to the record in cancelled/ (p50/p99).

Run: ``python tests/bench/bench_cancel.py [--n 40] [--pending 5000]``

A runner serves long jobs (each sleeps 60 s); each time one has started, the bench cancels
it through the same code path as `renderctl cancel` (in-process, so Python's start-up is
not counted) and times until `cancelled/ID.json` exists and the job's worker is gone. The
runner is woken by SIGUSR1; without it, it would notice at its next poll (1 s).

Then many pending jobs (``--pending N``; 0 skips it): two queues of N pending jobs each,
one cancelled as `renderctl cancel ID...` did before batching (``cancel_pending`` per id: a
file fsync and two folder fsyncs each), the other with `renderctl cancel --all` (a real
process, Python's start-up included: pending jobs settled 256 at a time, one sync each);
prints both times and their ratio.
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
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from renderctl.control import cancel_jobs  # noqa: E402
from renderctl.lifecycle import State  # noqa: E402
from renderctl.store import Queue  # noqa: E402

PENDING_DEFAULT = 5000

SLEEPER = '''
import time
def sleep(inputs, output, params):
    time.sleep(60)
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--pending", type=int, default=PENDING_DEFAULT,
                    help="pending jobs to cancel by ids one by one vs --all (0: skip)")
    args = ap.parse_args()
    if args.n:
        running(args.n)
    if args.pending:
        many_pending(args.pending)


def many_pending(n: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-cancel-many-", dir=REPO))
    try:
        queues = []
        for name in ("by-id", "all"):
            q = Queue(base / name)
            for at in range(0, n, 10000):
                q.submit([{"id": f"p{i:07d}", "kind": "python", "callable": "json:f",
                           "output": f"o/{i}.pdf"} for i in range(at, min(n, at + 10000))],
                         base=base, out_root=base / "out")
            queues.append(q)
        by_id, every = queues
        ids = by_id.list_ids(State.PENDING)
        t0 = time.perf_counter()
        for jid in ids:  # what cancel_jobs did for each id before batching
            assert by_id.cancel_pending(jid)
        t_ids = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "renderctl.cli.app", "cancel", "--all",
                              "--queue", str(every.path)], stdout=subprocess.DEVNULL,
                             env={**os.environ, "NO_COLOR": "1"}, check=True)
        t_all = time.perf_counter() - t0
        assert res.returncode == 0
        assert every.count(State.CANCELLED) == by_id.count(State.CANCELLED) == n
        print(f"cancel of {n} pending jobs: by ids one by one (cancel_pending each) "
              f"{t_ids:.2f} s ({t_ids / n * 1000:.2f} ms/job); `cancel --all` {t_all:.2f} s "
              f"({t_all / n * 1000:.3f} ms/job, start-up included); ratio {t_ids / t_all:.1f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def running(n: int) -> None:
    base = Path(tempfile.mkdtemp(prefix="bench-cancel-", dir=REPO))
    try:
        (base / "sleeper.py").write_text(SLEEPER)
        lines = ['[defaults]', 'kind = "python"', 'callable = "sleeper:sleep"']
        for i in range(n):
            lines += ["[[jobs]]", f'id = "c{i:03d}"', f'output = "c/{i}.bin"']
        (base / "m.toml").write_text("\n".join(lines) + "\n")
        qdir = base / "q"
        proc = subprocess.Popen(
            [sys.executable, "-m", "renderctl.cli.app", "run", str(base / "m.toml"),
             "--queue", str(qdir), "--out", str(base / "out"), "--workers", "2", "--json"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"})
        started: dict[str, int] = {}
        cond = threading.Condition()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                ev = json.loads(line)
                if ev.get("event") == "started":
                    with cond:
                        started[ev["job"]] = ev["worker"]
                        cond.notify_all()

        threading.Thread(target=read, daemon=True).start()
        q = Queue(qdir)
        latencies: list[float] = []
        reaped: list[float] = []
        done: set[str] = set()
        for _ in range(n):
            with cond:
                cond.wait_for(lambda: set(started) - done, timeout=30)
                jid = sorted(set(started) - done)[0]
                worker = started[jid]
            done.add(jid)
            target = q.record_path("cancelled", jid)
            t0 = time.perf_counter()
            cancel_jobs(q, [jid])
            while not target.exists():
                time.sleep(0.0005)
            t1 = time.perf_counter()
            while os.path.exists(f"/proc/{worker}") and _state(worker) not in ("Z", "X"):
                time.sleep(0.0005)
            t2 = time.perf_counter()
            latencies.append((t1 - t0) * 1000)
            reaped.append((t2 - t0) * 1000)
        proc.wait(timeout=60)
        lat = sorted(latencies)
        rep = sorted(reaped)

        def p(xs: list[float], f: float) -> float:
            return xs[min(len(xs) - 1, int(f * len(xs)))]

        print(f"cancel of a running job, n={len(lat)}: record in cancelled/ p50 "
              f"{p(lat, .5):.1f} ms, p99 {p(lat, .99):.1f} ms, max {lat[-1]:.1f} ms; "
              f"worker gone p50 {p(rep, .5):.1f} ms, p99 {p(rep, .99):.1f} ms "
              f"(target p99 <= 200 ms); mean {statistics.mean(lat):.1f} ms")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _state(pid: int) -> str:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return "X"
    return data[data.rindex(b")") + 2:data.rindex(b")") + 3].decode()


if __name__ == "__main__":
    main()
