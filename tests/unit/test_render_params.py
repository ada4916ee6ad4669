"""validate refuses exactly the params a renderer would refuse at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader
from reportlab.pdfgen.canvas import Canvas

from renderctl.errors import InvalidInput, ManifestError
from renderctl.manifest import load_manifests
from renderctl.render import pdfops, report, safety


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    pdf = tmp_path / "a.pdf"
    canvas = Canvas(str(pdf), invariant=True)
    canvas.drawString(72, 72, "page one")
    canvas.showPage()
    canvas.save()
    csv = tmp_path / "a.csv"
    csv.write_text("name,amount\nA,1\n", encoding="utf-8")
    return {"stamp": pdf, "report": csv}


def validate(tmp_path: Path, kind: str, source: Path, params: dict[str, Any]) -> list[str]:
    """`renderctl validate`'s check of one job: its problems as 'field: message'."""
    manifest = tmp_path / "jobs.json"
    job = {"id": "j1", "kind": kind, "input": source.name, "output": "o.pdf", "params": params}
    manifest.write_text(json.dumps({"jobs": [job]}), encoding="utf-8")
    try:
        load_manifests([manifest], out_root=tmp_path / "out")
    except ManifestError as exc:
        return [f"{p.field}: {p.message}" for p in exc.problems]
    return []


def run(tmp_path: Path, kind: str, source: Path, params: dict[str, Any]) -> str | None:
    """The renderer's verdict at run time: its InvalidInput message, or None if it rendered."""
    render = {"stamp": pdfops.stamp, "report": report.render}[kind]
    output = tmp_path / "run.pdf"
    try:
        render([source], output, params)
    except InvalidInput as exc:
        return str(exc)
    assert len(PdfReader(output).pages) >= 1
    return None


BAD = [
    ("stamp", {"text": ""}, "params.text: a non-empty string is required"),
    ("stamp", {"text": "   "}, "params.text: a non-empty string is required"),
    ("stamp", {"text": "\u0001"}, "params.text: a non-empty string is required"),
    ("stamp", {"text": "\u0001\t\u007f "}, "params.text: a non-empty string is required"),
    ("stamp", {"text": "x" * 201}, "params.text: 201 characters is more than 200"),
    ("report", {"title": "  "}, "params.title: a non-empty string is required"),
    ("report", {"title": ""}, "params.title: a non-empty string is required"),
    # Control characters are dropped when drawn: this title would print as nothing at all
    ("report", {"title": "\u0007\u001b\u0000"}, "params.title: a non-empty string is required"),
    ("report", {"title": "T", "columns": []},
     "params.columns: expected a non-empty list of column names"),
]


@pytest.mark.parametrize(("kind", "params", "message"), BAD)
def test_validate_refuses_what_the_renderer_refuses(
    tmp_path: Path, inputs: dict[str, Path], kind: str, params: dict[str, Any], message: str
) -> None:
    assert validate(tmp_path, kind, inputs[kind], params) == [message]
    assert run(tmp_path, kind, inputs[kind], params) == message


GOOD = [
    ("stamp", {"text": "x" * 200}),
    ("stamp", {"text": " DRAFT\u0001 "}),  # control characters dropped, the rest is text
    ("stamp", {"text": "a" + "\u0001" * 300}),  # 1 character once they are dropped
    ("report", {"title": " Q3 "}),
    ("report", {"title": "Q3", "columns": ["amount"]}),
]


@pytest.mark.parametrize(("kind", "params"), GOOD)
def test_validate_accepts_what_the_renderer_renders(
    tmp_path: Path, inputs: dict[str, Path], kind: str, params: dict[str, Any]
) -> None:
    assert validate(tmp_path, kind, inputs[kind], params) == []
    assert run(tmp_path, kind, inputs[kind], params) is None


# -- messages quote a user's value, never all of it -----------------------------------------

LONG = "9" * 5_000


@pytest.mark.parametrize(
    ("params", "start"),
    [
        ({"text": "X", "position": LONG}, f"params.position: '{'9' * 40}…' is not one of"),
        ({"text": "X", "opacity": LONG}, f"params.opacity: expected a number, got '{'9' * 40}…'"),
        ({"text": "X", "font_size": 10**5_000}, "params.font_size: inf is not between 1 and 500"),
    ],
)
def test_stamp_messages_cut_long_values(
    tmp_path: Path, inputs: dict[str, Path], params: dict[str, Any], start: str
) -> None:
    message = run(tmp_path, "stamp", inputs["stamp"], params)
    assert message is not None and message.startswith(start) and len(message) < 200, message


def test_split_message_cuts_a_long_value(tmp_path: Path, inputs: dict[str, Path]) -> None:
    (tmp_path / "parts").mkdir()
    with pytest.raises(InvalidInput) as caught:
        pdfops.split([inputs["stamp"]], tmp_path / "parts", {"pages_per_part": LONG})
    assert str(caught.value) == f"params.pages_per_part: '{'9' * 40}…' is not a whole number >= 1"


def test_report_messages_cut_long_column_names(tmp_path: Path) -> None:
    long_name = "c" * 5_000
    source = tmp_path / "wide.csv"
    source.write_text(f"name,{long_name}\nA,x\n", encoding="utf-8")
    with pytest.raises(InvalidInput) as caught:
        report.render([source], tmp_path / "r.pdf", {"title": "T", "sort_by": LONG})
    assert str(caught.value) == (
        f"params.sort_by: no column '{'9' * 40}…' in the CSV (columns: name, {'c' * 40}…)"
    )
    with pytest.raises(InvalidInput) as caught:
        report.render([source], tmp_path / "r.pdf", {"title": "T", "chart": long_name})
    assert str(caught.value) == (
        f"params.chart: column '{'c' * 40}…' is not numeric (wide.csv line 2, column "
        f"'{'c' * 40}…': 'x' is not a number below 1e+30)"
    )
    source.write_text(f"{long_name},{long_name}\n", encoding="utf-8")
    with pytest.raises(InvalidInput) as caught:
        report.render([source], tmp_path / "r.pdf", {"title": "T"})
    assert str(caught.value) == f"wide.csv: header column '{'c' * 40}…' appears twice"
