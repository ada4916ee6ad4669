"""The renderer catalogue: built-in specs plus those other packages register.

Other packages add renderers through the entry-point group ``renderctl.renderers``; each
entry point must load to a ``RendererSpec``. Nothing here imports reportlab or pypdf.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import get_args

from renderctl.render import rules
from renderctl.render.base import ParamSpec, ParamType, RendererSpec
from renderctl.signalexit import SignalExit

# What one PDF pypdf writes can hold and still be checked: pypdf writes a document's pages
# as one /Kids array, and reading one back (the output check, a later job's input) stops at
# 100,000 elements in an array (its Configuration.array_maximum_element_count).
MAX_PAGES_PER_PDF = 100_000
MAX_PAGES_PER_PART = MAX_PAGES_PER_PDF

ENTRY_POINT_GROUP = "renderctl.renderers"

# `command` and `python` are run by the worker itself (argv / callable fields in the
# manifest); their specs exist so that `kinds` lists them and validation knows their shape.
BUILTIN: tuple[RendererSpec, ...] = (
    RendererSpec(
        kind="invoice",
        target="renderctl.render.invoice:render",
        description="An invoice from a JSON document (Decimal money, tax per rate, Page N of M).",
        min_inputs=1,
        max_inputs=1,
        params=(ParamSpec("title", "str", description="heading; default 'Invoice'",
                          check=rules.drawable_text),),
    ),
    RendererSpec(
        kind="report",
        target="renderctl.render.report:render",
        description="A multi-page table from a CSV file, with totals and an optional bar chart.",
        min_inputs=1,
        max_inputs=1,
        params=(
            ParamSpec("title", "str", required=True, description="report title",
                      check=rules.heading),
            ParamSpec("columns", "list[str]", description="columns to show, in order",
                      check=rules.column_names),
            ParamSpec("sort_by", "str", description="column to sort rows by"),
            ParamSpec("descending", "bool", description="sort descending"),
            ParamSpec("chart", "str", description="numeric column drawn as a bar chart"),
            ParamSpec("totals", "list[str]",
                      description="numeric columns to total, [] for none; default every"
                                  " numeric column but identifiers (id, number, code, year...)",
                      check=rules.total_names),
        ),
    ),
    RendererSpec(
        kind="merge",
        target="renderctl.render.pdfops:merge",
        description="Concatenate PDFs in order, one outline entry per input.",
        min_inputs=1,
    ),
    RendererSpec(
        kind="stamp",
        target="renderctl.render.pdfops:stamp",
        description="Draw a text stamp on every page of a PDF.",
        min_inputs=1,
        max_inputs=1,
        params=(
            ParamSpec("text", "str", required=True, check=rules.stamp_text,
                      description=f"the stamp text, one line of at most {rules.MAX_STAMP_TEXT}"
                                  " characters"),
            ParamSpec(
                "position",
                "str",
                description="where on the page (default center)",
                choices=("center", "top", "bottom", "top-left", "top-right", "bottom-left",
                         "bottom-right"),
            ),
            ParamSpec("opacity", "number", description="0 clear, 1 opaque; default 0.3", low=0,
                      high=1),
            ParamSpec("rotation", "number", description="degrees, default 45 at center",
                      low=-360, high=360),
            ParamSpec("font_size", "number", description="points, default 48", low=1,
                      high=500),
        ),
    ),
    RendererSpec(
        kind="split",
        target="renderctl.render.pdfops:split",
        description="Split one PDF into parts of N pages; the output is a folder.",
        min_inputs=1,
        max_inputs=1,
        params=(ParamSpec("pages_per_part", "int", description="pages per part, default 1",
                          low=1, high=MAX_PAGES_PER_PART),),
        output="dir",
    ),
    RendererSpec(
        kind="command",
        target="renderctl.worker:run_command",
        description="Run an argv (never a shell) with {input} {inputs} {output} placeholders.",
        open_params=True,
    ),
    RendererSpec(
        kind="python",
        target="renderctl.worker:run_callable",
        description="Call module:function(inputs, output, params) in the worker.",
        open_params=True,
    ),
)
# Their kinds: the ones no plugin provides (the runner re-checks only plugin params at a
# claim; a worker imports user code for the others).
BUILTIN_KINDS = frozenset(spec.kind for spec in BUILTIN)


@functools.cache
def all_specs() -> Mapping[str, RendererSpec]:
    """Every renderer by kind: built-ins first; a plugin cannot shadow a built-in.

    Cached per process: scanning installed packages' entry points costs ~2 ms, which a
    one-job API submit would otherwise pay every time."""
    return _Specs()


def rescanned_specs() -> Mapping[str, RendererSpec]:
    """The catalogue read afresh: for a long-lived runner meeting a kind it does not know
    (a plugin installed since it started, which `submit` already validated against)."""
    import importlib

    all_specs.cache_clear()
    importlib.invalidate_caches()
    # (A plugin imported already is not imported again: an upgraded one is read as it was.
    # Forgetting its modules to re-import them broke a plugin with a C extension for good,
    # and re-ran every plugin's set-up at each read: review FA. The runner is restarted
    # after an upgrade that changes a spec, as README says.)
    return all_specs()


def clashes(kinds: Iterable[str]) -> dict[str, str]:
    """For each of ``kinds`` that two plugins register: which one is used, which left out
    (said by `kinds` only, before: a job's params were then refused against the other
    plugin's spec, nothing said of why; audit CS). Scans the plugins only if one of
    ``kinds`` is not built in."""
    specs = all_specs()
    assert isinstance(specs, _Specs)
    wanted = [k for k in kinds if k not in BUILTIN_KINDS]
    if not wanted:
        return {}
    specs._everything()
    return {k: f"kind {k!r} is registered by more than one plugin: {specs[k].target} is "
               f"used, not {', '.join(specs.clashes[k])}"
            for k in wanted if k in specs.clashes and k in specs}


def catalogue_stamp() -> tuple[tuple[str, int], ...]:
    """The modification times of the folders on sys.path (~20 stats): installing a
    distribution adds its dist-info folder to one of them, so a stamp unchanged since the
    last scan means no plugin was installed since (a cheap test before a scan: review CT)."""
    import os
    import sys

    stamp = []
    for entry in sys.path:
        try:
            stamp.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            continue
    return tuple(stamp)


def unknown_kind_note() -> str:
    """What to add to "unknown kind": the plugins that failed to load, whose kind it may
    be (said only by `kinds` before: audit CS)."""
    broken = broken_plugins()
    if not broken:
        return ""
    return "; renderer plugins that failed to load: " + "; ".join(broken)


_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
_PARAM_TYPES = frozenset(get_args(ParamType))


def _spec_problem(spec: RendererSpec) -> str | None:
    """What makes a plugin's spec unusable, checked once at registration: a malformed one
    made `kinds` and validation end in a traceback for every kind (audit CS)."""
    if not isinstance(spec.kind, str) or not spec.kind or len(spec.kind) > 64 \
            or not spec.kind.isprintable() or spec.kind != spec.kind.strip():
        # (Printable: a kind with an escape sequence was written raw to the terminal by
        # `kinds`. Not stricter: a manifest's kind may be any such string.)
        return (f"kind {spec.kind!r} is not a printable name of 1 to 64 characters without "
                "spaces at its ends")
    if not isinstance(spec.target, str) or not _TARGET.fullmatch(spec.target):
        return f"target {spec.target!r} is not 'package.module:function'"
    if not isinstance(spec.description, str):
        return f"description is a {type(spec.description).__name__}, not a str"
    lo, hi = spec.min_inputs, spec.max_inputs
    if type(lo) is not int or lo < 0 or (hi is not None and (type(hi) is not int or hi < lo)):
        return f"min_inputs {lo!r} and max_inputs {hi!r} are not 0 <= min <= max"
    if spec.output not in ("file", "dir"):
        return f"output {spec.output!r} is neither 'file' nor 'dir'"
    if not isinstance(spec.params, tuple | list):
        return f"params is a {type(spec.params).__name__}, not a tuple of ParamSpec"
    names: set[str] = set()
    for p in spec.params:
        if not isinstance(p, ParamSpec):
            return f"params holds a {type(p).__name__}, not a ParamSpec"
        if not isinstance(p.name, str) or not p.name.isidentifier():
            return f"param name {p.name!r} is not an identifier"
        if p.name in names:
            return f"param {p.name!r} is declared twice"
        names.add(p.name)
        if p.type not in _PARAM_TYPES:
            return (f"param {p.name!r}: type {p.type!r} is not one of "
                    f"{', '.join(sorted(_PARAM_TYPES))}")
        if not isinstance(p.choices, tuple | list) or not all(
                isinstance(c, str) for c in p.choices):
            return f"param {p.name!r}: choices must be strings"
        if p.check is not None and not callable(p.check):
            return f"param {p.name!r}: check is not callable"
        # (audit EY: a str bound was a traceback in `kinds`, NaN bounds refused every value
        # and printed invalid JSON in `schema`, low > high refused every value)
        for bound in ("low", "high"):
            v = getattr(p, bound)
            if v is not None and (not isinstance(v, int | float) or isinstance(v, bool)
                                  or not math.isfinite(v)
                                  or p.type not in ("int", "float", "number")):
                return (f"param {p.name!r}: {bound} {v!r} is not a finite number of a "
                        "numeric param")
        if p.low is not None and p.high is not None and p.low > p.high:
            return f"param {p.name!r}: low {p.low!r} is above high {p.high!r}"
        if p.choices and p.type != "str":
            return f"param {p.name!r}: choices are for a str param, not {p.type}"
        if type(p.required) is not bool:
            return f"param {p.name!r}: required {p.required!r} is not True or False"
        if not isinstance(p.description, str):
            return f"param {p.name!r}: description is a {type(p.description).__name__}"
    if type(spec.open_params) is not bool:
        return f"open_params {spec.open_params!r} is not True or False"
    return None


class _QuietStderr:
    """What a plugin prints as it is imported, to stderr, where a write that fails (a closed
    pipe, a detached stream) is dropped: it made the plugin "broken" (review EZ: EPIPE
    dead-lettered its jobs)."""

    def write(self, text: str) -> int:
        import sys

        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        import sys

        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()


PLUGIN_LOAD_S = 30.0  # a plugin's import longer than this is given up (see _guarded_load)
PLUGIN_LOAD_ENV = "RENDERCTL_PLUGIN_LOAD_S"  # (tests: a shorter bound)


def _load_bound() -> float:
    import os

    try:
        bound = float(os.environ.get(PLUGIN_LOAD_ENV) or PLUGIN_LOAD_S)
    except ValueError:
        return PLUGIN_LOAD_S
    return bound if 0 < bound < 86400 else PLUGIN_LOAD_S


class PluginLoadTimeout(Exception):
    """A plugin's import did not finish within PLUGIN_LOAD_S."""


@contextlib.contextmanager
def _guarded_load() -> Iterator[None]:
    """Around a plugin's import (audit EY): what it prints goes to stderr (`submit --json`'s
    stdout was no longer JSON); a crash in it is reported with its file and line
    (faulthandler: a segfault at import was exit 139 and not a word); and an import that
    blocks is given up after PLUGIN_LOAD_S, where this is the main thread (a --follow
    runner's rescan meeting such a plugin stopped every kind, SIGTERM included, for good).
    A C loop that never returns to Python is not interrupted."""
    import faulthandler
    import signal
    import threading
    import time

    enabled = faulthandler.is_enabled()
    if not enabled:
        with contextlib.suppress(Exception):
            faulthandler.enable()
    main = threading.current_thread() is threading.main_thread()
    if main:
        bound = _load_bound()

        def expire(signum: int, frame: object) -> None:
            raise PluginLoadTimeout(f"its import took longer than {bound:g} s")

        prior = signal.signal(signal.SIGALRM, expire)
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
        timer = signal.setitimer(signal.ITIMER_REAL, bound)
        began = time.monotonic()
    try:
        with contextlib.redirect_stdout(_QuietStderr()):
            yield
    finally:
        if main:
            # A caller's own timer goes on where it was, less the load's time (put back as
            # it was at the start, it ran late by that: review EZ); one due meanwhile fires
            # at once.
            delay, interval = timer
            if delay:
                delay = max(delay - (time.monotonic() - began), 1e-6)
            signal.setitimer(signal.ITIMER_REAL, delay, interval)
            signal.signal(signal.SIGALRM, prior)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if not enabled:
            with contextlib.suppress(Exception):
                faulthandler.disable()


def broken_plugins() -> list[str]:
    """Each renderer plugin whose entry point could not be loaded, as "name (value): why"
    (scanning the installed plugins, once per process, if that was not done yet)."""
    specs = all_specs()
    assert isinstance(specs, _Specs)
    specs._everything()
    return list(specs.broken)


class _Specs(Mapping[str, RendererSpec]):
    """A built-in kind is answered at once; installed plugins are looked for only when a
    kind is not built in, or the whole catalogue is asked for (``kinds``, the list an
    unknown kind's error shows). importlib.metadata and the scan cost ~30 ms, a tenth of a
    one-job `renderctl submit`, which nearly always names built-in kinds."""

    def __init__(self) -> None:
        self._builtin = {spec.kind: spec for spec in BUILTIN}
        self._all: dict[str, RendererSpec] | None = None
        # Entry points that could not be loaded, as "name (value): why", for `kinds`
        self.broken: list[str] = []
        # Plugin kinds another plugin also registered: kind -> the targets left out
        self.clashes: dict[str, list[str]] = {}

    def __getitem__(self, kind: str) -> RendererSpec:
        spec = self._builtin.get(kind)
        return spec if spec is not None else self._everything()[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._everything())

    def __len__(self) -> int:
        return len(self._everything())

    def _everything(self) -> dict[str, RendererSpec]:
        if self._all is None:
            from importlib.metadata import entry_points

            specs = dict(self._builtin)
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    with _guarded_load():
                        spec = ep.load()
                except SignalExit:
                    raise  # a stop signal, not the plugin's doing
                except (Exception, SystemExit) as exc:  # a broken plugin must not break
                    # the CLI, nor a runner (a sys.exit() at import ended a run midway,
                    # nothing said of which plugin; audit CS). (A KeyboardInterrupt is the
                    # user's Ctrl-C.)
                    self.broken.append(f"{ep.name} ({ep.value}): {type(exc).__name__}: "
                                       f"{str(exc)[:250]}; its kind is not available")
                    continue
                if not isinstance(spec, RendererSpec):
                    self.broken.append(f"{ep.name} ({ep.value}): not a RendererSpec, a "
                                       f"{type(spec).__name__}; its kind is not available")
                elif (problem := _spec_problem(spec)) is not None:
                    self.broken.append(f"{ep.name} ({ep.value}): {problem}; its kind is not "
                                       "available")
                elif spec.kind in specs:
                    # (Ignored without a word, its author never learnt why it never ran:
                    # audit BQ.) The first keeps the kind: a built-in, or the plugin
                    # found first.
                    taken = ("a built-in renderer" if spec.kind in self._builtin
                             else f"another plugin ({specs[spec.kind].target})")
                    if spec.kind not in self._builtin:
                        self.clashes.setdefault(spec.kind, []).append(spec.target)
                    self.broken.append(f"{ep.name} ({ep.value}): kind {spec.kind!r} is "
                                       f"{taken}'s already; this one is not registered")
                else:
                    specs[spec.kind] = spec
            self._all = specs
        return self._all
