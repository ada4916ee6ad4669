"""Manifests -> validated, frozen ``JobSpec`` values; every problem reported at once.

A manifest is TOML (or JSON) with an optional ``[defaults]`` table and ``[[jobs]]``. Each
field has one entry in ``FIELDS``; the same table drives validation and ``renderctl schema``,
so the two cannot drift. Validation is all-or-nothing per command: ``load_manifests`` either
returns every job of every file or raises ``ManifestError`` listing each problem with its
file, job (id or index) and field.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import keyword
import math
import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from renderctl.errors import ManifestError, Problem
from renderctl.limits import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MEMORY_MB,
    DEFAULT_TIMEOUT_S,
    MAX_ATTEMPTS,
    MAX_MEMORY_MB,
    MAX_TIMEOUT_S,
    MAX_TOML_KEY_PARTS,
    Check,
    check_max_attempts,
    check_memory_mb,
    check_timeout,
    int_range,
    is_int,
    is_number,
    number_text_error,
    toml_key_too_long,
    type_name,
)
from renderctl.render.base import ParamSpec, RendererSpec
from renderctl.render.registry import all_specs, unknown_kind_note
from renderctl.signalexit import SignalExit

MAX_MANIFEST_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
# What [defaults] params may be (each job's record holds a copy), and come to in all.
MAX_SHARED_PARAMS_BYTES = MIB
MAX_EXPANDED_PARAMS_BYTES = 1024 * MIB
MAX_JOBS_PER_MANIFEST = 100_000
MAX_DEPTH = 8
MAX_STRING = 16 * 1024
MAX_PATH_BYTES = 4096
MAX_SEGMENT_BYTES = 255
MAX_INPUTS = 1000
MAX_ARGV = 1000
MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: one argument, its NUL included

ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
GROUP_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
# The schema's shape of a callable, ASCII (JSON Schema's patterns know no Unicode letters);
# validate also takes names in other scripts, as Python does (see _check_callable).
CALLABLE_RE = re.compile(rf"{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*")
# Temporaries beside outputs start with this; a user output must not look like one.
RESERVED_PREFIX = ".rctl-"
# The longest name renderctl gives an output's temporary (publish.staging_name of
# publish.tmp_output_path: ".rctl-<16 hex>-<16 hex>.w.tmp"), for the whole-path check.
TEMP_NAME_BYTES = len(RESERVED_PREFIX) + 16 + 1 + 16 + len(".w.tmp")


@dataclass(frozen=True)
class Limits:
    """Built-in defaults for the limit fields; CLI options replace these (manifests win)."""

    memory_mb: int = DEFAULT_MEMORY_MB
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    priority: int = 0
    group: str = "default"


@dataclass(frozen=True)
class JobSpec:
    """One validated job, as accepted into the queue. Equal specs mean 'already accepted'."""

    id: str
    kind: str
    output: str  # relative, normalised, confined to out_root
    out_root: str  # absolute
    inputs: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] | None = None
    callable: str | None = None
    pythonpath: str | None = None
    memory_mb: int = Limits.memory_mb
    timeout_s: float = Limits.timeout_s
    max_attempts: int = Limits.max_attempts
    priority: int = Limits.priority
    group: str = Limits.group
    deadline: float | None = None  # epoch seconds

    def to_json(self) -> dict[str, Any]:
        """The canonical JSON form stored in the queue (and compared for 'same spec')."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "inputs": list(self.inputs),
            "output": self.output,
            "out_root": self.out_root,
            "params": dict(self.params),
            "memory_mb": self.memory_mb,
            "timeout_s": self.timeout_s,
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "group": self.group,
        }
        if self.argv is not None:
            out["argv"] = list(self.argv)
        if self.callable is not None:
            out["callable"] = self.callable
        if self.pythonpath is not None:
            out["pythonpath"] = self.pythonpath
        if self.deadline is not None:
            out["deadline"] = self.deadline
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobSpec:
        """Rebuild a spec read back from the queue (already validated at submit)."""
        return cls(
            id=data["id"],
            kind=data["kind"],
            output=data["output"],
            out_root=data["out_root"],
            inputs=tuple(data.get("inputs", ())),
            params=dict(data.get("params", {})),
            argv=tuple(data["argv"]) if data.get("argv") is not None else None,
            callable=data.get("callable"),
            pythonpath=data.get("pythonpath"),
            memory_mb=int(data["memory_mb"]),
            timeout_s=float(data["timeout_s"]),
            max_attempts=int(data["max_attempts"]),
            priority=int(data["priority"]),
            group=str(data["group"]),
            deadline=data.get("deadline"),
        )

    @property
    def output_path(self) -> Path:
        return Path(self.out_root) / self.output


# -- the field table ---------------------------------------------------------------------

@dataclass(frozen=True)
class FieldSpec:
    """One manifest field: where it may appear, its JSON Schema, and its check."""

    name: str
    schema: dict[str, Any]
    description: str
    in_defaults: bool
    in_job: bool
    check: Check


def _check_str(pattern: re.Pattern[str], what: str) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, str):
            return f"must be a string, got {type_name(v)}"
        if not pattern.fullmatch(v):
            return f"{what}, got {v[:80]!r}"
        return None

    return check


def _check_callable(v: Any) -> str | None:
    """A python job's ``module:function`` (dotted names, as Python spells them: non-ASCII
    letters too; no keyword, which no def or import can name)."""
    if not isinstance(v, str):
        return f"must be a string, got {type_name(v)}"
    module, colon, attr = v.partition(":")
    parts = [*module.split("."), *attr.split(".")]
    if colon and module.endswith(".py") and all(p.isidentifier() for p in parts):
        # (Imported as package "mod", submodule "py": mod's code ran, then "No module named
        # 'mod.py'"; audit CD.)
        return f"names a file, not a module: {module[:-3]}:{attr}, not {v[:80]!r}"
    if not colon or ":" in attr or not all(p.isidentifier() for p in parts):
        return f"must look like package.module:function, got {v[:80]!r}"
    if kw := next((p for p in parts if keyword.iskeyword(p)), None):
        return f"{kw!r} is a Python keyword, which no module or function can be named, " \
               f"got {v[:80]!r}"
    if parts[0] in ("__main__", "__mp_main__"):
        # Always the worker's own main module, never a file of that name beside the
        # manifest: `__main__:main` ran part of the fork server's set-up in the worker
        # (review EE).
        return f"{parts[0]} is the worker's own main module, not one of yours: rename your " \
               f"module, got {v[:80]!r}"
    return None


