"""Benchmark the memory guards: overshoot, reaction time, sampling cost, RSS/USS/PSS cost.

Run as root: ``python tests/bench/bench_guards.py``. Figures vary run to run on this
machine; compare within one run (MEASUREMENTS.md).
"""

from __future__ import annotations

import os
import random
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from renderctl import guards, proctree  # noqa: E402

MB = 1024 * 1024
LIMIT = 300 * MB
REPS = 5

# Allocates 1 MB chunks at argv[1] MB/s after a line on stdin; after each chunk reports
# "<monotonic time> <anonymous RSS estimate>" on stdout (CLOCK_MONOTONIC is system-wide).
ALLOCATOR = """
import os, sys, time
rate = float(sys.argv[1])
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
print("ready", flush=True)
sys.stdin.readline()
base, chunks, start = anon(), [], time.monotonic()
out = os.fdopen(1, "w", buffering=1)
for i in range(4000):
    b = bytearray(1024 * 1024)
    for j in range(0, len(b), 4096):
        b[j] = 1
    chunks.append(b)
    out.write(f"{time.monotonic()} {base + (i + 1) * 1024 * 1024}\\n")
    ahead = start + (i + 1) / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
"""


def start_allocator(rate_mb_s: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR, str(rate_mb_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        process_group=0,
    )
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def _go(proc: subprocess.Popen) -> None:
    proc.stdin.write(b"\n")
    proc.stdin.flush()


def _crossing(reports: list[tuple[float, int]]) -> float:
    """When the allocator crossed LIMIT: its first report above it, else its last report."""
    for t, total in reports:
        if total > LIMIT:
            return t
    # Killed inside the chunk that crossed (cgroup): its start is at most one 1 MB pacing
    # step (10 ms at 100 MB/s) after the last report, so the figure is an upper bound.
    return reports[-1][0]


def _parse(buf: bytes) -> list[tuple[float, int]]:
    out = []
    for line in buf.decode().splitlines():
        t, total = line.split()
        out.append((float(t), int(total)))
    return out


def run_cgroup(guard: guards.CgroupGuard, rate_mb_s: float) -> tuple[float, float]:
    """(overshoot MB, crossing-to-reap ms) under the kernel's limit."""
    slot = guard.open_slot("bench")
    proc = start_allocator(rate_mb_s)
    slot.adopt(proc.pid)
    guards.set_job_limit(slot.path, LIMIT)
    _go(proc)
    buf = proc.stdout.read()  # EOF when the kernel's kill has torn the process down
    proc.wait()
    reaped = time.monotonic()
    assert proc.returncode == -signal.SIGKILL
    peak = slot.peak_bytes() or 0
    slot.close()
    return (peak - LIMIT) / MB, (reaped - _crossing(_parse(buf))) * 1000


def run_sampling(rate_mb_s: float, interval_s: float = 0.05) -> tuple[float, float]:
    """(overshoot MB, crossing-to-reap ms) with the runner sampling every ``interval_s``."""
    proc = start_allocator(rate_mb_s)
    sampler = guards.TreeSampler(proc.pid, LIMIT)
    os.set_blocking(proc.stdout.fileno(), False)
    pidfd = os.pidfd_open(proc.pid)
    buf = b""
    _go(proc)
    # A random phase: the paced allocator and a sampler started together are phase-locked,
    # which would report the same overshoot every run.
    next_sample = time.monotonic() + random.uniform(0, interval_s)
    while True:
        now = time.monotonic()
        if now >= next_sample:
            if sampler.sample().exceeded:
                proctree.kill_group(proc.pid, signal.SIGKILL)
                break
            next_sample += interval_s
        ready, _, _ = select.select([proc.stdout, pidfd], [], [], max(0, next_sample - now))
        if pidfd in ready:
            raise RuntimeError("allocator exited before crossing the ceiling")
        if proc.stdout in ready:
            buf += proc.stdout.read() or b""
    proc.wait()
    reaped = time.monotonic()
    os.close(pidfd)
    os.set_blocking(proc.stdout.fileno(), True)
    buf += proc.stdout.read()
    return (sampler.peak_bytes - LIMIT) / MB, (reaped - _crossing(_parse(buf))) * 1000


def per_call_us(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """(wall µs, CPU µs) per call of ``fn``."""
    fn()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6


HOLDER = """
import subprocess, sys
mb = int(sys.argv[1])
data = bytearray(mb * 1024 * 1024)
for j in range(0, len(data), 4096):
    data[j] = 1
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"])
print("ready", flush=True)
sys.stdin.read()
child.kill()
"""


def hold(mb: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(mb)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        process_group=0,
    )
    assert proc.stdout.readline().strip() == b"ready"
    return proc


def release(proc: subprocess.Popen) -> None:
    proctree.kill_group(proc.pid, signal.SIGKILL)
    proc.wait()


def main() -> None:
    print(f"python {sys.version.split()[0]}, psutil {psutil.__version__}, {os.cpu_count()} CPUs")
    try:
        guard = guards.detect_memory_guard(prefer="cgroup-v1")
    except guards.GuardUnavailable:
        guard = None
    print("\n== overshoot above a 300 MiB ceiling, and crossing -> reap ==")
    print(f"{'mechanism':<16}{'rate MB/s':>10}{'overshoot MB (med/max)':>26}{'ms (med/max)':>18}")
    for rate in (100, 1000):
        rows: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("sampling 50ms", lambda r=rate: run_sampling(r)),
        ]
        if guard is not None:
            rows.insert(0, ("cgroup-v1", lambda r=rate: run_cgroup(guard, r)))
        for name, fn in rows:
            res = [fn() for _ in range(REPS)]
            over, ms = [r[0] for r in res], [r[1] for r in res]
            print(
                f"{name:<16}{rate:>10}"
                f"{statistics.median(over):>17.1f} / {max(over):<6.1f}"
                f"{statistics.median(ms):>10.1f} / {max(ms):<6.1f}"
            )
    if guard is not None:
        guard.close()

    print("\n== cost of sampling one job tree (worker + 1 child, 40 MB) ==")
    tree = hold(40)
    try:
        sampler = guards.TreeSampler(tree.pid, 10**12, full_scan_every=1)
        full = per_call_us(sampler.sample, 200)
        sampler = guards.TreeSampler(tree.pid, 10**12, full_scan_every=10**9)
        cheap = per_call_us(sampler.sample, 1000)
        sampler = guards.TreeSampler(tree.pid, 10**12)
        mixed = per_call_us(sampler.sample, 1000)
        baseline = per_call_us(psutil.Process(tree.pid).memory_info, 1000)
    finally:
        release(tree)
    print(f"{'path':<34}{'wall µs':>10}{'CPU µs':>10}{'% core @20/s':>14}")
    for name, (wall, cpu) in (
        ("baseline: one memory_info()", baseline),
        ("sample, /proc full scan each", full),
        ("sample, children files only", cheap),
        ("sample, full scan every 10 (dflt)", mixed),
    ):
        print(f"{name:<34}{wall:>10.1f}{cpu:>10.1f}{cpu * 20 / 1e6 * 100:>13.3f}%")

    print("\n== RSS vs USS vs PSS read cost (one process) ==")
    print(f"{'size':<8}{'RSS µs':>10}{'USS+PSS µs':>12}{'ratio':>8}{'PSS (smaps) µs':>16}")
    for mb in (40, 400):
        proc = hold(mb)
        try:
            p = psutil.Process(proc.pid)
            rss, _ = per_call_us(p.memory_info, 500)
            uss, _ = per_call_us(p.memory_full_info, 50)
            smaps = Path(f"/proc/{proc.pid}/smaps")
            pss, _ = per_call_us(smaps.read_bytes, 20)
        finally:
            release(proc)
        print(f"{mb:>4} MB{rss:>12.1f}{uss:>12.1f}{uss / rss:>7.0f}x{pss:>16.1f}")
    print(
        "\n(psutil 7 reads USS and PSS together from /proc/PID/smaps_rollup; the last column "
        "is the full smaps file older tools parse.)"
    )


if __name__ == "__main__":
    main()
