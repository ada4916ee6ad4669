"""Hostile inputs to the built-in renderers, through real `renderctl run` processes.

DESIGN.md: an input no retry can fix (unreadable data, a schema error in the input) is
`invalid_input`, dead-lettered after one attempt, with a message naming what is wrong; a
`failed` attempt is retried. Each test here is an input the renderers once got wrong.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from jobfns import QueueView, cli_args, run_cli
from pypdf import PdfReader

FAST = ("--workers", "1", "--backoff-base", "0.01")
SAMPLES = Path(__file__).resolve().parents[2] / "sample-inputs"


def invoice_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SAMPLES / "invoices" / "0001.json").read_text())
    return copy.deepcopy(doc)


def run_jobs(folder: Path, jobs: list[dict[str, Any]]) -> tuple[QueueView, Path, str]:
    """Run ``jobs`` (max 3 attempts each) to the end; the queue, output root and stdout."""
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"defaults": {"max_attempts": 3}, "jobs": jobs}))
    queue, out = folder / "q", folder / "out"
    res = run_cli("run", manifest, *cli_args(queue, out, *FAST), timeout=120)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    return QueueView(queue), out, res.stdout


def test_an_invoice_number_whose_exponent_decimal_cannot_hold_is_dead_at_once(
        tmp_path: Path) -> None:
    # Given an invoice whose quantity is a valid JSON number with an exponent beyond what
    # Decimal can represent (it raises InvalidOperation, not ValueError), and a sound invoice
    raw = json.dumps(invoice_doc())
    assert '"quantity": 2,' in raw
    (tmp_path / "exp.json").write_text(
        raw.replace('"quantity": 2,', '"quantity": 1e99999999999999999999,', 1))
    (tmp_path / "fine.json").write_text(raw)

    # When both run
    qv, out, _ = run_jobs(tmp_path, [
        {"id": "exp", "kind": "invoice", "input": "exp.json", "output": "exp.pdf"},
        {"id": "fine", "kind": "invoice", "input": "fine.json", "output": "fine.pdf"},
    ])

    # Then the bad one is invalid_input after one attempt, saying which file and why
    attempts = qv.record("dead", "exp")["attempts"]
    assert [a["outcome"] for a in attempts] == ["invalid_input"]
    assert "exp.json: not valid JSON" in attempts[0]["error"]
    assert "number" in attempts[0]["error"]
    assert not (out / "exp.pdf").exists()
    # And the other job is untouched by it
    assert qv.states_of(["fine"]) == {"fine": ["done"]}


def hand_made_pdf(path: Path, *, content_filter: str = "", trailer: str = "",
                  extra: tuple[bytes, ...] = ()) -> Path:
    """A one-page PDF written byte by byte (classic xref), so that it can hold what no
    writer library would produce: ``content_filter`` on the page's content stream,
    ``extra`` objects numbered from 6, ``trailer`` entries."""
    content = b"BT /F1 12 Tf 72 720 Td (hand made) Tj ET"
    stream_dict = f"<< /Length {len(content)} {content_filter} >>".encode()
    bodies = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
        stream_dict + b"\nstream\n" + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        *extra,
    ]
    data = b"%PDF-1.7\n"
    offsets = []
    for number, body in enumerate(bodies, 1):
        offsets.append(len(data))
        data += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(data)
    data += f"xref\n0 {len(bodies) + 1}\n0000000000 65535 f \n".encode()
    data += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    data += (f"trailer\n<< /Size {len(bodies) + 1} /Root 1 0 R {trailer} >>\n"
             f"startxref\n{xref}\n%%EOF\n").encode()
    path.write_bytes(data)
    return path


def test_a_pdf_pypdf_cannot_open_is_dead_at_once(tmp_path: Path) -> None:
    # Given a PDF encrypted for certificate holders (the public-key handler, which pypdf
    # refuses with NotImplementedError while opening), one whose page content uses a filter
    # no reader knows (which a stamp leaves as it is, as merge and split do: the stamp is
    # drawn after the page's content, never decoded), and a sound PDF
    hand_made_pdf(tmp_path / "pubsec.pdf", trailer="/Encrypt 6 0 R /ID [<01> <01>]",
                  extra=(b"<< /Filter /Adobe.PubSec /SubFilter /adbe.pkcs7.s5 /V 4 >>",))
    hand_made_pdf(tmp_path / "filter.pdf", content_filter="/Filter /NoSuchDecode")
    hand_made_pdf(tmp_path / "fine.pdf")
    jobs: list[dict[str, Any]] = [
        {"id": f"pubsec-{kind}", "kind": kind, "input": "pubsec.pdf",
         "output": f"pubsec-{kind}" + ("" if kind == "split" else ".pdf"),
         **({"params": {"text": "PAID"}} if kind == "stamp" else {})}
        for kind in ("merge", "stamp", "split")
    ]
    jobs += [
        {"id": "filter-stamp", "kind": "stamp", "input": "filter.pdf",
         "output": "filter.pdf", "params": {"text": "PAID"}},
        {"id": "fine", "kind": "stamp", "input": "fine.pdf", "output": "fine.pdf",
         "params": {"text": "PAID"}},
    ]

    # When they run
    qv, out, _ = run_jobs(tmp_path, jobs)

    # Then each unusable one is invalid_input after one attempt, saying what is wrong
    for kind in ("merge", "stamp", "split"):
        attempts = qv.record("dead", f"pubsec-{kind}")["attempts"]
        assert [a["outcome"] for a in attempts] == ["invalid_input"], attempts
        assert "pubsec.pdf: encrypted PDF" in attempts[0]["error"]
    # And the page in an unknown filter is stamped, its content kept as it was
    assert qv.states_of(["filter-stamp"]) == {"filter-stamp": ["done"]}
    kept = PdfReader(out / "filter.pdf").pages[0]["/Contents"][1].get_object()
    assert kept["/Filter"] == "/NoSuchDecode"
    # And the sound one is stamped
    assert qv.states_of(["fine"]) == {"fine": ["done"]}
    reader = PdfReader(out / "fine.pdf")
    assert len(reader.pages) == 1
    assert "PAID" in reader.pages[0].extract_text()


def test_a_chart_of_values_too_small_to_scale_is_dead_at_once(tmp_path: Path) -> None:
    # Given CSVs whose charted values are all nearer zero than a float axis can divide
    # (reportlab's tick arithmetic turns them into NaN or a division by zero), and one
    # whose tiny value sits next to ordinary ones
    (tmp_path / "tiny.csv").write_text("name,v\nr1,1e-320\nr2,2e-320\n")
    (tmp_path / "edge.csv").write_text("name,v\nr1,2.3e-308\nr2,-2.3e-308\n")
    (tmp_path / "mixed.csv").write_text("name,v\nr1,1e-320\nr2,3\n")
    jobs = [
        {"id": name, "kind": "report", "input": f"{name}.csv", "output": f"{name}.pdf",
         "params": {"title": "Small", "chart": "v"}}
        for name in ("tiny", "edge", "mixed")
    ]

    # When they run
    qv, out, _ = run_jobs(tmp_path, jobs)

    # Then the two that cannot be charted are invalid_input after one attempt, naming the
    # param, the column and a value
    for name, value in (("tiny", "2e-320"), ("edge", "2.3e-308")):
        attempts = qv.record("dead", name)["attempts"]
        assert [a["outcome"] for a in attempts] == ["invalid_input"], attempts
        error = attempts[0]["error"]
        assert "params.chart: column 'v'" in error and value in error, error
        assert not (out / f"{name}.pdf").exists()
    # And the chart whose scale is ordinary is drawn, with its table
    assert qv.states_of(["mixed"]) == {"mixed": ["done"]}
    reader = PdfReader(out / "mixed.pdf")
    assert len(reader.pages) == 1
    text = reader.pages[0].extract_text()
    assert "1e-320" in text and "Total" in text


def test_a_pdf_larger_than_the_jobs_memory_ceiling_is_dead_at_once(tmp_path: Path) -> None:
    # Given a 300 MB input (sparse: a header, then nothing) for a stamp under a 100 MB
    # ceiling, and a sound PDF under the same ceiling
    with (tmp_path / "big.pdf").open("wb") as fh:
        fh.write(b"%PDF-1.7\n")
        fh.truncate(300 << 20)
    hand_made_pdf(tmp_path / "fine.pdf")

    # When they run
    qv, out, _ = run_jobs(tmp_path, [
        {"id": j, "kind": "stamp", "input": f"{j}.pdf", "output": f"{j}.pdf",
         "params": {"text": "PAID"}, "memory_mb": 100} for j in ("big", "fine")])

    # Then the big one is invalid_input at its first attempt, saying why (each attempt read
    # it until the ceiling killed it: `memory`, retried, naming no file), and the other is
    # stamped
    attempts = qv.record("dead", "big")["attempts"]
    assert [a["outcome"] for a in attempts] == ["invalid_input"], attempts
    assert "big.pdf: 300 MB; a PDF is read whole, and this job's memory ceiling is 100 MB" \
        in attempts[0]["error"], attempts
    assert qv.states_of(["fine"]) == {"fine": ["done"]}