def _check_kind(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"must be a string, got {type_name(v)}"
    return None  # the catalogue is checked once per job, where the plugin list is at hand


def is_job_id(v: Any) -> bool:
    """Whether ``v`` is an id a job may have (the `id` rule; the queue looks up no other)."""
    return isinstance(v, str) and ID_RE.fullmatch(v) is not None and not v.startswith(".")


def _raw_id(raw: Any) -> str | None:
    """A raw job's id if it is well-formed enough to name the job in a problem (or to count
    in the duplicate check), valid or not otherwise."""
    jid = raw.get("id") if isinstance(raw, dict) else None
    return jid if isinstance(jid, str) and ID_RE.fullmatch(jid) else None


def _check_id(v: Any) -> str | None:
    if not isinstance(v, str):
        return f"must be a string, got {type_name(v)}"
    if not is_job_id(v):
        return f"must match [A-Za-z0-9._-]{{1,128}} and not start with '.', got {v[:80]!r}"
    return None


def _check_any(v: Any) -> str | None:
    return None


_STR_LIST = {"type": "array", "items": {"type": "string"}}

FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("id", {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"},
              "unique job id", False, True, _check_id),
    FieldSpec("kind", {"type": "string"}, "renderer (see `renderctl kinds`)", True, True,
              _check_kind),
    FieldSpec("input", {"type": "string"}, "one input file, relative to the manifest's folder",
              False, True, _check_any),
    FieldSpec("inputs", {**_STR_LIST, "maxItems": MAX_INPUTS},
              "input files, relative to the manifest's folder", False, True, _check_any),
    FieldSpec("output", {"type": "string"}, "output path relative to the output root",
              False, True, _check_any),
    FieldSpec("argv", {**_STR_LIST, "minItems": 1, "maxItems": MAX_ARGV},
              "command kind: argv with {input} {inputs} {output}", True, True, _check_any),
    FieldSpec("callable", {"type": "string", "pattern": "^" + CALLABLE_RE.pattern + "$"},
              "python kind: module:function", True, True,
              _check_callable),
    FieldSpec("params", {"type": "object"}, "renderer params", True, True, _check_any),
    FieldSpec("memory_mb", {"type": "integer", "minimum": 1, "maximum": MAX_MEMORY_MB},
              "memory ceiling of the job's process tree (MB)", True, True, check_memory_mb),
    FieldSpec("timeout_s", {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S},
              "wall-clock limit of one attempt (s)", True, True, check_timeout),
    FieldSpec("max_attempts", {"type": "integer", "minimum": 1, "maximum": MAX_ATTEMPTS},
              "attempts before dead-lettering", True, True, check_max_attempts),
    FieldSpec("priority", {"type": "integer", "minimum": -1000, "maximum": 1000},
              "higher runs first; waiting raises it slowly", True, True,
              int_range(-1000, 1000)),
    FieldSpec("group", {"type": "string", "pattern": "^" + GROUP_RE.pattern + "$"},
              "fairness key: round-robin among groups of equal priority", True, True,
              _check_str(GROUP_RE, "must match [A-Za-z0-9._:@-]{1,128}")),
    FieldSpec("deadline", {"type": "string", "format": "date-time"},
              "not started by then -> expired, never run (with a timezone)", True, True,
              _check_any),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}
DEFAULT_FIELDS = frozenset(f.name for f in FIELDS if f.in_defaults)
JOB_FIELDS = frozenset(f.name for f in FIELDS if f.in_job)


def json_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (what `renderctl schema` prints)."""

    def props(in_defaults: bool) -> dict[str, Any]:
        return {
            f.name: {**f.schema, "description": f.description}
            for f in FIELDS
            if (f.in_defaults if in_defaults else f.in_job)
        }

    # Each renderer's params, for a job that names its kind itself (one whose kind comes
    # from [defaults] is checked by validation alone; so are [defaults]' own params, which
    # validation judges only as each job merges them: every job may name another kind;
    # review CY): the renderers of this installation, plugins included, as `kinds` lists.
    by_kind = [{"if": {"required": ["kind"], "properties": {"kind": {"const": kind}}},
                "then": {"properties": {"params": spec.params_schema()}}}
               for kind, spec in all_specs().items()]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "renderctl manifest",
        "type": "object",
        "additionalProperties": False,
        "required": ["jobs"],
        "properties": {
            "defaults": {"type": "object", "additionalProperties": False,
                         "properties": props(True)},
            "jobs": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_JOBS_PER_MANIFEST,
                "items": {"type": "object", "additionalProperties": False,
                          "required": ["id", "output"], "properties": props(False),
                          "allOf": by_kind},
            },
        },
    }


# -- parsing -----------------------------------------------------------------------------


class _ParseError(Exception):
    pass


class _Repeated(dict[str, Any]):
    """A JSON object that names a key more than once: its first value kept, the keys
    repeated in ``repeated``. Reported by ``_scrub``, which knows the job and field, so
    that one repeat does not hide the rest of the manifest's problems."""

    repeated: list[str]


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    repeated: list[str] = []
    for key, value in pairs:
        if key in out:
            repeated.append(key)
        else:
            out[key] = value
    if not repeated:
        return out
    marked = _Repeated(out)
    marked.repeated = repeated
    return marked


# Nested too deep for the parser itself (json's limit is ~1000 levels, tomllib's ~500): no
# document to name a job or field in, so the message says which rule it likely broke.
TOO_DEEP_TO_READ = (f"nested too deeply to be read (a job's params may nest at most "
                    f"{MAX_DEPTH} levels)")


def parse_document(raw: bytes, *, name: str) -> Any:
    """Bytes -> a plain document; raises ``_ParseError`` with a human message."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # (Where, as every other parse error says it: a line and column, not a byte.)
        at = exc.start
        start = raw.rfind(b"\n", 0, at) + 1
        # (In characters, as the other parse errors count them: the line is UTF-8 up to it.)
        lineno, column = raw.count(b"\n", 0, at) + 1, len(raw[start:at].decode()) + 1
        raise _ParseError(f"not UTF-8 at line {lineno} column {column} (byte {at}: "
                          f"0x{raw[at]:02x})") from None
    if "\x00" in text:
        raise _ParseError("contains a NUL character")
    # A byte-order mark, as Windows editors (Notepad) start UTF-8 files with: not content.
    # tomllib called it "Invalid statement (at line 1, column 1)" and json an unexpected BOM.
    text = text.removeprefix("\ufeff")
    if name.lower().endswith(".json"):
        try:
            # NaN and Infinity parse to floats, as TOML's nan and inf do: both are reported
            # by validate_document, at their job and field.
            return json.loads(text, object_pairs_hook=_json_object, parse_float=_json_float)
        except json.JSONDecodeError as exc:
            raise _ParseError(f"invalid JSON at line {exc.lineno} column {exc.colno}: "
                              f"{exc.msg}") from None
        except RecursionError:
            raise _ParseError(TOO_DEEP_TO_READ) from None
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            raise _ParseError(f"invalid JSON: {number_text_error(exc)}") from None
    if (line := toml_key_too_long(text)) is not None:
        raise _ParseError(f"line {line}: a key of more than {MAX_TOML_KEY_PARTS} dotted parts "
                          f"(nested deeper than {MAX_NESTING} levels)")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _ParseError(f"invalid TOML: {exc}") from None
    except RecursionError:
        raise _ParseError(TOO_DEEP_TO_READ) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise _ParseError(f"invalid TOML: {number_text_error(exc)}") from None
    # (TOML allows nan and inf; validate_document reports each, with the job and field.)
    return doc


NON_FINITE = "nan and inf are not allowed in a manifest"


class _Overflowed(float):
    """A JSON number too big for a float (1e400), which json reads as inf: said as what the
    manifest wrote, not as "nan and inf" (audit CF)."""

    text: str


def _json_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        big = _Overflowed(value)
        big.text = text
        return big
    return value
REPEATED = "duplicate key"
DATE_TIME = "a date/time cannot be passed to a job; write it as a string"
NOT_UNICODE = "is not valid Unicode: it holds a lone surrogate"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(s: str) -> bool:
    return not s.isascii() and _SURROGATE.search(s) is not None


def _printable(s: str) -> str:
    """``s`` with each lone surrogate written as its escape ('\\ud800'): it can be printed
    and stored as UTF-8, and named in a problem."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")

_Path = tuple[str | int, ...]


def _in_params(path: _Path) -> bool:
    return (len(path) > 2 and path[0] == "jobs" and path[2] == "params") or \
        (len(path) > 1 and path[0] == "defaults" and path[1] == "params")


