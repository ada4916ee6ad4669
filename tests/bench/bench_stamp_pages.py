"""How `stamp` time grows with pages (a plain script, not pytest).

pypdf merged the stamp's font into the /Font dictionary that reportlab's pages share, under a
new name for every page, each merge looking through every name added before: 1,000 pages
took ~2.5 s, 2,000 ~15 s, and 5,000 timed out. Each page now gets its own copy of its
resource dictionaries first. Prints seconds per page count and the ratio of each step to the
page ratio (1.0 = linear).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from growth import print_growth
from reportlab.pdfgen.canvas import Canvas

from renderctl.render import pdfops, safety


def write_pages(folder: Path, count: int) -> Path:
    path = folder / f"{count}.pdf"
    canvas = Canvas(str(path), invariant=True)
    for page in range(1, count + 1):
        canvas.drawString(72, 720, f"page {page}")
        canvas.showPage()
    canvas.save()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pages", type=int, nargs="+", default=[500, 1_000, 2_000, 4_000])
    args = ap.parse_args()
    safety.harden()  # as in a worker
    print_growth(args.pages, "pages", write_pages,
                 lambda source, out: pdfops.stamp([source], out, {"text": "PAID"}))


if __name__ == "__main__":
    main()
