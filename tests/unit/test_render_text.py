"""Text the standard PDF fonts cannot draw is refused by name, never printed as black boxes."""

from __future__ import annotations

import codecs
import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import reportlab.pdfbase.rl_codecs  # noqa: F401 (registers reportlab's font encodings)
from pypdf import PdfReader
from reportlab.pdfbase import pdfmetrics
from reportlab.pdfgen.canvas import Canvas
from test_render_params import validate

from renderctl.errors import InvalidInput
from renderctl.render import invoice, pdfops, report, safety
from renderctl.render.text import plain, undrawable

# What reportlab draws as its "no glyph" black box (■, ZapfDingbats 'n') with the standard fonts.
NOT_DRAWN = ["株", "🔥", "ł", "ș", "ή", "מ", "\u2011"]
DRAWN = ["é", "€", "–", "ß", "Ω", "α", "→", "✓", "ÿ"]


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


def make_doc(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "number": "INV-1",
        "date": "2025-03-01",
        "currency": "EUR",
        "seller": {"name": "Acme Tools GmbH", "address": ["Hauptstr. 1", "10115 Berlin"]},
        "customer": {"name": "Globex Ltd", "address": ["1 Main St", "London"]},
        "items": [{"description": "Widget", "quantity": 3, "unit_price": "4.50"}],
    }
    doc.update(overrides)
    return doc


def write_doc(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def make_pdf(path: Path) -> Path:
    canvas = Canvas(str(path), invariant=True)
    canvas.drawString(72, 72, "page one")
    canvas.showPage()
    canvas.save()
    return path


def _reportlab_draws(text: str) -> bool:
    font = pdfmetrics.getFont("Helvetica")
    return all(
        any(_encodes(ch, f.encName) for f in (font, *font.substitutionFonts)) for ch in text
    )


def _encodes(ch: str, encoding: str) -> bool:
    try:
        ch.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def test_the_drawable_table_is_reportlabs_own() -> None:
    # Every character from U+0020 up to the end of plane 2, judged both ways: the table in
    # text.py must be exactly what Helvetica (with its Symbol and ZapfDingbats fallbacks)
    # draws, or a glyph the fonts have is refused, or a black box slips through.
    codecs.lookup("winansi")
    assert pdfmetrics.getFont("Helvetica-Bold").substitutionFonts  # the same fallbacks
    differ = [
        f"U+{cp:04X}"
        for cp in range(0x20, 0x30000)
        if not 0xD800 <= cp < 0xE000
        and cp != 0x7F  # DEL: clean() drops it before anything is drawn
        # what is drawn is the composed form (KELVIN SIGN is drawn as the letter K)
        and (undrawable(chr(cp)) is None)
        != _reportlab_draws(unicodedata.normalize("NFC", chr(cp)))
    ]
    assert differ == []


@pytest.mark.parametrize("ch", NOT_DRAWN)
def test_undrawable_names_the_character(ch: str) -> None:
    problem = undrawable(f"ok {ch} ok")
    assert problem is not None and f"U+{ord(ch):04X}" in problem and "black box" in problem


@pytest.mark.parametrize("ch", DRAWN)
def test_drawable_characters_pass(ch: str) -> None:
    assert undrawable(f"ok {ch}\tok\n") is None


def test_a_combining_accent_that_composes_is_drawn_composed() -> None:
    # "e" + COMBINING ACUTE ACCENT is "é" once composed (NFC), which Helvetica has.
    assert undrawable("Cafe\u0301") is None
    assert plain("Cafe\u0301") == "Café"
    # no precomposed q-acute exists: the mark alone is named, and not printed in the message
    assert undrawable("q\u0301") == (
        "U+0301 COMBINING ACUTE ACCENT is not in the standard PDF fonts (Western European"
        " text, unaccented Greek, some symbols): it would print as a black box"
    )


# -- each renderer refuses it, naming the field ---------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("customer.name", "株式会社サンプル", "customer.name"),
        ("seller.address", ["Main St 1", "Łódź"], "seller.address[1]"),
        ("notes", "thanks 🔥", "notes"),
        ("number", "INV\u20112025", "number"),
        ("items", [{"description": "Chair 🪑", "quantity": 1, "unit_price": "1"}],
         "items[0].description"),
    ],
)
def test_invoice_refuses_text_it_cannot_draw_naming_the_field(
    tmp_path: Path, path: str, value: Any, field: str
) -> None:
    doc = make_doc()
    target = doc
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    target[last] = value
    source = write_doc(tmp_path / "inv.json", doc)
    with pytest.raises(InvalidInput) as caught:
        invoice.render([source], tmp_path / "out.pdf", {})
    assert str(caught.value).startswith(f"inv.json: {field}: "), caught.value
    assert "black box" in str(caught.value)
    assert not (tmp_path / "out.pdf").exists()