def _scrub(v: Any, path: _Path, found: list[tuple[_Path, str]]) -> Any:
    """``v`` without the values no job may carry; each one's path (keys and indexes) and
    message go to ``found``, for the caller to report at its job and field.

    nan and inf break "same spec" comparisons (nan != nan), so a manifest may not carry
    them anywhere; they are dropped. A JSON key given twice keeps its first value. A TOML
    date/time in params (elsewhere the field's own check names it) would reach the queue's
    JSON, which has none; it becomes its ISO string. Going on without them lets every other
    problem of the manifest be reported in the same pass.

    A lone surrogate (JSON's "\\ud800", or a Python API caller's string) cannot be encoded:
    not as a file name, not in the queue's JSON, not on the terminal. It becomes its escape,
    in a value and in a key."""
    if isinstance(v, str):
        if _has_surrogate(v):
            found.append((path, NOT_UNICODE))
            return _printable(v)
        return v
    if isinstance(v, float) and not math.isfinite(v):
        found.append((path, f"{v.text} is beyond what a number can hold"
                      if isinstance(v, _Overflowed) else NON_FINITE))
        return None
    if isinstance(v, dt.date | dt.time) and _in_params(path):
        text = v.isoformat()
        found.append((path, f'{DATE_TIME}: "{text}"'))
        return text
    if isinstance(v, dict):
        if isinstance(v, _Repeated):
            found.extend(((*path, _printable(k)), REPEATED) for k in v.repeated)
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                # (A dict from the API: a number key was stored as its string, and the same
                # submit again refused as "a different spec"; a tuple key broke json.)
                found.append(((*path, repr(k)), f"a key must be a string, got {type_name(k)}"))
                continue
            if _has_surrogate(k):
                k = _printable(k)
                found.append(((*path, k), NOT_UNICODE))
            before = len(found)
            y = _scrub(x, (*path, str(k)), found)
            if len(found) == before or y is not None:  # else x itself was nan or inf
                out[k] = y
        return out
    if isinstance(v, list | tuple):  # (a tuple from the API: stored, it is a list)
        return [_scrub(x, (*path, i), found) for i, x in enumerate(v)]
    if v is None or isinstance(v, bool | int | float | dt.date | dt.time):
        return v  # (a date outside params is its field's: a deadline's own check names it)
    # What the API may pass that the queue's JSON cannot hold (a set, a Path, bytes).
    found.append((path, f"cannot be stored in the queue: {type_name(v)}"))
    return None


# The deepest a document may nest (params' MAX_DEPTH, under the document, jobs, a job and
# params, with room to spare): _scrub and the checks recurse, two frames a level, and a JSON
# document nested a few hundred levels parses (json's own limit is ~1000) but overflowed
# the stack in them.
MAX_NESTING = 64


def _too_deep(doc: Any) -> _Path:
    """The path of the first value nested deeper than MAX_NESTING (no recursion). Asked only
    once _scrub ran out of stack: a walk of every document cost a validate of 20,000 jobs
    ~0.2 s (13%), for what the checks of params' depth already refuse below ~490 levels."""
    stack: list[tuple[Any, _Path]] = [(doc, ())]
    while stack:
        v, path = stack.pop()
        if len(path) > MAX_NESTING:
            return path
        if isinstance(v, dict):
            stack.extend((x, (*path, str(k))) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, (*path, i)) for i, x in enumerate(v))
    raise AssertionError("no value nested that deep")  # (_scrub ran out of stack on one)


def _dotted(path: Sequence[str | int]) -> str:
    """("params", "b", 1) -> "params.b[1]"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _report_scrubbed(ctx: _Ctx, doc: dict[str, Any], found: list[tuple[_Path, str]]) -> None:
    """One problem per value ``_scrub`` took out, under its job and field where it is in one;
    the later checks stay silent about those fields (see ``_Ctx.scrubbed``)."""
    jobs = doc.get("jobs")
    where: list[tuple[str | None, str]] = []
    for path, msg in found:
        if len(path) < 2 or path[0] != "jobs" or not isinstance(path[1], int) \
                or not isinstance(jobs, list):
            job, fld = None, _dotted(path)
        else:
            job, fld = _raw_id(jobs[path[1]]) or f"#{path[1]}", _dotted(path[2:])
        ctx.add(job, fld or None, msg)
        where.append((job, fld))
    # Only now: one may be inside another (a repeated key whose first value holds a nan).
    ctx.scrubbed.update(where)
    ctx.scrubbed_jobs.update(job for job, _ in where)


# -- validation ---------------------------------------------------------------------------


@dataclass
class _Ctx:
    file: str
    problems: list[Problem]
    # (job, field) of each value _scrub dropped or replaced, reported already: what the
    # checks then find there ("is required", "must be str") is about the stand-in, not
    # about what the manifest says, and is left out, as is anything inside it.
    scrubbed: set[tuple[str | None, str]] = field(default_factory=set)
    scrubbed_jobs: set[str | None] = field(default_factory=set)  # the jobs of those
    # The output root as given (normalised by Path, as messages show it; ending in "/") and
    # resolved (None: there is none yet); each output folder's verdict, and each of its
    # prefixes' (see _folder_escapes).
    out_dir: str = ""
    out_real: str | None = None
    out_root: str = ""  # as the jobs' specs hold it
    folders: dict[str, str | None] = field(default_factory=dict)
    prefixes: dict[str, _Step | str] = field(default_factory=dict)
    # Prefixes that are symlinks staying inside the root; and each output folder reached
    # through one -> its real path under the root (another spelling of the same folder).
    linked: set[str] = field(default_factory=set)
    real_folders: dict[str, str] = field(default_factory=dict)
    # (out_root, output) -> the same output spelt without symlinks, for check_unique: two
    # jobs of one command writing one file through two spellings would dead-letter one.
    aliases: dict[tuple[str, str], str] | None = None
    # [defaults] fields reported bad once (defaults.<field>), and the job being validated:
    # a job that takes such a field from [defaults] is not told again (50,000 jobs repeated
    # a bad default deadline 50,000 times, as their own field; audit CF).
    bad_defaults: set[str] = field(default_factory=set)
    raw_job: Mapping[str, Any] | None = None
    root_said: bool = False  # the output root itself too long: said once (see below)
    # The [defaults] the jobs take. A problem with a param or argv a job takes from there
    # (they are judged per job: by its kind, its inputs) is said once, at defaults.<field>,
    # naming the jobs (20,000 jobs said one misspelt default param 20,000 times; audit DT):
    # (field, message) -> its problem's index, and the jobs it was found in.
    defaults: Mapping[str, Any] = field(default_factory=dict)
    shared: dict[tuple[str, str], tuple[int, list[str]]] = field(default_factory=dict)
    # Problems found, said or folded into one said already: a job with any is not valid
    # (review DX: the jobs after the first with a shared one passed as valid, and were
    # then refused one by one by the queue checks).
    found: int = 0

    def add(self, job: str | None, fld: str | None, msg: str, *, of_job: bool = False) -> None:
        """Report ``msg`` at ``job``'s ``fld``; ``of_job``: a problem of that job's own (its
        inputs), even where the field is the defaults'."""
        if self.scrubbed and fld is not None and self._in_scrubbed(job, fld):
            return
        self.found += 1
        if fld in self.bad_defaults and job is not None and self.raw_job is not None \
                and fld not in self.raw_job:
            return
        if not of_job and job is not None and fld is not None and self._from_defaults(fld):
            said = self.shared.get((fld, msg))
            if said is None:
                self.shared[(fld, msg)] = (len(self.problems), [job])
                self.problems.append(Problem(self.file, None, f"defaults.{fld}", msg))
            else:
                said[1].append(job)
            return
        self.problems.append(Problem(self.file, job, fld, msg))

    def _from_defaults(self, fld: str) -> bool:
        """Whether the job being validated takes ``fld`` (argv, or one of params) from
        [defaults], not from its own table."""
        raw = self.raw_job
        if raw is None or not self.defaults:
            return False
        if fld == "argv" or fld.startswith("argv["):
            return "argv" not in raw and "argv" in self.defaults
        if fld.startswith("params."):
            name = re.split(r"[.\[]", fld[len("params."):], maxsplit=1)[0]
            own = raw.get("params")
            shared = self.defaults.get("params")
            return isinstance(shared, dict) and name in shared \
                and not (isinstance(own, dict) and name in own)
        return False

    def name_shared_jobs(self) -> None:
        """Say which jobs each once-said [defaults] problem was found in."""
        for index, jobs in self.shared.values():
            p = self.problems[index]
            some = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
            self.problems[index] = replace(
                p, message=f"{p.message} (job{'s' if len(jobs) > 1 else ''} {some})")
        self.shared.clear()

    def _in_scrubbed(self, job: str | None, fld: str) -> bool:
        if (job, fld) in self.scrubbed:
            return True
        return any(c in ".[" and (job, fld[:i]) in self.scrubbed for i, c in enumerate(fld))


