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
