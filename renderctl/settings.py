"""Configuration defaults: ``renderctl.toml`` or ``[tool.renderctl]`` in ``pyproject.toml``.

Precedence, highest first: the command line, ``RENDERCTL_<NAME>`` in the environment, the
file in the current directory, the built-in default. The CLI applies the first two (click
resolves an option from its argument, then its ``envvar``, then the context's default map);
this module supplies the third: it finds the file, checks every key and value, and returns
plain data. A bad file is the user's fault and says which file and key (``ConfigError``).

Keys are the long option names, with ``-`` or ``_`` (``memory_mb`` or ``memory-mb``).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderctl import limits
from renderctl.errors import UserError

CONFIG_FILE = "renderctl.toml"
PYPROJECT = "pyproject.toml"
ENV_PREFIX = "RENDERCTL_"


class ConfigError(UserError):
    """The configuration file has an unknown key or a value of the wrong kind."""


@dataclass(frozen=True)
class Key:
    """One configurable option: its type, and a check on its value (None: any).

    ``limit`` is the manifest's own check of the job field the option is a default for
    (its message says what is wrong), so that no door accepts what a manifest refuses.
    """

    type: type
    check: Callable[[Any], bool] | None = None
    expect: str = ""
    limit: limits.Check | None = None


# Finite too: `--grace inf` printed `"grace_s": Infinity` in `run --json` (not JSON: jq
# refuses the line), and `--backoff-base inf` would schedule a retry for never.
# (is_number, not math.isfinite: an int past 1e308 is a count, not an OverflowError.)
def _positive(v: Any) -> bool:
    return limits.is_number(v) and v > 0


def _non_negative(v: Any) -> bool:
    return limits.is_number(v) and v >= 0


# Every key a configuration file (or RENDERCTL_<NAME>) may set: the long option names.
KEYS: dict[str, Key] = {
    "queue": Key(str),
    "out": Key(str),
    "workers": Key(int, _positive, "an integer >= 1", limit=limits.check_workers),
    "memory_mb": Key(int, limit=limits.check_memory_mb),
    "timeout": Key(float, limit=limits.check_timeout),
    "max_attempts": Key(int, limit=limits.check_max_attempts),
    "max_pending": Key(int, _non_negative, "an integer >= 0"),
    "start_method": Key(str, lambda v: v in ("forkserver", "fork", "spawn"),
                        "forkserver, fork or spawn"),
    "max_jobs_per_worker": Key(int, _positive, "an integer >= 1"),
    "backoff_base": Key(float, _non_negative, "a finite number >= 0"),
    "backoff_max": Key(float, _non_negative, "a finite number >= 0"),
    "kill_grace": Key(float, _non_negative, "a finite number >= 0"),
    "grace": Key(float, _non_negative, "a finite number >= 0"),
    "memory_budget": Key(int, _positive, "an integer >= 1"),
    "memory_guard": Key(str, lambda v: v in ("auto", "cgroup-v1", "cgroup-v2", "sampling"),
                        "auto, cgroup-v1, cgroup-v2 or sampling"),
    "max_failures": Key(int, _positive, "an integer >= 1"),
    "prefetch": Key(int, _positive, "an integer >= 1"),
    "poll_interval": Key(float, _positive, "a finite number > 0"),
    "follow": Key(bool),
    "quiet": Key(bool),
    "metrics_textfile": Key(str),
    "junit": Key(str),
}


def env_name(key: str) -> str:
    """``memory_mb`` -> ``RENDERCTL_MEMORY_MB``."""
    return ENV_PREFIX + key.upper()


def find_config(cwd: str | os.PathLike[str]) -> tuple[Path, Mapping[str, Any]] | None:
    """The configuration file in ``cwd`` and its raw table, or None if there is none."""
    folder = Path(cwd)
    own = folder / CONFIG_FILE
    if own.is_file():
        return own, _read_toml(own)
    if os.path.lexists(own):
        # Named, it is the configuration, and pyproject.toml is not looked at: a folder, FIFO
        # or dangling link by that name silently gave pyproject.toml's settings (audit ES).
        what = "a symlink to nothing" if own.is_symlink() and not own.exists() else \
            "a folder" if own.is_dir() else "not a regular file"
        raise ConfigError(f"{own}: {what}; renderctl reads its settings from this name "
                          f"(and then not from {PYPROJECT})")
    pyproject = folder / PYPROJECT
    if pyproject.is_file():
        doc = _read_toml(pyproject)
        table = doc.get("tool", {}).get("renderctl") if isinstance(doc.get("tool"), dict) \
            else None
        if table is None:
            return None
        if not isinstance(table, dict):
            raise ConfigError(f"{pyproject}: [tool.renderctl] must be a table")
        return pyproject, table
    return None


MAX_CONFIG_BYTES = 1 << 20  # a configuration file is a dozen lines


def _read_toml(path: Path) -> dict[str, Any]:
    """The file's TOML document; every way it can be wrong is a ConfigError naming it (a
    traceback here broke every command, `kinds` and `schema` included)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB: not a "
                          "configuration file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: contains a NUL character")
    if (line := limits.toml_key_too_long(text)) is not None:
        raise ConfigError(f"{path}: line {line}: a key of more than "
                          f"{limits.MAX_TOML_KEY_PARTS} dotted parts")
    try:
        return tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise ConfigError(f"{path}: not valid TOML: {limits.number_text_error(exc)}") from None