def _depth(v: Any, depth: int = 0) -> int:
    if depth > MAX_DEPTH:
        return depth
    if isinstance(v, dict):
        return max([_depth(x, depth + 1) for x in v.values()], default=depth + 1)
    if isinstance(v, list):
        return max([_depth(x, depth + 1) for x in v], default=depth + 1)
    return depth


def _key_shown(key: Any) -> str:
    """A params key as a message shows it: cut (a key of 1 MB was printed whole, on one
    line, in every message naming its field; audit CF)."""
    text = str(key)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"


def _value_shown(value: Any) -> str:
    """A param's value as a message shows it (repr), cut as ``_key_shown`` cuts a key: a
    font_size of 10**400 out of range printed all 401 digits (audit DU)."""
    return _key_shown(repr(value))


def _long_string(v: Any) -> str | None:
    """The path of the first string (value or key) longer than MAX_STRING, if any."""
    if isinstance(v, str):
        return "" if len(v) > MAX_STRING else None
    items: Iterable[tuple[str, Any]]
    if isinstance(v, dict):
        for k in v:
            if isinstance(k, str) and len(k) > MAX_STRING:
                return f".{_key_shown(k)}"  # (the key itself)
        items = ((f".{_key_shown(k)}", x) for k, x in v.items())
    elif isinstance(v, list):
        items = ((f"[{i}]", x) for i, x in enumerate(v))
    else:
        return None
    for key, x in items:
        sub = _long_string(x)
        if sub is not None:
            return key + sub
    return None


# C0 and C1 control characters and DEL (NUL is refused on its own, with its own words);
# the line and paragraph separators (str.splitlines breaks on them) and the bidirectional
# overrides, which show a name other than it is ("x\u202efdp.exe"; audit CF). Not the
# embeddings and isolates, Unicode's way to write right-to-left text within a name.
_CONTROL = re.compile("[\x01-\x1f\x7f-\x9f\u2028\u2029\u202d\u202e]")


def unencodable_name(value: str) -> str | None:
    """Why ``value`` cannot be a file name (or a program's argument) on this system, or
    None (audit AZ: a traceback from os.stat under a C or ISO-8859 locale)."""
    from renderctl.fsutil import unspellable  # (ctypes and all: not for every command)

    why = unspellable(value)
    return None if why is None else f"{value}: {why}"


def bad_folder_name(value: object) -> str | None:
    """Why ``value`` cannot name a folder given through the API or an option, or None."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        return "must be a str or a path, not bytes"
    if not isinstance(value, str):
        # (a TypeError from os.fspath deep inside, for None or 5; audit CX)
        return f"must be a str or a path, got {type(value).__name__}"
    if "\x00" in value:
        return "must not contain NUL"
    return unencodable_name(value)


def check_output_path(value: Any) -> str | None:
    """Why ``value`` is not an acceptable output path, or None (pure: no file system)."""
    if not isinstance(value, str):
        return f"must be a string, got {type_name(value)}"
    if value == "":
        return "must not be empty"
    if "\x00" in value:
        return "must not contain NUL"
    if "\\" in value:
        return "must use '/' separators (no backslashes)"
    if (why := unencodable_name(value)) is not None:
        return why
    if bad := _CONTROL.search(value):
        # A newline or an escape in a file name is published faithfully, and then misread
        # by every line-based tool and terminal that lists the folder (audit BA).
        return f"must not contain control characters, got {bad.group()!r}"
    if value.startswith("/"):
        return "must be relative to the output root, not absolute"
    if re.match(r"^[A-Za-z]:", value):
        # (Not "absolute": "Q:3 report.pdf" is not; but such a manifest means another
        # system's drive, and on that one it would be a drive.)
        return "must be relative to the output root, not start with a drive letter ('C:')"
    if len(value.encode()) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    for seg in value.split("/"):
        if seg == "":
            return "has an empty segment ('//' or a trailing '/')"
        if seg == "..":
            return "must not contain '..' segments (it would leave the output root)"
        if seg != seg.strip():
            # "g.pdf " (a paste) is not a .pdf: its PDF check was skipped, and the space
            # does not show in a listing or a message (audit CF).
            return f"a name must not begin or end with whitespace, got {seg!r}"
        if seg == ".":
            # Harmless, but one output would have two spellings, and duplicate outputs
            # are found by comparing them.
            return "must not contain '.' segments (write 'a/b.pdf', not './a/b.pdf')"
        if len(seg.encode()) > MAX_SEGMENT_BYTES:
            return f"has a segment longer than {MAX_SEGMENT_BYTES} bytes"
        if seg.startswith(RESERVED_PREFIX):
            return f"segments must not start with {RESERVED_PREFIX!r} (reserved for temporaries)"
    return None


def _check_params(
    ctx: _Ctx, jid: str, spec: RendererSpec, params: Mapping[str, Any]
) -> None:
    by_name: dict[str, ParamSpec] = {p.name: p for p in spec.params}
    if not spec.open_params:
        for name in params:
            if name not in by_name:
                known = ", ".join(sorted(by_name)) or "none"
                hint = _suggest(name, by_name) if isinstance(name, str) else None
                ctx.add(jid, f"params.{_key_shown(name)}",
                        f"unknown param for kind {spec.kind!r} "
                        + (f"(did you mean {hint!r}? known: {known})" if hint
                           else f"(known: {known})"))
    for p in spec.params:
        if p.name not in params:
            if p.required:
                ctx.add(jid, f"params.{p.name}", f"required by kind {spec.kind!r}")
            continue
        msg = _param_type_error(p, params[p.name])
        if msg:
            ctx.add(jid, f"params.{p.name}", msg)


def params_problems(spec: RendererSpec, params: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``params`` for ``spec``, as `validate` says it ("params.x: ..."):
    for a runner meeting a job accepted under another version of its plugin."""
    ctx = _Ctx(file="", problems=[])
    _check_params(ctx, "", spec, params)
    return [f"{p.field}: {p.message}" for p in ctx.problems]


def _param_type_error(p: ParamSpec, v: Any) -> str | None:
    ok = {
        "str": isinstance(v, str),
        "int": is_int(v),
        "float": is_number(v),
        "number": is_number(v),
        "bool": isinstance(v, bool),
        "list[str]": isinstance(v, list) and all(isinstance(x, str) for x in v),
        "table": isinstance(v, dict),
    }[p.type]
    if not ok:
        return f"must be {p.type}, got {type_name(v)}"
    if p.choices and v not in p.choices:
        return f"must be one of {', '.join(p.choices)}, got {_value_shown(v)}"
    if (p.low is not None or p.high is not None) and is_number(v):
        low = -math.inf if p.low is None else p.low
        high = math.inf if p.high is None else p.high
        if not low <= v <= high:  # (is_number: finite; an int compared exactly)
            return f"must be between {low:g} and {high:g}, got {_value_shown(v)}"
    if p.check is None:
        return None
    try:
        return p.check(v)
    except SignalExit:
        raise
    except (Exception, SystemExit) as exc:  # (a plugin's rule: audit EY, a traceback; its
        # SystemExit ended a runner, which checks plugin params as it claims: review EZ)
        return f"the renderer's own check of it failed: {type(exc).__name__}: {exc!s:.200}"


_RFC3339_UPPER = str.maketrans("tz", "TZ")
_LEAP_SECOND = re.compile(r"(?<=[Tt ])(\d\d:\d\d):60(?=[.Zz+-]|$)")


