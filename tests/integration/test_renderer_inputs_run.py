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
