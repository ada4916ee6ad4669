"""What the renderers accept, they print legibly: no text drawn over other text, none off the
page. Checked on the PDF itself: each piece of text pypdf finds, where it starts and how
wide its font makes it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader
from reportlab.pdfbase.pdfmetrics import stringWidth
from test_render_invoice import make_doc

from renderctl.errors import InvalidInput
from renderctl.render import invoice, report, safety


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


def spans(path: Path) -> list[list[tuple[float, float, float, str]]]:
    """Per page, each text piece as (left, right, baseline, text)."""
    return [_page_spans(page) for page in PdfReader(path).pages]


def _page_spans(page: Any) -> list[tuple[float, float, float, str]]:
    found: list[tuple[float, float, float, str]] = []

    def visit(text: str, cm: list[float], tm: list[float], font: Any, size: float) -> None:
        text = text.strip()
        if not text or not font:
            return
        x = tm[4] * cm[0] + tm[5] * cm[2] + cm[4]
        y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]
        width = stringWidth(text, str(font["/BaseFont"])[1:], size) * tm[0] * cm[0]
        found.append((x, x + width, y, text))

    page.extract_text(visitor_text=visit)
    return found


def legibility_problems(path: Path) -> list[str]:
    problems = []
    for number, found in enumerate(spans(path), 1):
        width = float(PdfReader(path).pages[number - 1].mediabox.width)
        for left, right, _, text in found:
            if left < 0 or right > width:
                problems.append(f"page {number}: {text!r} is off the page: {left:.0f}..{right:.0f}")
        ordered = sorted(found, key=lambda s: (round(s[2]), s[0]))
        for a, b in zip(ordered, ordered[1:], strict=False):
            if abs(a[2] - b[2]) < 1 and b[0] < a[1] - 0.5:
                problems.append(f"page {number}: {a[3]!r} and {b[3]!r} overlap")
    return problems


def render_invoice(tmp_path: Path, doc: dict[str, Any], **params: Any) -> Path:
    source = tmp_path / "invoice.json"
    source.write_text(json.dumps(doc), encoding="utf-8")
    output = tmp_path / "invoice.pdf"
    invoice.render([source], output, params)
    return output


def test_an_ordinary_invoice_is_legible(tmp_path: Path) -> None:
    assert legibility_problems(render_invoice(tmp_path, make_doc())) == []


BIG = "999999999999.999999"  # just below MAX_ABS_NUMBER, with MAX_PLACES decimals


@pytest.mark.parametrize(
    "items",
    [
        [{"description": "Big", "quantity": BIG, "unit_price": BIG, "tax_rate": "0.055"}] * 10,
        [{"description": "Neg", "quantity": "-" + BIG, "unit_price": BIG}] * 10,
        [{"description": "Qty", "quantity": BIG, "unit_price": "0.000001"}],
    ],
    ids=["largest", "largest-negative", "long-quantity"],
)
def test_the_largest_amounts_an_invoice_accepts_do_not_overlap(
    tmp_path: Path, items: list[dict[str, Any]]
) -> None:
    # Each line's net reaches 1e24 and the total 1e25: accepted (below MAX_AMOUNT), and
    # they used to be drawn across the unit price and the tax rate, the total due across
    # its own label
    output = render_invoice(tmp_path, make_doc(items=items))
    assert legibility_problems(output) == []


def test_the_longest_invoice_number_and_seller_name_stay_legible(tmp_path: Path) -> None:
    doc = make_doc(
        number="N" * 64,
        seller={"name": "W" * invoice.MAX_LINE, "address": ["Hauptstr. 1"]},
    )
    output = render_invoice(tmp_path, doc, title="Proforma invoice for services rendered")
    assert legibility_problems(output) == []
    text = PdfReader(output).pages[0].extract_text()
    assert "Page 1 of 1" in text
    assert "N" * 15 in text  # the number is printed (wrapped), not dropped


def test_a_long_report_title_does_not_run_over_the_page_number(tmp_path: Path) -> None:
    source = tmp_path / "r.csv"
    source.write_text("name,amount\nA,1\nB,2\n", encoding="utf-8")
    output = tmp_path / "r.pdf"
    report.render([source], output, {"title": "Quarterly figures " * 20})
    assert legibility_problems(output) == []
    assert "Page 1 of 1" in PdfReader(output).pages[0].extract_text()


@pytest.mark.parametrize(
    ("overrides", "params", "start"),
    [
        ({"customer": {"name": "W" * 200, "address": ["W" * 200] * 10}}, {},
         "invoice.json: customer: "),
        ({"seller": {"name": "W" * 200, "address": ["W" * 200] * 10, "vat_id": "V" * 64}}, {},
         "invoice.json: seller: "),
        ({}, {"title": "Invoice " * 400}, "params.title: "),
        # A table row cannot break either: one description of 999 lines is one row
        ({"items": [{"description": "Widget", "quantity": 1, "unit_price": 1},
                    {"description": "x" + "\n" * 998 + "y", "quantity": 1, "unit_price": 1}]},
         {}, "invoice.json: items[1].description: "),
    ],
    ids=["customer", "seller", "title", "item"],
)
def test_a_block_taller_than_a_page_is_named(
    tmp_path: Path, overrides: dict[str, Any], params: dict[str, Any], start: str
) -> None:
    # The header and the customer block cannot break across pages; reportlab's own message
    # named a Table at some memory address, not what to shorten
    with pytest.raises(InvalidInput) as caught:
        render_invoice(tmp_path, make_doc(**overrides), **params)
    message = str(caught.value)
    assert message.startswith(start) and "taller than a page" in message, message
    assert "0x" not in message