def _parse_deadline(v: Any) -> float | str:
    """Epoch seconds, or an error message."""
    if isinstance(v, dt.datetime):
        when = v
    elif isinstance(v, str):
        # RFC 3339 allows a leap second (23:59:60); fromisoformat does not: it is taken as
        # the second after :59, as POSIX time has it (audit DT: refused as no date-time).
        text, leap = _LEAP_SECOND.subn(r"\1:59", v, count=1)
        try:
            # RFC 3339 allows 't' and 'z' (its ABNF is case-insensitive); fromisoformat
            # does not. Other ISO 8601 forms it takes ('2026-12-01 09:00Z') stay accepted.
            when = dt.datetime.fromisoformat(
                text.translate(_RFC3339_UPPER).replace("Z", "+00:00")) + dt.timedelta(
                seconds=leap)
        except (ValueError, OverflowError):
            return f"must be an RFC 3339 date-time such as 2026-12-01T09:00:00Z, got {v[:60]!r}"
    else:
        return f"must be a date-time with a timezone, got {type_name(v)}"
    if when.tzinfo is None:
        return "must carry a timezone (e.g. 2026-12-01T09:00:00Z)"
    return when.timestamp()


def _resolve_input(ctx: _Ctx, jid: str, fld: str, base: Path, value: Any) -> str | None:
    if not isinstance(value, str) or value == "":
        ctx.add(jid, fld, f"must be a non-empty string, got {type_name(value)}")
        return None
    if "\x00" in value:
        ctx.add(jid, fld, "must not contain NUL")
        return None
    if (why := unencodable_name(value)) is not None:
        ctx.add(jid, fld, why)
        return None
    path = (base / value) if not os.path.isabs(value) else Path(value)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        ctx.add(jid, fld, f"{value}: no such file (looked for {path})")
        return None
    except OSError as exc:
        ctx.add(jid, fld, f"{value}: cannot be read: {exc.strerror}")
        return None
    if not stat.S_ISREG(st.st_mode):
        ctx.add(jid, fld, f"{value}: not a regular file")
        return None
    # A worker opens it as this user; unreadable, the job would only fail when it ran.
    if not os.access(path, os.R_OK):
        ctx.add(jid, fld, f"{value}: cannot be read: {os.strerror(errno.EACCES)}")
        return None
    return os.path.abspath(path)


class _Step(Enum):
    """What ``_look`` found at a folder prefix (a str instead: how it leads out)."""

    GO_ON = "go on"  # a folder, or a symlink that stays inside the root: look beneath it
    STOP = "stop"  # missing, or not a folder: nothing beneath it can exist to lead out
    ASK = "ask"  # lstat failed otherwise (EACCES...): the probe at the end tells the user why


# Linux's PATH_MAX: a longer path is refused (ENAMETOOLONG) before any folder on it is looked
# at, so a walk that stopped at a missing folder does not tell whether the probe would fail.
_PATH_MAX = 4096


def _whole_path_problem(ctx: _Ctx, output: str) -> str | None:
    """Why ``output`` (a valid relative path) is too long once under the output root, or
    None. The longest path renderctl uses for it is its folder's with the attempt's
    temporary (or private folder) beside it when that name is the longer: such a path the
    kernel refuses whole (ENAMETOOLONG), whatever is on disk, so it is known now. Found
    when the job ran, it failed every attempt; when the output root was not made yet, a
    runner recovering the job stopped on it (exit 74) at every start."""
    folder, _, name = output.rpartition("/")
    longest = len(os.fsencode(os.path.join(ctx.out_root, folder))) + 1 + max(
        len(name.encode()), TEMP_NAME_BYTES)
    if longest < _PATH_MAX:
        return None
    root = len(os.fsencode(ctx.out_root)) + 1 + TEMP_NAME_BYTES
    if root >= _PATH_MAX:
        # The root's own problem, said once, not with each job (50,000 lines of 5 KB each,
        # 259 MB of stderr; audit CF).
        if not ctx.root_said:
            ctx.root_said = True
            ctx.problems.append(Problem(
                "--out", None, None, f"the output root {ctx.out_root} is too long: "
                f"{root} bytes with an output's temporary name in it, where a path holds "
                f"at most {_PATH_MAX - 1}"))
        return None
    return (f"is too long under the output root {ctx.out_root}: {longest} bytes with its "
            f"temporary's name, where a path holds at most {_PATH_MAX - 1}")


def _output_escapes(ctx: _Ctx, output: str) -> str | None:
    """Why ``output`` (a valid relative path) would leave the output root through a
    symlink that is there now, or None: found at submit rather than dead-lettered when the
    job runs (the runner checks again: a symlink may be made in between). Only its folder
    is looked at: an output that exists already, symlink or not, is submit's warning, not
    a problem, as it may be removed before the job runs.

    Once per folder, as the runner does, but not with its check_confined: Path.resolve()
    costs ~40 us a folder (pure Python in 3.11), which nearly doubled the validation of
    jobs that each have a folder of their own. ``_folder_escapes`` gives the same verdicts
    with one lstat for a folder whose first part is not there yet."""
    if ctx.out_real is None:
        return None  # no output root yet: nothing in it to lead out
    folder = output.rpartition("/")[0]
    if folder not in ctx.folders:
        ctx.folders[folder] = _folder_escapes(ctx, ctx.out_real, folder)
    why = ctx.folders[folder]
    real = ctx.real_folders.get(folder)
    if why is None and real is not None and ctx.aliases is not None:
        name = output.rpartition("/")[2]
        ctx.aliases[(ctx.out_root, output)] = f"{real}/{name}" if real else name
    # Prefixed here, not in the cache: the other outputs in that folder have other names.
    return None if why is None else f"{output}: {why}"


def _folder_escapes(ctx: _Ctx, root: str, folder: str) -> str | None:
    """Why ``folder`` of the output root leads out of it (``root``, resolved), or None.

    Walks the folder's prefixes from the root, each looked at once per document (shared
    prefixes cost once): the first that is missing ends the walk, since a folder the
    runner makes inside the root cannot be a symlink, and only a symlink is resolved.
    Reaching a folder that is there, it asks what check_confined asked last, whether the
    path can be looked up at all (a name no output may have, so only the folder's fault
    shows): a folder that cannot be searched, or a path too long, is a problem, as before."""
    step: _Step | str = _Step.GO_ON
    end = 0 if folder else -1  # (by hand, not split/accumulate: a third of the time it took)
    while end >= 0 and step is _Step.GO_ON:
        end = folder.find("/", end + 1)
        prefix = folder if end < 0 else folder[:end]
        known = ctx.prefixes.get(prefix)
        if known is None:
            known = ctx.prefixes[prefix] = _look(ctx, root, prefix)
        step = known
    if isinstance(step, str):
        return step
    if ctx.linked and any(p in ctx.linked for p in _prefixes(folder)):
        # Rare (a symlink inside the root), so a realpath() for it alone.
        real = os.path.relpath(os.path.realpath(ctx.out_dir + folder), root)
        ctx.real_folders[folder] = "" if real == "." else real
    if step is _Step.STOP and 4 * (len(ctx.out_dir) + len(folder)) + 8 < _PATH_MAX:
        return None  # (4 x: the most bytes a character of either may take)
    probe = os.path.join(ctx.out_dir, folder, RESERVED_PREFIX)
    try:
        os.lstat(probe)
    except OSError as exc:
        # Path.is_symlink()'s ignored errors: check_confined passed over these.
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return str(exc)
    return None


def _look(ctx: _Ctx, root: str, prefix: str) -> _Step | str:
    """What is at ``prefix`` of the output root, as far as leaving the root goes."""
    path = ctx.out_dir + prefix  # through the symlinks before it, if any
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return _Step.STOP
    except OSError:
        return _Step.ASK
    if stat.S_ISDIR(st.st_mode):
        return _Step.GO_ON
    if not stat.S_ISLNK(st.st_mode):
        # A file where a folder should be: the runner cannot make the folder, which is
        # its error when the job runs (the file may be gone by then), not this check's.
        return _Step.STOP
    # A loop first: realpath() does not follow one to its end, and may stop inside the root.
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a symlink loop"
    real = os.path.realpath(path)
    # Out is out, even where a symlink further on would lead back in: whoever controls the
    # place outside controls where the output lands (the runner, judging the folder's real
    # path at publish, would accept it while that place still leads back; refusing it
    # here is the stricter, steadier verdict).
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        return f"{path} resolves to {real}, outside the output root {root}"
    ctx.linked.add(prefix)
    return _Step.GO_ON


