"""Shared fixtures: a queue folder, an output root and a manifest writer, all under tmp_path.

Helpers that many test modules need live here as fixtures (so no test imports conftest).
"""

from __future__ import annotations

import compileall
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

ManifestWriter = Callable[..., Path]

# Tests, and the renderctl processes they start, run this checkout's code rather than
# whichever renderctl is installed: a second worktree (or a clone beside an editable install
# of another one) would otherwise test its own tests against someone else's code.
CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
# Those processes (thousands per run: each test starts renderctl, its fork server and
# workers) read renderctl's bytecode if it is there, but where PYTHONDONTWRITEBYTECODE is set
# (as on this machine) none of them writes it, and each compiled renderctl's
# 15,000 lines from source again (measured: 10% of the CPU of a test run). So compile it once
# here (a no-op when up to date; each file is written atomically, so xdist's workers
# doing it at once is safe), into the __pycache__ folders git ignores.
compileall.compile_dir(CHECKOUT / "renderctl", quiet=1)


def to_toml(value: Any) -> str:
    """One TOML value (inline form) for the plain data a manifest holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(to_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(k)} = {to_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def manifest_text(jobs: Sequence[Mapping[str, Any]], *, defaults: Mapping[str, Any] | None = None,
                  fmt: str = "toml") -> str:
    """A manifest document, as TOML (``[defaults]`` + ``[[jobs]]``) or JSON."""
    if fmt == "json":
        doc: dict[str, Any] = {"jobs": [dict(j) for j in jobs]}
        if defaults is not None:
            doc["defaults"] = dict(defaults)
        return json.dumps(doc)
    lines: list[str] = []
    if defaults is not None:
        lines.append("[defaults]")
        lines += [f"{json.dumps(k)} = {to_toml(v)}" for k, v in defaults.items()]
    for job in jobs:
        lines.append("[[jobs]]")
        lines += [f"{json.dumps(k)} = {to_toml(v)}" for k, v in job.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(autouse=True, scope="session")
def _children_get_default_signals() -> None:
    """renderctl keeps ignoring a stop signal its parent left ignored (`nohup`: SIGHUP): a
    test run started so (`nohup pytest`, a CI step in the background) would hand that on to
    every runner it starts, and the tests of SIGHUP, SIGINT, Ctrl-\\ and Ctrl-Z would see
    nothing happen. (A shell without job control starts `cmd &` with SIGINT and SIGQUIT
    ignored: `pytest ... &` in a script.) A handler of our own (a no-op: the test process
    ignores them still) is reset to the default in every child at exec; the tests of the
    ignoring start their own."""
    # The runner's own list, so a stop signal added there is covered here too (collection
    # imports renderctl.runner in every worker anyway).
    from renderctl.runner import STOP_SIGNALS

    for sig in (*STOP_SIGNALS, signal.SIGTSTP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, _ignore)


def _ignore(signum: int, frame: object) -> None:
    pass


@pytest.fixture(autouse=True, scope="session")
def _scratch_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """TMPDIR, for this run and every process it starts, is a folder of the run's own.

    Many tests SIGKILL a runner on purpose and never restart it on that queue, so its work
    folders and fork-server socket folder stay behind (a runner clears them on its next start
    on the same queue). In /tmp they would pile up run after run; under pytest's basetemp they
    go when pytest rotates it. A test that needs another TMPDIR passes its own in env."""
    scratch = tmp_path_factory.mktemp("tmpdir", numbered=False)
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # gettempdir() caches: make it read TMPDIR again
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None


@pytest.fixture
def queue_dir(tmp_path: Path) -> Path:
    """Where a test's queue lives (not created: `Queue(queue_dir)` creates it)."""
    return tmp_path / "queue"


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    """The output root of a test's jobs."""
    return tmp_path / "out"


@pytest.fixture
def write_manifest(tmp_path: Path) -> ManifestWriter:
    """``write_manifest(jobs, defaults=None, name="jobs.toml", folder=tmp_path) -> Path``.

    The format follows the name's suffix (``.toml`` or ``.json``).
    """

    def write(jobs: Sequence[Mapping[str, Any]], *, defaults: Mapping[str, Any] | None = None,
              name: str = "jobs.toml", folder: Path | None = None) -> Path:
        path = (folder or tmp_path) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fmt = "json" if name.endswith(".json") else "toml"
        path.write_text(manifest_text(jobs, defaults=defaults, fmt=fmt), encoding="utf-8")
        return path

    return write


@pytest.fixture
def decompression_bomb(tmp_path: Path) -> Path:
    """tmp_path/bomb.pdf: one page whose content stream inflates to 60 MB (above the 50 MB
    renderctl allows pypdf; pypdf's own default lets it through), under 200 KB on disk."""
    import io
    import zlib

    from pypdf import PdfWriter
    from pypdf.generic import NameObject, StreamObject

    writer = PdfWriter()
    page = writer.add_blank_page(width=200, height=200)
    bomb = StreamObject()
    bomb._data = zlib.compress(b" " * 60_000_000, 9)
    bomb[NameObject("/Filter")] = NameObject("/FlateDecode")
    page[NameObject("/Contents")] = writer._add_object(bomb)
    buf = io.BytesIO()
    writer.write(buf)
    source = tmp_path / "bomb.pdf"
    source.write_bytes(buf.getvalue())
    return source


@pytest.fixture
def renderctl_argv() -> list[str]:
    """The command that runs the CLI in a child process with this interpreter."""
    return [sys.executable, "-m", "renderctl.cli.app"]


# The longest tests first: pytest-xdist hands tests out in collection order, and the
# queue model (~50-100 s), collected last (tests/unit), ran alone at the end of CI while
# the other workers idled. Started first, the short tests fill the other workers around it.
LONGEST = ("test_queue_model.py::test_queue_model::",
           "test_submit_crash.py::test_killed_submit_is_all_or_nothing",
           "test_run_crash.py::test_runner_killed_at_random_moments")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, name in enumerate(LONGEST) if name in item.nodeid), len(LONGEST))

    items.sort(key=rank)  # (stable: the rest keep their order)
