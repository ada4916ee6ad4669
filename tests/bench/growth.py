"""How a renderer's time and memory grow with its input's size, for the bench_*_rows/pages
scripts."""

from __future__ import annotations

import functools
import json
import os
import resource
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def print_growth(counts: Iterable[int], unit: str,
                 make: Callable[[Path, int], Path], render: Callable[[Path, Path], None]) -> None:
    """For each count: ``make(folder, count)`` an input, time ``render(input, output)``, and
    print the seconds, the time per unit, the ratio of each step to the count's ratio (1.0 =
    linear) and the peak memory the render added (what a job's memory ceiling must hold)."""
    previous: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            source = make(Path(tmp), count)
            took, grew = _measured(functools.partial(render, source,
                                                     Path(tmp) / f"{count}.out.pdf"))
            line = (f"{count:>8} {unit}  {took:7.2f} s  {took / count * 1e6:8.1f} us/{unit[:-1]}"
                    f"  peak +{grew / 2**20:6.1f} MiB ({grew / count:6.0f} B/{unit[:-1]})")
            if previous is not None:
                growth = (took / previous[1]) / (count / previous[0])
                line += f"  growth vs linear {growth:.2f}x"
            print(line, flush=True)
            previous = (count, took)


def _measured(render: Callable[[], None]) -> tuple[float, int]:
    """(seconds, bytes of peak RSS added) of ``render()``, run in a forked child: a process's
    peak RSS never comes down, so each count needs a process of its own."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        render()
        took = time.perf_counter() - started
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        os.write(w, json.dumps([took, grew]).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise SystemExit(f"the render of this count failed (wait status {status})")
    took, grew = json.loads(data)
    return float(took), int(grew)