def test_invoice_refuses_a_title_it_cannot_draw(tmp_path: Path) -> None:
    source = write_doc(tmp_path / "inv.json", make_doc())
    with pytest.raises(InvalidInput, match=r"^params\.title: .*U\+8ACB"):
        invoice.render([source], tmp_path / "out.pdf", {"title": "請求書"})


def test_invoice_with_accents_and_greek_renders_them(tmp_path: Path) -> None:
    doc = make_doc(customer={"name": "Müller & Søn Cafe\u0301 Ωmega", "address": ["Straße 1"]})
    output = tmp_path / "out.pdf"
    invoice.render([write_doc(tmp_path / "inv.json", doc)], output, {})
    text = PdfReader(output).pages[0].extract_text()
    # (pypdf reads Symbol's capital omega back as U+2126 OHM SIGN, which composes to it)
    assert "Müller & Søn Café Ωmega" in unicodedata.normalize("NFC", text)
    assert "Straße 1" in text and "■" not in text


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "data.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_report_refuses_a_cell_it_cannot_draw_naming_line_and_column(tmp_path: Path) -> None:
    source = _csv(tmp_path, "region,sales\nParis,5\n東京,10\n")
    with pytest.raises(InvalidInput) as caught:
        report.render([source], tmp_path / "r.pdf", {"title": "T"})
    assert str(caught.value).startswith("data.csv line 3, column 'region': '東' (U+6771")


def test_report_ignores_what_it_does_not_show(tmp_path: Path) -> None:
    source = _csv(tmp_path, "region,note,sales\nParis,日本,5\n")
    report.render([source], tmp_path / "r.pdf", {"title": "T", "columns": ["region", "sales"]})
    assert "■" not in PdfReader(tmp_path / "r.pdf").pages[0].extract_text()


def test_report_refuses_a_header_it_cannot_draw(tmp_path: Path) -> None:
    source = _csv(tmp_path, "地域,sales\nA,5\n")
    with pytest.raises(InvalidInput, match=r"^data\.csv: header column '地域': '地' \(U\+5730"):
        report.render([source], tmp_path / "r.pdf", {"title": "T"})


def test_report_file_name_it_cannot_draw_is_shown_with_question_marks(tmp_path: Path) -> None:
    source = tmp_path / "売上.csv"
    source.write_text("region,sales\nA,5\n", encoding="utf-8")
    report.render([source], tmp_path / "r.pdf", {"title": "T"})
    text = PdfReader(tmp_path / "r.pdf").pages[0].extract_text()
    assert "1 row from ??.csv" in text and "■" not in text


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("stamp", {"text": "機密"}, "params.text"),
        ("stamp", {"text": "DRAFT 🔥"}, "params.text"),
        ("report", {"title": "売上"}, "params.title"),
    ],
)
def test_validate_and_run_refuse_params_they_cannot_draw(
    tmp_path: Path, kind: str, params: dict[str, Any], field: str
) -> None:
    if kind == "stamp":
        source = make_pdf(tmp_path / "a.pdf")
    else:
        source = tmp_path / "a.csv"
        source.write_text("name,amount\nA,1\n", encoding="utf-8")
    problems = validate(tmp_path, kind, source, params)
    assert len(problems) == 1 and problems[0].startswith(f"{field}: ") and "U+" in problems[0]
    render = pdfops.stamp if kind == "stamp" else report.render
    with pytest.raises(InvalidInput) as caught:
        render([source], tmp_path / "out.pdf", params)
    assert str(caught.value) == problems[0]


def test_validate_refuses_an_invoice_title_it_cannot_draw(tmp_path: Path) -> None:
    source = write_doc(tmp_path / "inv.json", make_doc())
    problems = validate(tmp_path, "invoice", source, {"title": "請求書"})
    assert len(problems) == 1 and problems[0].startswith("params.title: ")
