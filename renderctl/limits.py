"""The ranges of a job's limit fields, and the checks that hold values to them.

One source of truth for two doors: a manifest's ``memory_mb``, ``timeout_s`` and
``max_attempts`` (``manifest.FIELDS``), and the defaults for them that come from the
command line, ``RENDERCTL_<NAME>`` or a configuration file (``settings.KEYS``). A value one
door refuses must not get in through the other: a NaN timeout, say, is no timeout at all.
Stdlib only, so that ``settings`` (layer 0) may use it.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sys
from collections.abc import Callable
from typing import Any

MAX_MEMORY_MB = 1 << 20
# A job's limits when neither its manifest nor an option, variable or configuration file
# sets them (manifest.Limits; `--help` shows them).
DEFAULT_MEMORY_MB = 400
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MAX_ATTEMPTS = 3
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_ATTEMPTS = 100
# `run --workers`: each worker is a process (plus its job's tree) that the runner's one
# thread supervises: its pipe polled, its memory sampled every 50 ms, ~0.3-0.5 ms of runner
# CPU per job it finishes. Well before a few hundred workers that thread, not the workers,
# is the bottleneck, and a typo (100000) would fork until the machine's pid or memory limit.
# A fixed number rather than one from the core count: a configuration file valid on one
# machine stays valid on every other, and 256 is far above what this runner can keep busy
# on any machine it is likely to meet (the default is min(cores, budget / 400 MB)).
MAX_WORKERS = 256

Check = Callable[[Any], str | None]  # returns an error message, or None when fine


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    # Not math.isfinite() on an int: one past 1e308 (TOML and JSON hold any) cannot become a
    # float, and every int is finite; the range checks compare it exactly.
    return is_int(v) or (isinstance(v, float) and math.isfinite(v))


def is_integral(v: Any) -> bool:
    """An integer as JSON Schema counts them: 400 and 400.0 (a zero fraction), not True.

    Our schema (`renderctl schema`) says "integer", and a JSON writer may emit 400.0 for
    400; refusing what the schema accepts would make the schema lie."""
    return is_int(v) or (isinstance(v, float) and v.is_integer())


def int_range(lo: int, hi: int) -> Check:
    """Accepts what ``is_integral`` does: the caller stores the value with ``int()``."""

    def check(v: Any) -> str | None:
        if isinstance(v, float) and math.isfinite(v) and not v.is_integer():
            return f"must be an integer, got {v!r}"
        if not is_integral(v):
            return f"must be an integer, got {type_name(v)}"
        if not lo <= v <= hi:
            return f"must be between {lo} and {hi}, got {v}"
        return None

    return check


def check_timeout(v: Any) -> str | None:
    if isinstance(v, float) and not math.isfinite(v):
        return f"must be a finite number of seconds, got {v}"
    if not is_number(v):
        return f"must be a number of seconds, got {type_name(v)}"
    if not 0 < v <= MAX_TIMEOUT_S:
        return f"must be > 0 and <= {int(MAX_TIMEOUT_S)}, got {v}"
    return None


check_memory_mb = int_range(1, MAX_MEMORY_MB)


def check_workers(v: Any) -> str | None:
    """Only the ceiling: below 1 keeps the key's own "expected an integer >= 1"."""
    if is_int(v) and v > MAX_WORKERS:
        return f"must be at most {MAX_WORKERS} (one runner supervises every worker), got {v}"
    return None

check_max_attempts = int_range(1, MAX_ATTEMPTS)


def type_name(v: Any) -> str:
    """What a value is, in the words of a manifest's author (TOML/JSON, not Python)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, dict):
        return "a table"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, str):
        return "a string" if v else "an empty string"  # ("must be a non-empty string, got a
        # string" read as a contradiction: audit BL)
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, dt.datetime):
        return "a date-time"
    if isinstance(v, dt.date):
        return "a date"  # (TOML's 2030-01-01: a deadline needs its time and zone too)
    if isinstance(v, dt.time):
        return "a time"
    return type(v).__name__


# A TOML key or table header of more than this many dotted parts nests deeper than any
# document of ours may (manifest.MAX_NESTING). Refused before tomllib sees it: its time
# grows with the square of a key's parts (10,000 parts: 1.8 s; an 80 KB file: 43 s).
MAX_TOML_KEY_PARTS = 64
_DOTTED_RUN = re.compile(r"""(?:(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*')[ \t]*\.[ \t]*)"""
                         f"{{{MAX_TOML_KEY_PARTS}}}")


def toml_key_too_long(text: str) -> int | None:
    """The line (from 1) of the first run of more than MAX_TOML_KEY_PARTS dotted parts in
    TOML ``text``, or None. (A run inside a string value counts too: none that long is
    plausible.) Only lines with that many dots are searched (~3 ms for a 1 MB manifest;
    the search at every position took ~125 ms)."""
    if text.count(".") < MAX_TOML_KEY_PARTS:
        return None
    for number, line in enumerate(text.split("\n"), start=1):
        if line.count(".") >= MAX_TOML_KEY_PARTS and _DOTTED_RUN.search(line):
            return number
    return None


def number_text_error(exc: ValueError) -> str:
    """A parser's ValueError as a user reads it: CPython's limit on the digits of an int
    (4300) says to call sys.set_int_max_str_digits(), which is advice for programmers."""
    if "int_max_str_digits" in str(exc):
        return f"a number of more than {sys.get_int_max_str_digits()} digits"
    return str(exc)
