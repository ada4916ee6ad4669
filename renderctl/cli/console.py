"""Output helpers: rich on a terminal, plain text on a pipe or with NO_COLOR, JSON on request."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console


def is_tty() -> bool:
    return sys.stdout.isatty()


def plain() -> bool:
    """Plain text: not a terminal, or NO_COLOR set (https://no-color.org)."""
    return not is_tty() or "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb"


def console(*, stderr: bool = False) -> Console:
    if plain():
        return Console(stderr=stderr, no_color=True, color_system=None, highlight=False,
                       force_terminal=False, soft_wrap=True, emoji=False)
    return Console(stderr=stderr, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=None, separators=(",", ":"), default=str) + "\n")
    sys.stdout.flush()


def err(message: str) -> None:
    """A user-facing error on stderr, no traceback."""
    sys.stderr.write(f"renderctl: {message}\n")
    sys.stderr.flush()


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def human_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}GiB"