def _prefixes(folder: str) -> Iterable[str]:
    """"a/b/c" -> "a", "a/b", "a/b/c"."""
    cut = folder.find("/")
    while cut != -1:
        yield folder[:cut]
        cut = folder.find("/", cut + 1)
    yield folder


def _validate_job(
    ctx: _Ctx,
    index: int,
    raw: Any,
    defaults: Mapping[str, Any],
    *,
    base: Path,
    out_root: str,
    limits: Limits,
    specs: Mapping[str, RendererSpec],
) -> JobSpec | None:
    ctx.raw_job = raw if isinstance(raw, dict) else None
    label = f"#{index}"
    if not isinstance(raw, dict):
        ctx.add(label, None, f"a job must be a table, got {type_name(raw)}")
        return None
    jid = _raw_id(raw) or label
    before = ctx.found
    for key in raw:
        if key not in JOB_FIELDS:
            hint = _suggest(key, JOB_FIELDS)
            ctx.add(jid, key, "unknown field" + (f" (did you mean {hint!r}?)" if hint else ""))
    merged: dict[str, Any] = {k: v for k, v in defaults.items() if k != "params"}
    merged.update({k: v for k, v in raw.items() if k in JOB_FIELDS})
    params: dict[str, Any] = dict(defaults.get("params") or {})
    if isinstance(raw.get("params"), dict):
        params.update(raw["params"])
    elif "params" in raw:
        ctx.add(jid, "params", f"must be a table, got {type_name(raw['params'])}")
    for name in ("id", "output"):
        if name not in raw:
            ctx.add(jid, name, "is required")
    for name, value in merged.items():
        if name == "params":
            continue
        msg = FIELD_BY_NAME[name].check(value)
        if msg:
            ctx.add(jid, name, msg)

    kind = merged.get("kind")
    spec = specs.get(kind) if isinstance(kind, str) else None
    if kind is None:
        ctx.add(jid, "kind", "is required (in the job or in [defaults])")
    elif isinstance(kind, str) and spec is None:
        hint = _suggest(kind, specs)
        ctx.add(jid, "kind", f"unknown kind {kind!r} ("
                + (f"did you mean {hint!r}? " if hint else "")
                + f"known: {', '.join(sorted(specs))}){unknown_kind_note()}")

    inputs: list[str] = []
    if "input" in raw and "inputs" in raw:
        ctx.add(jid, "inputs", "give either input or inputs, not both")
    elif "input" in raw:
        resolved = _resolve_input(ctx, jid, "input", base, raw["input"])
        if resolved:
            inputs.append(resolved)
    elif "inputs" in raw:
        if not isinstance(raw["inputs"], list):
            ctx.add(jid, "inputs", f"must be an array of paths, got {type_name(raw['inputs'])}")
        elif len(raw["inputs"]) > MAX_INPUTS:
            ctx.add(jid, "inputs", f"at most {MAX_INPUTS} inputs, got {len(raw['inputs'])}")
        else:
            for i, item in enumerate(raw["inputs"]):
                resolved = _resolve_input(ctx, jid, f"inputs[{i}]", base, item)
                if resolved:
                    inputs.append(resolved)

    if "output" in raw:
        msg = check_output_path(raw["output"]) or _whole_path_problem(ctx, raw["output"]) \
            or _output_escapes(ctx, raw["output"])
        if msg:
            ctx.add(jid, "output", msg)

    argv = merged.get("argv")
    if spec is not None:
        given = raw.get("inputs")
        n_given = (len(given) if isinstance(given, list) else 1) if "inputs" in raw \
            else int("input" in raw)
        if n_given < spec.min_inputs:
            ctx.add(jid, "inputs", f"kind {spec.kind!r} needs at least {spec.min_inputs} input(s)")
        if spec.max_inputs is not None and n_given > spec.max_inputs:
            ctx.add(jid, "inputs", f"kind {spec.kind!r} takes at most {spec.max_inputs} input(s)")
        _check_params(ctx, jid, spec, params)
        if spec.kind == "command":
            if isinstance(argv, list) and len(argv) > MAX_ARGV:
                ctx.add(jid, "argv", f"at most {MAX_ARGV} arguments, got {len(argv)}")
            elif not (isinstance(argv, list) and argv
                      and all(isinstance(a, str) and "\x00" not in a for a in argv)):
                ctx.add(jid, "argv", "kind 'command' needs argv: a non-empty array of strings")
            elif (bad := next((i for i, a in enumerate(argv)
                               if unencodable_name(a) is not None), None)) is not None:
                # A program's arguments are bytes in this encoding too: the job failed with
                # a UnicodeEncodeError at every attempt (review BH).
                ctx.add(jid, f"argv[{bad}]", str(unencodable_name(argv[bad])))
            else:
                if not argv[0]:
                    # No PATH makes it a program: each attempt failed "not executable: "
                    # (audit DT), where validation only warned that '' was not found.
                    ctx.add(jid, "argv[0]", "must name the program to run, got an empty "
                                            "string")
                if (long := next((i for i, a in enumerate(argv)
                                  if len(os.fsencode(a)) >= MAX_ARG_BYTES), None)) is not None:
                    # The kernel's own limit on one argument (MAX_ARG_STRLEN, with its NUL):
                    # the job was accepted, then invalid_input at its first attempt (audit
                    # DT). (Measured before {input} and {output} expand: longer after.)
                    ctx.add(jid, f"argv[{long}]", f"{len(os.fsencode(argv[long]))} bytes; "
                            f"one argument holds less than {MAX_ARG_BYTES // 1024} KiB (the "
                            "kernel's limit): pass long data in an input file")
                _check_placeholders(ctx, jid, argv, n_given)
        elif "argv" in raw:
            ctx.add(jid, "argv", "only for kind 'command'")
        if spec.kind == "python":
            if "callable" not in merged:
                ctx.add(jid, "callable", "kind 'python' needs callable = \"module:function\"")
        elif "callable" in raw:
            ctx.add(jid, "callable", "only for kind 'python'")

    deadline: float | None = None
    if "deadline" in merged:
        parsed = _parse_deadline(merged["deadline"])
        if isinstance(parsed, str):
            ctx.add(jid, "deadline", parsed)
        else:
            deadline = parsed

    where = _long_string(params)
    if where is not None:
        ctx.add(jid, f"params{where}", f"string longer than {MAX_STRING} characters")
    if _depth(params) > MAX_DEPTH:
        ctx.add(jid, "params", f"nested deeper than {MAX_DEPTH} levels")

    if ctx.found > before:
        return None
    if jid in ctx.scrubbed_jobs or label in ctx.scrubbed_jobs:
        # A value of this job that no job may carry was dropped and reported already (an
        # output that is a Path, or nan): its later checks were silenced, and a KeyError
        # came from reading it here (review BK).
        return None
    return JobSpec(
        id=raw["id"],
        kind=str(kind),
        output=raw["output"],
        out_root=out_root,
        inputs=tuple(inputs),
        params=params,
        argv=tuple(argv or ()) if spec is not None and spec.kind == "command" else None,
        callable=merged.get("callable") if spec is not None and spec.kind == "python" else None,
        pythonpath=str(base) if spec is not None and spec.kind == "python" else None,
        # int(): 400.0 is valid for an integer field and must be the same spec as 400.
        memory_mb=int(merged.get("memory_mb", limits.memory_mb)),
        timeout_s=float(merged.get("timeout_s", limits.timeout_s)),
        max_attempts=int(merged.get("max_attempts", limits.max_attempts)),
        priority=int(merged.get("priority", limits.priority)),
        group=merged.get("group", limits.group),
        deadline=deadline,
    )


