"""Param rules that validation and the renderers share, so they cannot drift apart.

Each rule takes a param's value and returns what is wrong with it, or None. Validation runs
it through ``ParamSpec.check`` (a manifest error naming the job and ``params.<name>``);
the renderer runs the same rule at run time through ``require`` (``InvalidInput``), for
jobs that reached the queue another way. Nothing here imports reportlab or pypdf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from renderctl.errors import InvalidInput
from renderctl.render.text import plain, undrawable

MAX_STAMP_TEXT = 200


def stamp_text(value: Any) -> str | None:
    """A stamp is one line of drawable text: not blank once control characters are dropped."""
    if not isinstance(value, str) or not plain(value):
        return "a non-empty string is required"
    length = len(plain(value))
    if length > MAX_STAMP_TEXT:
        return f"{length} characters is more than {MAX_STAMP_TEXT}"
    return undrawable(value)


def heading(value: Any) -> str | None:
    """A heading: a string with something besides whitespace in it, that the fonts can draw.
    Control characters count as nothing: they are dropped when the heading is drawn."""
    if not isinstance(value, str) or not plain(value):
        return "a non-empty string is required"
    return undrawable(value)


def drawable_text(value: Any) -> str | None:
    """Text the renderer prints: nothing in it the fonts would print as a black box."""
    return undrawable(value) if isinstance(value, str) else None


def column_names(value: Any) -> str | None:
    """A report's column selection: at least one name (which ones exist is the CSV's say)."""
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        return "expected a non-empty list of column names"
    return None


def total_names(value: Any) -> str | None:
    """A report's totalled columns: a list of names, empty for no totals row."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return "expected a list of column names ([] for no totals row)"
    return None


def require(name: str, value: Any, rule: Callable[[Any], str | None]) -> None:
    """Raise InvalidInput naming ``params.<name>`` if ``rule`` finds ``value`` wrong."""
    problem = rule(value)
    if problem is not None:
        raise InvalidInput(f"params.{name}: {problem}")
