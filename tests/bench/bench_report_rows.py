"""How `report` render time grows with rows (a plain script, not pytest).

A single reportlab Table re-measured every remaining row at each page break, so 4x the rows
took ~13x the time (10k rows 4 s, 40k 51 s) and a 100k-row CSV always timed out; rows now
have a fixed height and are paged a page at a time. Prints seconds per row count and the
ratio of each step to the row ratio (1.0 = linear).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from growth import print_growth

from renderctl.render import report


def write_rows(folder: Path, count: int) -> Path:
    path = folder / f"{count}.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["item", "units", "price"])
        w.writerows([f"Item {i:06d}", i, f"{i / 100:.2f}"] for i in range(1, count + 1))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, nargs="+", default=[5_000, 10_000, 20_000, 40_000])
    args = ap.parse_args()
    print_growth(args.rows, "rows", write_rows,
                 lambda source, out: report.render([source], out, {"title": "T"}))


if __name__ == "__main__":
    main()