def check_value(key: str, value: Any, *, where: str) -> Any:
    """``value`` converted to ``key``'s type, or ``ConfigError`` naming ``where`` and ``key``."""
    if key not in KEYS:
        import difflib

        # (As a manifest's unknown field and a mistyped option are answered; audit DB.)
        close = difflib.get_close_matches(key, sorted(KEYS), n=1, cutoff=0.7)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{where}: unknown key {key!r} ({hint}known: "
                          f"{', '.join(sorted(KEYS))})")
    return check_setting(key, value, label=f"{where}: key {key!r}")


def check_setting(key: str, value: Any, *, label: str) -> Any:
    """``value`` converted to known key ``key``'s type, or ``ConfigError`` after ``label``.

    One check whichever way the value came (file, ``RENDERCTL_<NAME>``, command line);
    ``label`` names that way, so the message points at what the user has to change.
    """
    spec = KEYS[key]
    ok = True
    if spec.type is bool:
        ok = isinstance(value, bool)
    elif spec.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif spec.type is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        try:
            value = float(value) if ok else value
        except OverflowError:  # an int past 1e308: no float holds it, refused as inf is
            value = math.inf
    elif spec.type is str:
        ok = isinstance(value, str) and value != ""
    if ok and spec.limit is not None:
        problem = spec.limit(value)
        if problem is not None:
            raise ConfigError(f"{label}: {problem}")
    if ok and spec.check is not None:
        ok = spec.check(value)
    if not ok:
        kind = spec.expect or {bool: "true or false", str: "a non-empty string",
                               int: "an integer", float: "a number"}.get(
            spec.type, spec.type.__name__)
        raise ConfigError(f"{label}: expected {kind}, got {value!r}")
    return value


def load_config(cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked defaults of the configuration file in ``cwd`` ({} when there is none).

    ``renderctl.toml`` wins over ``[tool.renderctl]`` in ``pyproject.toml`` whole: one file
    is read, so that what applies is what that one file says (no key-by-key merging).
    """
    return load_config_file(cwd)[1]


def load_config_file(cwd: str | os.PathLike[str]) -> tuple[Path | None, dict[str, Any]]:
    """``load_config`` with the file it read (None when there is none), for messages."""
    found = find_config(cwd)
    if found is None:
        return None, {}
    path, table = found
    values: dict[str, Any] = {}
    problems: list[str] = []
    spelled: dict[str, str] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        if key in spelled:
            # memory_mb and memory-mb both: which one applied hung on their order in the
            # file (audit BN). Refused, as a manifest refuses a field given twice.
            problems.append(f"{path}: {raw_key!r} and {spelled[key]!r} are the same setting;"
                            " keep one")
            continue
        spelled[key] = raw_key
        try:
            values[key] = check_value(key, value, where=str(path))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:  # every one at once, as a manifest's problems are
        raise ConfigError("\n".join(problems))
    return path, values


def resolve(key: str, *, cli: Any = None, env: Mapping[str, str] | None = None,
            config: Mapping[str, Any] | None = None, default: Any = None) -> Any:
    """One option's value by the documented precedence: CLI > environment > file > built-in.

    The CLI gets this from click; this function is the same rule for other callers (and the
    statement of it that the tests hold the CLI to).
    """
    if cli is not None:
        return cli
    raw = (os.environ if env is None else env).get(env_name(key))
    if raw:
        return parse_env(key, raw)
    if config is not None and key in config:
        return config[key]
    return default


def parse_env(key: str, raw: str) -> Any:
    """A ``RENDERCTL_<NAME>`` string as ``key``'s type (``ConfigError`` if it is not one)."""
    spec = KEYS[key]
    value: Any = raw
    try:
        if spec.type is bool:
            low = raw.strip().lower()
            if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            value = low in ("1", "true", "yes", "on")
        elif spec.type is int:
            value = int(raw)
        elif spec.type is float:
            value = float(raw)
    except ValueError:
        value = raw
    return check_setting(key, value, label=env_name(key))


@dataclass(frozen=True)
class RunnerSettings:
    """Everything `renderctl run` can tune; defaults are the documented ones."""

    workers: int | None = None  # None: min(cores, budget // 400 MB)
    start_method: str = "forkserver"
    max_jobs_per_worker: int = 1000
    lease_s: float = 60.0
    # A worker that has not said it is ready this long after its start is killed and
    # replaced (a start counted failed: MAX_START_FAILURES in a row halt the run). Starts take
    # 2-200 ms here (MEASUREMENTS.md: fork, forkserver, spawn + imports); a minute leaves a
    # swapping or overloaded machine room, and bounds what a stuck start (a worker stopped
    # by hand, an import hung on a dead network file system) holds up: without it, the jobs
    # prefetched into that worker waited for it for good. (Celery: worker_proc_alive_timeout.)
    # The same limit holds a ready worker that sits on jobs handed to it while idle
    # (Runner._judge_answer): it reads them at once, so it is stopped or hung.
    worker_start_timeout_s: float = 60.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    kill_grace_s: float = 5.0
    grace_s: float = 30.0
    memory_budget_mb: int | None = None  # None: 80% of available memory at start
    follow: bool = False
    max_failures: int | None = None
    memory_guard: str = "auto"
    sample_interval_s: float = 0.05
    poll_interval_s: float = 1.0
    prefetch_max: int = 32
    prefetch: int | None = None  # jobs a worker may hold incl. the running one; None: adaptive
    crash_at: str | None = None
