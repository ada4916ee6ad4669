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


    def json_schema(self) -> dict[str, Any]:
        """This param as JSON Schema (`renderctl schema`, `kinds --json`): its type, choices
        and range; what only ``check`` knows is left to validation."""
        schema: dict[str, Any] = dict(_PARAM_TYPES[self.type])
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.low is not None:
            schema["minimum"] = self.low
        if self.high is not None:
            schema["maximum"] = self.high
        if self.description:
            schema["description"] = self.description
        return schema


# (An "int" param refuses 2.0, which JSON Schema counts as an integer: the renderer would be
# handed a float. A schema cannot tell them apart; validation does.)
_PARAM_TYPES: dict[str, dict[str, Any]] = {
    "str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
    "number": {"type": "number"}, "bool": {"type": "boolean"},
    "list[str]": {"type": "array", "items": {"type": "string"}}, "table": {"type": "object"},
}


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

    def params_schema(self) -> dict[str, Any]:
        """The params table a job of this kind may give, as JSON Schema. Not which are
        required: a job's params are its defaults' with its own on top, key by key."""
        schema: dict[str, Any] = {
            "type": "object", "properties": {p.name: p.json_schema() for p in self.params}}
        if not self.open_params:
            schema["additionalProperties"] = False
        return schema

    def load(self) -> RenderFn:
        """Import and return the render function (in the worker, never in the CLI)."""
        return load_target(self.target)


def load_target(target: str) -> RenderFn:
    """Import a "package.module:function" target and return the function."""
    module_name, _, attr = target.partition(":")
    fn: RenderFn = getattr(importlib.import_module(module_name), attr)
    return fn
