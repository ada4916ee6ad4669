"""Job functions for the fault demo (``jobs/faults.toml``): python-kind jobs that misbehave.

The manifest's folder (``jobs/``) is put first on ``sys.path`` for python-kind jobs, so the
manifest names these as ``callable = "faultfns:<name>"``. Each is called inside a renderctl
worker as ``fn(inputs, output, params)``; ``output`` is the temporary path to write, and the
worker sets ``RENDERCTL_ATTEMPT`` to the attempt number (1, 2, ...).

- ``hog``: grows memory until its ceiling kills it (outcome ``memory``).
- ``hang``: never returns (outcome ``timeout``).
- ``crash_once``: SIGKILLs itself on attempt 1 (outcome ``crashed``), succeeds on a retry.
- ``ok``: writes a one-page PDF.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MB = 1024 * 1024
PAGE = 4096
CHUNK_MB = 10


def _one_page_pdf(output: Path, text: str) -> None:
    """Write a one-page PDF holding ``text`` at ``output`` (reportlab's canvas)."""
    from reportlab.pdfgen import canvas

    c = canvas.Canvas(str(output))
    c.drawString(72, 720, text)
    c.showPage()
    c.save()


def ok(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """A well-behaved job: a one-page PDF with ``params["text"]`` (default: the job id)."""
    _one_page_pdf(output, str(params.get("text", os.environ.get("RENDERCTL_JOB_ID", "ok"))))


def hog(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Allocate ``params["mb"]`` MB in 10 MB chunks, touching every page so it is resident.

    Meant to cross the job's ``memory_mb`` ceiling and be killed by it (outcome ``memory``).
    Should it finish anyway (ceiling above ``mb``), it writes a PDF like any job.
    """
    total_mb = int(params.get("mb", 1000))
    chunks: list[bytearray] = []
    for _ in range(total_mb // CHUNK_MB):
        b = bytearray(CHUNK_MB * MB)
        for j in range(0, len(b), PAGE):
            b[j] = 1  # touch every page: untouched pages are never charged
        chunks.append(b)
    _one_page_pdf(output, f"allocated {len(chunks) * CHUNK_MB} MB and survived")


def hang(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Sleep forever: only the job's ``timeout_s`` ends it (outcome ``timeout``)."""
    threading.Event().wait()


def crash_once(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None:
    """Attempt 1: SIGKILL our own process (outcome ``crashed``, as an OOM kill or a segfault
    in a C library would look). Later attempts: a one-page PDF "recovered on attempt N"."""
    attempt = os.environ.get("RENDERCTL_ATTEMPT", "?")
    if attempt == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    _one_page_pdf(output, f"recovered on attempt {attempt}")