PLACEHOLDERS = ("input", "inputs", "output")
# A would-be placeholder: {name}, but not a shell's ${name} (argv may be `sh -c '...' sh
# {output}`); braces around anything else ({print $1}, {a: .b}, find's {}) are the tool's.
_BRACED_NAME = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _check_placeholders(ctx: _Ctx, jid: str, argv: list[str], n_inputs: int) -> None:
    """What ``worker.expand_argv`` would fail on or pass through unexpanded, found now
    rather than when the job runs: its rules, exactly (argv has no NUL, checked before)."""
    writes_output = False
    for i, arg in enumerate(argv):
        if "{" not in arg or arg == "{inputs}":
            continue  # nothing to expand; or one argument per input (none if there is none)
        if "{inputs}" in arg:
            ctx.add(jid, f"argv[{i}]", "{inputs} must be a whole argument (it becomes one "
                                       f"argument per input), got {arg[:80]!r}")
        # The worker puts the output path in first: what it then finds is an {input}.
        if "{input}" in arg.replace("{output}", "\x00") and n_inputs == 0:
            ctx.add(jid, f"argv[{i}]", "uses {input} but the job has no input", of_job=True)
        writes_output = writes_output or "{output}" in arg
        for name in _BRACED_NAME.findall(arg):
            if name not in PLACEHOLDERS and (hint := _suggest(name.lower(), PLACEHOLDERS,
                                                              cutoff=0.75)):
                ctx.add(jid, f"argv[{i}]", f"'{{{name}}}' is not a placeholder (did you mean "
                                           f"{{{hint}}}?)")
    if not writes_output:
        # Its output is a temporary named by the attempt, which only {output} tells it.
        ctx.add(jid, "argv", "never mentions {output}: the command could not write the job's "
                             "output, and the job would always end invalid_output")


def _suggest(key: str, known: Iterable[str], cutoff: float = 0.7) -> str | None:
    import difflib

    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=cutoff)
    return close[0] if close else None


def validate_document(
    doc: Any,
    *,
    file: str,
    base: Path,
    out_root: str,
    limits: Limits = Limits(),
    specs: Mapping[str, RendererSpec] | None = None,
    problems: list[Problem] | None = None,
    ids: list[tuple[str, int]] | None = None,
    aliases: dict[tuple[str, str], str] | None = None,
) -> list[JobSpec]:
    """Validate a parsed document; problems are appended to ``problems``, and the id of
    every job that has a well-formed one, valid job or not, to ``ids`` with the job's index
    in the document (for check_unique:
    a duplicate is a problem of its own, whatever else is wrong with the job); each output
    reached through a symlink inside the root, to ``aliases`` (see check_unique)."""
    ctx = _Ctx(file, problems if problems is not None else [],
               out_dir=os.path.join(Path(out_root), ""),
               out_real=os.path.realpath(out_root) if os.path.isdir(out_root) else None,
               out_root=out_root, aliases=aliases)
    specs = specs if specs is not None else all_specs()
    if not isinstance(doc, dict):
        ctx.add(None, None, f"the manifest must be a table/object, got {type_name(doc)}")
        return []
    scrubbed: list[tuple[_Path, str]] = []
    try:
        doc = _scrub(doc, (), scrubbed)
    except RecursionError:
        # Named at its job and field as far as they are well-formed; nothing else of this
        # document is looked at (it cannot be walked safely).
        deep = _too_deep(doc)
        jobs, at = doc.get("jobs"), deep[1] if len(deep) > 2 else None
        if deep[0] == "jobs" and isinstance(jobs, list) and isinstance(at, int):
            who, fld = _raw_id(jobs[at]) or f"#{at}", _dotted(deep[2:3])
        else:
            who, fld = None, _dotted(deep[:2] if deep[0] == "defaults" else deep[:1])
        # params have a rule of their own, said the same whatever the depth (a JSON
        # document nested ~450 levels is refused by it, one nested ~500 only here).
        limit = MAX_DEPTH if fld.rpartition(".")[2] == "params" else MAX_NESTING
        ctx.add(who, _printable(fld), f"nested deeper than {limit} levels")
        return []
    _report_scrubbed(ctx, doc, scrubbed)
    for key in doc:
        if key not in ("defaults", "jobs"):
            hint = _suggest(key, ("defaults", "jobs"))
            ctx.add(None, key, "unknown top-level field"
                    + (f" (did you mean {hint!r}?)" if hint else ""))
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        ctx.add(None, "defaults", f"must be a table, got {type_name(defaults)}")
        defaults = {}
    bad_defaults = False
    for key, value in defaults.items():
        if key not in DEFAULT_FIELDS:
            hint = _suggest(key, DEFAULT_FIELDS)
            ctx.add(None, f"defaults.{key}", "unknown field"
                    + (f" (did you mean {hint!r}?)" if hint else ""))
            bad_defaults = True
        elif key == "params":
            if not isinstance(value, dict):
                ctx.add(None, "defaults.params", f"must be a table, got {type_name(value)}")
                ctx.bad_defaults.add(key)
                bad_defaults = True
        else:
            msg = FIELD_BY_NAME[key].check(value)
            if not msg and key == "kind" and value not in specs:
                hint = _suggest(value, specs)
                msg = (f"unknown kind {value!r} (" + (f"did you mean {hint!r}? " if hint else "")
                       + f"known: {', '.join(sorted(specs))}){unknown_kind_note()}")
            elif not msg and key == "deadline" and isinstance(
                    parsed := _parse_deadline(value), str):
                msg = parsed
            if msg and key in ("kind", "deadline") and isinstance(raws := doc.get("jobs"), list) \
                    and all(isinstance(j, dict) and key in j for j in raws):
                # A default no job takes (each sets its own) is not used: not refused, as
                # before it was checked here (review CJ: a shared manifest's default kind,
                # a plugin missing on this host).
                msg = None
            if msg:
                ctx.add(None, f"defaults.{key}", msg)
                ctx.bad_defaults.add(key)
                bad_defaults = True
    if bad_defaults:
        # Each job would repeat the same defaults problem; report it once.
        defaults = {k: v for k, v in defaults.items()
                    if k in DEFAULT_FIELDS and k not in ctx.bad_defaults
                    and (k == "params" or not FIELD_BY_NAME[k].check(v))}
    jobs = doc.get("jobs")
    if jobs is None:
        ctx.add(None, "jobs", "is required: at least one [[jobs]] entry")
        return []
    if not isinstance(jobs, list):
        ctx.add(None, "jobs", f"must be an array of tables, got {type_name(jobs)}")
        return []
    if len(jobs) == 0:
        ctx.add(None, "jobs", "is empty")
    if len(jobs) > MAX_JOBS_PER_MANIFEST:
        ctx.add(None, "jobs", f"at most {MAX_JOBS_PER_MANIFEST} jobs per manifest, got "
                              f"{len(jobs)}")
        return []
    if isinstance(shared := defaults.get("params"), dict) and shared:
        # Copied into every job's record: 3 MB of them under 3,000 jobs took 32 s and 2.8 GB
        # to validate (and a queue of ~9 GB had it been submitted).
        size = len(json.dumps(shared, default=str))
        if size > MAX_SHARED_PARAMS_BYTES or size * len(jobs) > MAX_EXPANDED_PARAMS_BYTES:
            ctx.add(None, "defaults.params",
                    f"{size / 1024:.0f} KB, copied into each of the {len(jobs)} jobs, would "
                    f"be {size * len(jobs) / MIB:.0f} MB of job records (at most "
                    f"{MAX_SHARED_PARAMS_BYTES // 1024} KB a job, "
                    f"{MAX_EXPANDED_PARAMS_BYTES // MIB} MB in all): give the jobs a file to "
                    "read instead")
            return []
    out: list[JobSpec] = []
    ctx.defaults = defaults
    for i, raw in enumerate(jobs):
        job = _validate_job(ctx, i, raw, defaults, base=base, out_root=out_root,
                            limits=limits, specs=specs)
        if job is not None:
            out.append(job)
        if ids is not None and (jid := _raw_id(raw)) is not None:
            ids.append((jid, i))
    ctx.name_shared_jobs()
    return out


