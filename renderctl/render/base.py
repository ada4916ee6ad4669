"""What a renderer is: a pure description (``RendererSpec``) plus a function it names.

A render function is called in a worker process as::

    render(inputs: list[Path], output: Path, params: Mapping[str, Any]) -> None

``output`` is a temporary path beside the final one: a file path to create, or (for
``output = "dir"`` renderers) an existing empty directory to fill. The function raises
``renderctl.errors.InvalidInput`` for inputs no retry can fix; any other exception is a
``failed`` attempt. It must not publish, rename or fsync: the runner does that.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

RenderFn = Callable[[list[Path], Path, Mapping[str, Any]], None]

ParamType = Literal["str", "int", "float", "number", "bool", "list[str]", "table"]


@dataclass(frozen=True)
class ParamSpec:
    """One accepted param of a renderer, checked when a manifest is validated."""

    name: str
    type: ParamType
    required: bool = False
    description: str = ""
    choices: tuple[str, ...] = ()
    # For numbers: the range the renderer accepts, so that validation (not the first
    # attempt, as invalid_input) says a value is out of it.
    low: float | None = None
    high: float | None = None
    # What the type cannot say (not blank, at most N characters): the renderer's own rule
    # (renderctl.render.rules), returning the problem or None, so validation and the run
    # refuse the same values.
    check: Callable[[Any], str | None] | None = None


@dataclass(frozen=True)
class RendererSpec:
    """A renderer's contract: how many inputs, which params, file or folder output."""

    kind: str
    target: str  # "package.module:function", imported lazily in the worker
    description: str
    min_inputs: int = 0
    max_inputs: int | None = None
    params: tuple[ParamSpec, ...] = ()
    output: Literal["file", "dir"] = "file"
    # Unknown params are errors unless a renderer opts out (user callables take any dict).
    open_params: bool = False

    def load(self) -> RenderFn:
        """Import and return the render function (in the worker, never in the CLI)."""
        return load_target(self.target)


def load_target(target: str) -> RenderFn:
    """Import a "package.module:function" target and return the function."""
    module_name, _, attr = target.partition(":")
    fn: RenderFn = getattr(importlib.import_module(module_name), attr)
    return fn
