"""An input that stopped being a regular file after validation is refused at once.

Validation checks that every input is a regular file, but the job runs later: a FIFO put at
that path since would block the renderer until its timeout (then again on every retry), and
a device such as /dev/zero would be read until the memory ceiling killed the job."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from renderctl.errors import InvalidInput
from renderctl.render import inputs, invoice, pdfops, report, safety

RENDERERS: dict[str, tuple[Callable[..., None], dict[str, Any]]] = {
    "invoice": (invoice.render, {}),
    "report": (report.render, {"title": "T"}),
    "merge": (pdfops.merge, {}),
    "stamp": (pdfops.stamp, {"text": "X"}),
    "split": (pdfops.split, {}),
}


@pytest.fixture(autouse=True)
def _hardened() -> None:
    safety.harden()


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    # A renderer that blocks on the FIFO fails the test after 5 s instead of hanging it
    # (pytest.fail: a BaseException, which no renderer's OSError handler can swallow), and
    # one that reads /dev/zero hits an address-space limit instead of eating the machine.
    def fail(*_: object) -> None:
        pytest.fail("the renderer blocked on its input")

    previous = signal.signal(signal.SIGALRM, fail)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (1 << 30), limits[1]))
    signal.alarm(5)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, limits)
        signal.signal(signal.SIGALRM, previous)


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "in.data"
    os.mkfifo(path)
    return path


def _device(tmp_path: Path) -> Path:
    path = tmp_path / "in.data"
    path.symlink_to("/dev/zero")
    return path


def _folder(tmp_path: Path) -> Path:
    path = tmp_path / "in.data"
    path.mkdir()
    return path


@pytest.mark.parametrize("make", [_fifo, _device, _folder], ids=["fifo", "device", "folder"])
@pytest.mark.parametrize("kind", list(RENDERERS))
def test_an_input_that_is_not_a_regular_file_is_invalid_input(
    tmp_path: Path, kind: str, make: Callable[[Path], Path]
) -> None:
    source = make(tmp_path)
    render, params = RENDERERS[kind]
    output = tmp_path / "out"
    if kind == "split":
        output.mkdir()
    with pytest.raises(InvalidInput, match=r"in\.data: not a regular file"):
        render([source], output, params)


def _judged_while_written(path: Path, verdict: Exception | None) -> None:
    """Read ``path`` through open_input while something appends to it, then end the block
    with ``verdict`` (raised) or normally."""
    with inputs.open_input(path, "in.pdf") as (fh, _size):
        fh.read()
        with path.open("ab") as other:  # a writer rewriting the file in place, meanwhile
            other.write(b"more")
        if verdict is not None:
            raise verdict


@pytest.mark.parametrize("verdict", [InvalidInput("in.pdf: truncated PDF"), None],
                         ids=["judged-invalid", "read-whole"])
def test_an_input_written_to_while_it_is_read_is_tried_again_not_judged(
        tmp_path: Path, verdict: Exception | None) -> None:
    # Given an input that changes while a renderer reads it (and judges it truncated, or
    # reads it whole: a mix of the old file and the new)
    path = tmp_path / "in.pdf"
    path.write_bytes(b"%PDF-1.7 half")

    # Then the attempt fails as a changed input, to be tried again: it was dead-lettered as
    # truncated, invalid input, never retried (audit DU)
    with pytest.raises(inputs.InputChanged, match=r"in\.pdf: changed while it was read"):
        _judged_while_written(path, verdict)


def test_an_input_whose_bytes_stay_as_they_were_keeps_its_verdict(tmp_path: Path) -> None:
    path = tmp_path / "in.pdf"
    path.write_bytes(b"%PDF-1.7 half")
    with pytest.raises(InvalidInput, match="truncated"), \
            inputs.open_input(path, "in.pdf") as (fh, _size):
        fh.read()
        # Only its metadata changes meanwhile (its ctime: review DX saw each of these
        # taken for a change of the file, and the attempt charged)
        os.chmod(path, 0o600)
        os.link(path, tmp_path / "again.pdf")
        os.utime(path, ns=(0, path.stat().st_mtime_ns))
        raise InvalidInput("in.pdf: truncated PDF")