def load_manifests(
    paths: Sequence[str | os.PathLike[str]],
    *,
    out_root: str | os.PathLike[str],
    limits: Limits = Limits(),
    origins: dict[str, str] | None = None,
) -> list[JobSpec]:
    """Read and validate every manifest of one command; all jobs, or ``ManifestError``.

    ``origins``, if given, is filled with each job's id -> the manifest it came from, so
    that problems found later (by the queue, against what it holds) can name the file too.
    """
    problems: list[Problem] = []
    jobs: list[JobSpec] = []
    files: list[str] = []  # the manifest of each job in ``jobs``
    # every well-formed id, valid job or not, its file and its place there
    id_files: list[tuple[str, str, int]] = []
    aliases: dict[tuple[str, str], str] = {}
    specs = all_specs()
    root = os.path.abspath(out_root)
    # One file named twice (jobs/*.toml jobs/demo.toml) is read once, not reported as
    # duplicating its own ids.
    unique: list[str] = []
    seen: set[str] = set()
    for p in paths:
        if (real := os.path.realpath(p)) not in seen:
            seen.add(real)
            unique.append(os.fspath(p))
    for name in unique:
        try:
            st = os.stat(name)
            if not stat.S_ISREG(st.st_mode):
                problems.append(Problem(name, None, None, "not a regular file"))
                continue
            if st.st_size > MAX_MANIFEST_BYTES:
                problems.append(Problem(name, None, None,
                                        f"larger than {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB"))
                continue
            with open(name, "rb") as fh:
                raw = fh.read(MAX_MANIFEST_BYTES + 1)
        except OSError as exc:
            problems.append(Problem(name, None, None, f"cannot read: {exc.strerror}"))
            continue
        try:
            doc = parse_document(raw, name=name)
        except _ParseError as exc:
            problems.append(Problem(name, None, None, str(exc)))
            continue
        base = Path(os.path.abspath(os.path.dirname(name) or "."))
        ids: list[tuple[str, int]] = []
        found = validate_document(doc, file=name, base=base, out_root=root, limits=limits,
                                  specs=specs, problems=problems, ids=ids, aliases=aliases)
        if origins is not None:
            origins.update((job.id, name) for job in found)
        jobs.extend(found)
        files.extend(name for _ in found)
        id_files.extend((jid, name, i) for jid, i in ids)
    check_unique(jobs, problems, files=files, ids=id_files, aliases=aliases)
    if problems:
        raise ManifestError(problems, valid=jobs)
    return jobs


def check_unique(jobs: Sequence[JobSpec], problems: list[Problem], *,
                 files: Sequence[str], ids: Sequence[tuple[str, str, int]],
                 aliases: Mapping[tuple[str, str], str] | None = None) -> None:
    """Ids and output paths must be unique across everything one command submits, and no
    output may be inside another (x/a.pdf and x/a.pdf/b.pdf; a split job's folder).

    ``files[i]`` is the manifest ``jobs[i]`` came from; ``ids`` is every id with its file
    and its index there, invalid jobs' included. A duplicate is reported in the file of its
    second occurrence (the one to edit, or delete), naming the first: its file if another,
    else both places in the file (each entry's other problems carry the same id); an output
    inside another at the job inside, whatever the order.

    ``aliases`` maps (out_root, output) to that output spelt without the symlinks inside
    the root that its folder goes through (``link/a.pdf`` -> ``real/a.pdf``): outputs are
    compared by that spelling, so two spellings of one file are one output."""
    aliases = aliases or {}
    first_id: dict[str, tuple[str, int]] = {}  # id -> its file, its index there
    for jid, file, index in ids:
        if jid in first_id:
            other, at = first_id[jid]
            problems.append(Problem(file, jid, "id", "duplicate job id" + (
                f" (jobs #{at} and #{index} of this file)" if other == file
                else f" (also in {other})")))
        first_id.setdefault(jid, (file, index))
    # (out_root, output) -> (job id, its file). The root is absolute and the output
    # normalised (check_output_path), so the pair names one path; its folders are pairs
    # too, looked up with no path joined.
    first_output: dict[tuple[str, str], tuple[str, str]] = {}
    real = [aliases.get((job.out_root, job.output), job.output) for job in jobs]
    for job, file, output in zip(jobs, files, real, strict=True):
        key = (job.out_root, output)
        if key in first_output and first_output[key][0] != job.id:
            other_id, other = first_output[key]
            where = "" if other == file else f" in {other}"
            also = "" if output == job.output else f" ({output}, through a symlink)"
            problems.append(Problem(file, job.id, "output",
                                    f"same output as job {other_id}{where}: {job.output}"
                                    + also))
        first_output.setdefault(key, (job.id, file))
    # One of the two jobs would dead-letter (output_exists: a file where a folder must be,
    # or a folder where the other publishes its own), or put its output in another's
    # folder output. Each output's folders looked up among all outputs: O(jobs x depth).
    for job, file, output in zip(jobs, files, real, strict=True):
        cut = output.find("/")
        while cut != -1:
            outer = output[:cut]
            hit = first_output.get((job.out_root, outer))
            if hit is not None:
                other_id, other = hit
                where = "" if other == file else f" (in {other})"
                problems.append(Problem(file, job.id, "output",
                                        f"{job.output} is inside job {other_id}'s output "
                                        f"{outer}{where}; no job's output may hold another's"))
                break
            cut = output.find("/", cut + 1)


def jobs_from_dicts(
    items: Sequence[Mapping[str, Any]],
    *,
    base: str | os.PathLike[str],
    out_root: str | os.PathLike[str],
    defaults: Mapping[str, Any] | None = None,
    limits: Limits = Limits(),
    source: str = "<api>",
) -> list[JobSpec]:
    """The Python API's entry: plain dicts validated exactly like a manifest's jobs."""
    # The two folders as the command line's options would be checked (a NUL, a name this
    # system cannot spell): else a ValueError or UnicodeEncodeError from deep inside.
    folders = [Problem(source, None, name, why) for name, value in
               (("base", base), ("out_root", out_root))
               if (why := bad_folder_name(value)) is not None]
    if folders:
        raise ManifestError(folders)
    problems: list[Problem] = []
    doc: dict[str, Any] = {"jobs": [dict(i) if isinstance(i, Mapping) else i for i in items]}
    if defaults:
        doc["defaults"] = dict(defaults)
    ids: list[tuple[str, int]] = []
    aliases: dict[tuple[str, str], str] = {}
    jobs = validate_document(doc, file=source, base=Path(os.path.abspath(base)),
                             out_root=os.path.abspath(out_root), limits=limits,
                             problems=problems, ids=ids, aliases=aliases)
    check_unique(jobs, problems, files=[source] * len(jobs), ids=[(j, source, i) for j, i in ids],
                 aliases=aliases)
    if problems:
        raise ManifestError(problems)
    return jobs


def outputs_in_queue(jobs: Sequence[Any], queue: Path, origins: Mapping[str, str], *,
                     where: str = "--out") -> list[Problem]:
    """Outputs that would land in the queue's own folder (`--out` naming the queue, or a
    job's output under the queue inside the output root): a published file in pending/ was
    quarantined as a damaged record, and one named like a record would be taken for it.
    Free unless the queue lies inside the output root (then a realpath per job)."""
    if not jobs:
        return []
    qroot = os.path.realpath(queue)
    # Per distinct root: a batch shares one or two (a realpath per job was ~0.1 ms each).
    roots = {os.path.realpath(r) for r in {j.out_root for j in jobs}}
    inside = [r for r in roots if r == qroot or r.startswith(qroot + os.sep)]
    if inside:
        return [Problem(where, None, None, f"the output root {inside[0]} is inside the "
                        f"queue folder {qroot}: outputs must not go among the queue's files")]
    if not any(qroot.startswith(r + os.sep) for r in roots):
        return []
    problems = []
    for j in jobs:
        final = os.path.realpath(j.output_path)
        if final == qroot or final.startswith(qroot + os.sep):
            problems.append(Problem(origins.get(j.id, "?"), j.id, "output",
                                    f"{final} is inside the queue folder {qroot}: outputs "
                                    "must not go among the queue's files"))
    return problems
