"""renderctl: a crash-safe batch runner for PDF renders.

The public Python API for programs that enqueue::

    from renderctl import Queue
    Queue(".renderctl").submit([{"id": "inv-1", "kind": "invoice", "input": "a.json",
                                 "output": "inv-1.pdf"}])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from renderctl.errors import (
        InvalidInput,
        InvalidOutput,
        JobNotFound,
        ManifestError,
        QueueBusy,
        QueueError,
        QueueIOError,
        RenderctlError,
        Saturated,
        SubmitIncomplete,
        UserError,
    )
    from renderctl.manifest import JobSpec
    from renderctl.store import Queue

__all__ = ["InvalidInput", "InvalidOutput", "JobNotFound", "JobSpec", "Queue", "ManifestError",
           "QueueBusy", "QueueError", "QueueIOError", "RenderctlError", "Saturated",
           "SubmitIncomplete", "UserError"]
__version__ = "0.1.0"

# Loaded when first asked for (PEP 562), not by every import of a renderctl module: the
# command line's launcher must set its signal handlers before ~0.2 s of imports (see
# renderctl/cli/launch.py), and it is inside this package.
_WHERE = {"JobSpec": "renderctl.manifest", "Queue": "renderctl.store",
          **{name: "renderctl.errors" for name in __all__ if name not in ("JobSpec", "Queue")}}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'renderctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once: later lookups find it without this function
    return value
