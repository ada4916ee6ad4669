"""The Python API as a long-lived, multi-threaded web tier uses it: one Queue object kept
for the life of the process, submitting one job per request."""

from __future__ import annotations

import gc
import shutil
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import renderctl
from renderctl.errors import ManifestError, QueueIOError, RenderctlError
from renderctl.limits import type_name
from renderctl.store import Queue

PACKAGE = str(Path(renderctl.__file__).parent)


def pyjob(jid: str) -> dict[str, Any]:
    return {"id": jid, "kind": "python", "callable": "m:f", "output": f"o/{jid}.pdf"}


def test_a_long_lived_queue_keeps_nothing_per_submitted_job(queue_dir: Path,
                                                            tmp_path: Path) -> None:
    # Given a web tier's Queue object, warmed up
    q = Queue(queue_dir)
    for i in range(20):
        q.submit([pyjob(f"warm-{i}")], base=tmp_path, out_root=tmp_path / "out")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        # When it submits 500 more one-job requests
        for i in range(500):
            q.submit([pyjob(f"req-{i}")], base=tmp_path, out_root=tmp_path / "out")
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # Then renderctl holds on to (almost) nothing more than before: no per-job memory
    grown = sum(d.size_diff for d in after.compare_to(before, "filename")
                if d.traceback[0].filename.startswith(PACKAGE))
    assert grown < 16 * 1024, f"{grown} bytes kept after 500 submits"


@pytest.mark.parametrize("jobs", [1, 3], ids=["one job", "a batch"])
def test_a_submit_into_a_removed_queue_folder_is_a_queue_error_naming_it(
        queue_dir: Path, tmp_path: Path, jobs: int) -> None:
    # Given a live Queue object whose folder someone removed
    q = Queue(queue_dir)
    shutil.rmtree(queue_dir)
    # When the web tier submits through it
    with pytest.raises(RenderctlError) as caught:
        q.submit([pyjob(f"j{i}") for i in range(jobs)], base=tmp_path,
                 out_root=tmp_path / "out")
    # Then it is renderctl's I/O error (exit 74 on the command line), naming the queue
    assert isinstance(caught.value, QueueIOError)
    assert str(queue_dir) in str(caught.value) and "\n" not in str(caught.value)
    # And nothing was enqueued (nor the folder made again behind the operator's back)
    assert not queue_dir.exists()


@pytest.mark.parametrize("job", ["inv-1", 7, None, ["id", "x"]], ids=repr)
def test_a_job_that_is_not_a_dict_is_a_manifest_error_naming_it(
        queue_dir: Path, tmp_path: Path, job: Any) -> None:
    # Given a web tier that passes something other than a dict (or a JobSpec) as a job
    q = Queue(queue_dir)
    # When it submits it beside a good job
    with pytest.raises(ManifestError) as caught:
        q.submit([pyjob("good"), job], base=tmp_path, out_root=tmp_path / "out")
    # Then the problem names the job by its place and says what a job must be
    assert [str(p) for p in caught.value.problems] == [
        f"<api>: job #1: a job must be a table, got {type_name(job)}"]
    # And nothing was enqueued
    assert q.find("good") is None
