"""The Python API as a long-lived, multi-threaded web tier uses it: one Queue object kept
for the life of the process, submitting one job per request."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import renderctl
from renderctl import ManifestError, Queue, QueueIOError, RenderctlError  # as a web tier does
from renderctl.limits import type_name

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


def test_threads_sharing_a_queue_log_events_through_a_rotation_without_touching_other_files(
        queue_dir: Path) -> None:
    # Given one Queue object whose event log threads append to (a submit, a cancel, a
    # quarantine), a thread rotating the log as logrotate does, and threads that open,
    # write and read back files of their own, as a submit's record writes do
    q = Queue(queue_dir)
    writers, rounds = 4, 3000
    start = threading.Barrier(writers + 3)
    done = threading.Event()
    errors: list[str] = []
    own = queue_dir / "tmp"

    def append(t: int) -> None:
        start.wait()
        for i in range(rounds):
            try:
                q.events.append([{"event": "test", "t": t, "i": i}])
            except OSError as exc:
                errors.append(f"append: {exc!r}")

    def rotate() -> None:
        start.wait()
        k = 0
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                os.rename(q.events.path, queue_dir / f"events.{k}")
            k += 1

    def bystander(n: int) -> None:
        start.wait()
        path = own / f"bystander.{n}"
        while not done.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.write(fd, b"mine")
                os.close(fd)
                if path.read_bytes() != b"mine":
                    errors.append(f"{path} holds {path.read_bytes()!r}")
            except OSError as exc:
                errors.append(f"bystander: {exc!r}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as a loaded server's
    try:
        others = [threading.Thread(target=rotate),
                  *(threading.Thread(target=bystander, args=(n,)) for n in range(2))]
        appenders = [threading.Thread(target=append, args=(t,)) for t in range(writers)]
        for th in [*others, *appenders]:
            th.start()
        for th in appenders:
            th.join()
        done.set()
        for th in others:
            th.join()
    finally:
        sys.setswitchinterval(old)
    q.events.close()
    # Then nobody saw an error, no other file was written or closed under its owner
    assert errors == [], errors[:5]
    # And every event is in one of the logs, once
    lines = [json.loads(line) for p in queue_dir.glob("events*")
             for line in p.read_text().splitlines()]
    assert sorted((e["t"], e["i"]) for e in lines) == [
        (t, i) for t in range(writers) for i in range(rounds)]
