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
from renderctl.render import invoice, pdfops, report, safety

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
