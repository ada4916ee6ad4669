"""Shared page furniture for the platypus renderers: the ``Page N of M`` canvas and styles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from reportlab.lib import colors
from reportlab.lib.enums import TA_RIGHT
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import mm
from reportlab.pdfbase.pdfmetrics import stringWidth
from reportlab.pdfgen.canvas import Canvas

PAGE_SIZE = A4
MARGIN = 18 * mm
FOOTER_Y = 10 * mm
INK = colors.HexColor("#1f2933")
MUTED = colors.HexColor("#616e7c")
RULE = colors.HexColor("#cbd2d9")
BAND = colors.HexColor("#e4e7eb")
ZEBRA = colors.HexColor("#f5f7fa")


@dataclass(frozen=True)
class Styles:
    """The paragraph styles the renderers share; built once per process, never mutated."""

    body: ParagraphStyle
    small: ParagraphStyle
    cell: ParagraphStyle
    label: ParagraphStyle
    title: ParagraphStyle
    heading: ParagraphStyle
    right: ParagraphStyle


@cache
def styles() -> Styles:
    """The shared styles (cached: building them costs more than a one-page render's table)."""
    body = ParagraphStyle("body", fontName="Helvetica", fontSize=9.5, leading=12.5, textColor=INK)
    return Styles(
        body=body,
        small=ParagraphStyle("small", parent=body, fontSize=8, leading=10, textColor=MUTED),
        cell=ParagraphStyle("cell", parent=body, fontSize=9, leading=11),
        label=ParagraphStyle(
            "label",
            parent=body,
            fontName="Helvetica-Bold",
            fontSize=8,
            leading=10,
            textColor=MUTED,
        ),
        title=ParagraphStyle(
            "title",
            parent=body,
            fontName="Helvetica-Bold",
            fontSize=20,
            leading=24,
        ),
        heading=ParagraphStyle(
            "heading",
            parent=body,
            fontName="Helvetica-Bold",
            fontSize=11,
            leading=14,
        ),
        right=ParagraphStyle("right", parent=body, alignment=TA_RIGHT),
    )


def numbered_canvas(footer_left: str) -> Callable[..., Canvas]:
    """A canvas class that writes ``footer_left`` and ``Page N of M`` on every page."""

    class NumberedCanvas(Canvas):
        """Defers each page until the page count is known (reportlab's two-pass recipe)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._saved_pages: list[dict[str, Any]] = []

        def showPage(self) -> None:  # noqa: N802 (reportlab's name)
            state = dict(self.__dict__)
            if self._code:
                # The page's operators joined as reportlab will join them at the end
                # ("\n"), in one string: kept as the list of one string per operator, a
                # page of a long report held ~1.5 KB of small strings per table row until
                # the save, and a 7 MB CSV ran out of a 400 MB ceiling.
                state["_code"] = ["\n".join(self._code)]
            self._saved_pages.append(state)
            self._startPage()

        def save(self) -> None:
            pages, self._saved_pages = self._saved_pages, []
            total = len(pages)
            for i, state in enumerate(pages):
                pages[i] = {}  # its content now lives in the document's page: not twice
                self.__dict__.update(state)
                self._draw_footer(total)
                super().showPage()
            super().save()

        def _draw_footer(self, total: int) -> None:
            width, _ = self._pagesize
            self.saveState()
            self.setStrokeColor(RULE)
            self.setLineWidth(0.5)
            self.line(MARGIN, FOOTER_Y + 10, width - MARGIN, FOOTER_Y + 10)
            self.setFont("Helvetica", 8)
            self.setFillColor(MUTED)
            page = f"Page {self._pageNumber} of {total}"
            room = width - 2 * MARGIN - stringWidth(page, "Helvetica", 8) - 4 * mm
            # drawString never parses markup, so user text in the footer stays literal.
            self.drawString(MARGIN, FOOTER_Y, clipped(footer_left, "Helvetica", 8, room))
            self.drawRightString(width - MARGIN, FOOTER_Y, page)
            self.restoreState()

    return NumberedCanvas


def clipped(text: str, font: str, size: float, room: float) -> str:
    """``text``, cut and ended with an ellipsis if it is wider than ``room`` points."""
    if stringWidth(text, font, size) <= room:
        return text
    while text and stringWidth(text + "…", font, size) > room:
        text = text[: max(0, min(len(text) - 1, int(len(text) * 0.9)))]
    return text + "…"
