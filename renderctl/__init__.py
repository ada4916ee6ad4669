"""renderctl: a crash-safe batch runner for PDF renders.

The public Python API for programs that enqueue::

    from renderctl import Queue
    Queue(".renderctl").submit([{"id": "inv-1", "kind": "invoice", "input": "a.json",
                                 "output": "inv-1.pdf"}])
"""

from renderctl.errors import (
    InvalidInput,
    InvalidOutput,
    ManifestError,
    QueueError,
    QueueIOError,
    RenderctlError,
    Saturated,
    SubmitIncomplete,
)
from renderctl.manifest import JobSpec
from renderctl.store import Queue

__all__ = ["InvalidInput", "InvalidOutput", "JobSpec", "ManifestError", "Queue", "QueueError",
           "QueueIOError", "RenderctlError", "Saturated", "SubmitIncomplete"]
__version__ = "0.1.0"
