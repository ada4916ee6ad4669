"""How a renderer's time grows with its input's size, for the bench_*_rows/pages scripts."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path


def print_growth(counts: Iterable[int], unit: str,
                 make: Callable[[Path, int], Path], render: Callable[[Path, Path], None]) -> None:
    """For each count: ``make(folder, count)`` an input, time ``render(input, output)``, and
    print the seconds, the time per unit and the ratio of each step to the count's ratio
    (1.0 = linear)."""
    previous: tuple[int, float] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for count in counts:
            source = make(Path(tmp), count)
            started = time.perf_counter()
            render(source, Path(tmp) / f"{count}.out.pdf")
            took = time.perf_counter() - started
            line = f"{count:>8} {unit}  {took:7.2f} s  {took / count * 1e6:8.1f} us/{unit[:-1]}"
            if previous is not None:
                growth = (took / previous[1]) / (count / previous[0])
                line += f"  growth vs linear {growth:.2f}x"
            print(line, flush=True)
            previous = (count, took)
