"""The Python API as a long-lived, multi-threaded web tier uses it: one Queue object kept
for the life of the process, submitting one job per request."""

from __future__ import annotations

import contextlib
import gc
import json
import linecache
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
from renderctl.control import cancel_jobs
from renderctl.lifecycle import State
from renderctl.limits import type_name

PACKAGE = str(Path(renderctl.__file__).parent)


def pyjob(jid: str) -> dict[str, Any]:
    # (A module found anywhere: a submit's advice would name one found nowhere. Never run.)
    return {"id": jid, "kind": "python", "callable": "json:f", "output": f"o/{jid}.pdf"}


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


@pytest.mark.parametrize("call", ["status", "cancel_jobs", "get"])
def test_status_and_cancel_on_a_removed_queue_folder_are_a_queue_error_naming_it(
        queue_dir: Path, tmp_path: Path, call: str) -> None:
    # Given a live Queue object, holding a pending job, whose folder someone removed
    q = Queue(queue_dir)
    q.submit([pyjob("a")], base=tmp_path, out_root=tmp_path / "out")
    shutil.rmtree(queue_dir)
    # When the web tier asks for the status, or cancels the job, through it
    with pytest.raises(RenderctlError) as caught:
        if call == "status":
            q.status()
        elif call == "get":  # (a bare FileNotFoundError before: audit BD)
            q.get("a")
        else:
            cancel_jobs(q, ["a"])
    # Then it is renderctl's I/O error naming the queue, as a submit's is
    assert isinstance(caught.value, QueueIOError)
    assert str(queue_dir) in str(caught.value) and "\n" not in str(caught.value)
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


@pytest.mark.parametrize("jobs", ["hello", pyjob("a"), b"a"], ids=["str", "one dict", "bytes"])
def test_jobs_that_are_not_a_list_of_jobs_are_one_manifest_error_naming_what_was_passed(
        queue_dir: Path, tmp_path: Path, jobs: Any) -> None:
    # Given a web tier that passes one job, or a string, where a list of jobs belongs
    q = Queue(queue_dir)
    # When it submits it
    with pytest.raises(ManifestError) as caught:
        q.submit(jobs, base=tmp_path, out_root=tmp_path / "out")
    # Then one problem says what a submit takes and what it was given (not a problem per
    # character, or per key of the dict)
    [problem] = caught.value.problems
    assert "a list of jobs" in str(problem) and type(jobs).__name__ in str(problem), problem
    assert q.list_ids(State.PENDING) == []


@pytest.mark.parametrize("where", ["a file", "a path through a file", "the queue",
                                   "inside the queue", "outputs in the queue"])
def test_a_submit_whose_outputs_no_run_could_publish_is_refused(
        queue_dir: Path, tmp_path: Path, where: str) -> None:
    # Given a queue with a job already accepted, and an output root a run cannot publish
    # into: a file, a path through one, the queue folder itself or a folder in it, or an
    # output that lands among the queue's files
    q = Queue(queue_dir)
    q.submit([pyjob("ok")], base=tmp_path, out_root=tmp_path / "out")
    (tmp_path / "afile").write_text("x")
    job = pyjob("bad")
    out_root = {"a file": tmp_path / "afile", "a path through a file": tmp_path / "afile" / "o",
                "the queue": queue_dir, "inside the queue": queue_dir / "pending",
                "outputs in the queue": tmp_path}[where]
    if where == "outputs in the queue":
        job["output"] = f"{queue_dir.name}/done/bad.json"

    # When a web tier submits a job there
    with pytest.raises(ManifestError) as refused:
        q.submit([job], base=tmp_path, out_root=out_root)

    # Then it is refused, naming why, and nothing is enqueued (before: accepted, and then
    # every run of the queue stopped on it, exit 74, or its output was filed as a record)
    message = str(refused.value)
    assert ("not a folder (the output root)" in message if "file" in where
            else "queue folder" in message), message
    assert q.list_ids(State.PENDING) == ["ok"]


def test_a_queue_is_not_made_in_an_empty_path_or_among_a_users_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a project folder with files of its own, as the current folder
    (tmp_path / "app.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)

    # When a web tier opens a queue at "" (the current folder) or at that folder
    # Then each is refused as the command line refuses it, and the folder is left as it was
    # (before: the queue's folders were laid out among its files: audit BD)
    for path in ("", tmp_path):
        with pytest.raises(RenderctlError, match="queue"):
            Queue(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["app.py"]
    # (a missing folder, or one holding only .gitkeep, becomes a queue as before)
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / ".gitkeep").touch()
    assert (Queue(tmp_path / "q").path / "pending").is_dir()
    assert (Queue(tmp_path / "new").path / "pending").is_dir()


def test_arguments_of_the_wrong_type_are_renderctls_errors_and_change_nothing(
        queue_dir: Path, tmp_path: Path) -> None:
    q = Queue(queue_dir)
    q.submit([pyjob("keep")], base=tmp_path, out_root=tmp_path / "out")
    # A field named by a number, a max_pending given as a string, an id where a list of
    # ids belongs: each was a TypeError from deep inside, and the last cancelled one job
    # per character of the id (audit BD)
    with pytest.raises(ManifestError, match="a key must be a string, got a number"):
        q.submit([{**pyjob("a"), 1: 2}], base=tmp_path, out_root=tmp_path / "out")
    with pytest.raises(RenderctlError, match="max_pending must be a whole number"):
        q.submit([pyjob("b")], base=tmp_path, out_root=tmp_path / "out",
                 max_pending="5")  # type: ignore[arg-type]
    with pytest.raises(RenderctlError, match="takes a list of ids"):
        cancel_jobs(q, "keep")  # type: ignore[arg-type]
    # Params the queue's JSON cannot hold as given: a number key (stored as "1", and the
    # same submit again refused as "a different spec"), a set; a NUL in a folder's name
    # (a ValueError from deep inside: review BH)
    with pytest.raises(ManifestError) as refused:
        q.submit([{**pyjob("c"), "params": {1: "x", "s": {1, 2}}}], base=tmp_path,
                 out_root=tmp_path / "out")
    assert {(p.field, p.message) for p in refused.value.problems} == {
        ("params.1", "a key must be a string, got a number"),
        ("params.s", "cannot be stored in the queue: set")}
    # An output or id given as a Path (a web tier's likeliest slip), a TOML nan: refused
    # (a KeyError from deep inside before: review BK)
    for bad in ({**pyjob("e"), "output": Path("e.pdf")}, {**pyjob("f"), "id": Path("f")},
                {**pyjob("g"), "output": float("nan")}):
        with pytest.raises(ManifestError):
            q.submit([bad], base=tmp_path, out_root=tmp_path / "out")
    for folder in ("base", "out_root"):
        with pytest.raises(ManifestError, match=f"{folder}: must not contain NUL"):
            q.submit([pyjob("d")], **{"base": tmp_path, "out_root": tmp_path / "out",
                                      folder: "x\x00y"})
        # (None or a number: a TypeError from deep inside; audit CX)
        with pytest.raises(ManifestError, match=f"{folder}: must be a str or a path, got "):
            q.submit([pyjob("d")], **{"base": tmp_path, "out_root": tmp_path / "out",
                                      folder: 5})
    with pytest.raises(RenderctlError, match="limits must be a renderctl.manifest.Limits"):
        q.submit([pyjob("d")], base=tmp_path, out_root=tmp_path / "out",
                 limits="x")  # type: ignore[arg-type]
    # A queue path with a NUL (a ValueError), or none at all (a TypeError)
    for path in (f"{queue_dir}\x00y", None):
        with pytest.raises(RenderctlError, match="the queue's path must"):
            Queue(path)  # type: ignore[arg-type]
    assert q.list_ids(State.PENDING) == ["keep"]
    # (a tuple is stored as the list it becomes, and the same submit again is "already")
    first = q.submit([{**pyjob("t"), "params": {"t": (1, 2)}}], base=tmp_path,
                     out_root=tmp_path / "out")
    again = q.submit([{**pyjob("t"), "params": {"t": (1, 2)}}], base=tmp_path,
                     out_root=tmp_path / "out")
    assert (first.accepted, again.already) == (("t",), ("t",))


def test_a_queue_made_by_another_opener_between_its_looks_is_opened(tmp_path: Path) -> None:
    # Given a Queue being opened on a new folder, at the moment it has found no pending/
    # and is about to list the folder for a user's files, another thread (or process)
    # makes the queue there
    where = tmp_path / "q"
    where.mkdir()
    from renderctl.fsutil import holds_users_files

    code = holds_users_files.__code__
    listing = next(line for _, _, line in code.co_lines()
                   if line and "os.scandir" in linecache.getline(code.co_filename, line))
    made: list[Queue] = []

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == listing and not made:
            made.append(Queue(where))  # (its own open runs through here too: once)
        return trace

    sys.settrace(trace)
    try:
        # When the first opener goes on
        q = Queue(where)
    finally:
        sys.settrace(None)

    # Then it opens the queue the other made (before: it found the queue's folders, took
    # them for a user's files and refused: 76 of 1,200 opens by four threads, review BH)
    assert made and q.path == made[0].path and (where / "pending").is_dir()


def test_jobs_given_as_a_generator_are_all_submitted(queue_dir: Path, tmp_path: Path) -> None:
    # Given jobs made on the fly, as a generator
    q = Queue(queue_dir)
    # When they are submitted
    res = q.submit((pyjob(f"g{i}") for i in range(3)), base=tmp_path,  # type: ignore[arg-type]
                   out_root=tmp_path / "out")
    # Then every one of them is accepted, the first included
    assert res.accepted == ("g0", "g1", "g2")
    assert q.list_ids(State.PENDING) == ["g0", "g1", "g2"]


@pytest.mark.parametrize(("broken", "jobs"), [
    ("event log", 1), ("event log", 3), ("journal", 1)],
    ids=["event log, one job", "event log, a batch", "doorbell, one job"])
def test_a_step_after_acceptance_that_fails_does_not_fail_the_submit(
        queue_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str,
        jobs: int) -> None:
    # Given a queue whose event log can take no more (it is /dev/full), or whose journal
    # folder, where a one-job submit rings the runner's doorbell, was replaced by a file
    q = Queue(queue_dir)
    if broken == "event log":
        (queue_dir / "events.jsonl").symlink_to("/dev/full")
    else:
        shutil.rmtree(queue_dir / "journal")
        (queue_dir / "journal").write_text("not a folder")
    ids = tuple(f"j{i}" for i in range(jobs))

    # When the web tier submits
    with caplog.at_level("WARNING", logger="renderctl"):
        res = q.submit([pyjob(j) for j in ids], base=tmp_path, out_root=tmp_path / "out")

    # Then the jobs are accepted (they are in pending/ by then): the call succeeds, and
    # what failed afterwards is reported on the result and logged, naming the file
    assert res.accepted == ids
    assert q.list_ids(State.PENDING) == list(ids)
    named = queue_dir / ("events.jsonl" if broken == "event log" else "journal")
    assert len(res.warnings) == 1 and str(named) in res.warnings[0], res.warnings
    assert [r.getMessage() for r in caplog.records if r.name == "renderctl"] == \
        list(res.warnings)
    # And a retry says "already accepted", as it should
    again = q.submit([pyjob(j) for j in ids], base=tmp_path, out_root=tmp_path / "out")
    assert (again.accepted, again.already) == ((), ids)


def _paused_at_the_end_of(fn: Any, parties: int) -> Any:
    """A thread trace function that holds each thread on ``fn``'s last line (its return)
    until ``parties`` threads are there: every caller has done what precedes it."""
    code = fn.__code__
    last = max(line for _, _, line in code.co_lines() if line is not None)
    barrier = threading.Barrier(parties, timeout=10)

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == last:
            barrier.wait()
        return trace

    return trace


def together_past_tmp_name(fn: Any, ids: list[str]) -> None:
    """Call ``fn(id)`` for each id in a thread of its own, each held where Queue._tmp_name
    returns until all are there: every one has named its temporary before any uses it."""
    threading.settrace(_paused_at_the_end_of(Queue._tmp_name, len(ids)))
    try:
        threads = [threading.Thread(target=fn, args=(j,)) for j in ids]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]


def test_threads_writing_control_files_at_once_never_share_a_temporary(
        queue_dir: Path) -> None:
    # Given one Queue object, and two threads each asking the runner to cancel a job at
    # the same moment: both have taken a temporary's name before either uses it
    q = Queue(queue_dir)
    errors: list[str] = []

    def ask(jid: str) -> None:
        try:
            q.request_cancel(jid)
        except OSError as exc:
            errors.append(repr(exc))

    together_past_tmp_name(ask, ["a", "b"])
    # Then each request was written through a temporary of its own: both are in place
    assert errors == []
    assert sorted(q.cancel_requests()) == ["a", "b"]


def test_threads_each_with_a_queue_object_of_their_own_cancel_at_once(
        queue_dir: Path, tmp_path: Path) -> None:
    # Given two pending jobs, and two threads of one process each cancelling one through a
    # Queue object of its own, at the same moment: both have named their cancel's intent
    # before either writes it
    Queue(queue_dir).submit([pyjob("a"), pyjob("b")], base=tmp_path, out_root=tmp_path / "o")
    results: dict[str, Any] = {}

    def cancel(jid: str) -> None:
        try:
            results[jid] = [r.outcome for r in cancel_jobs(Queue(queue_dir), [jid])]
        except RenderctlError as exc:
            results[jid] = repr(exc)

    together_past_tmp_name(cancel, ["a", "b"])

    # Then both cancels are done and settled, each with its reason and event, and no intent
    # is left (before: the objects counted their temporaries alike, one create failed with
    # "File exists" and its clean-up removed the other's file: audit BD)
    assert results == {"a": ["cancelled"], "b": ["cancelled"]}
    q = Queue(queue_dir)
    for jid in ("a", "b"):
        view = q.get(jid)
        assert view.state is State.CANCELLED and view.record.reason, view
    assert list((queue_dir / "journal").glob("*.cancel")) == []
    events = [json.loads(line) for line in (queue_dir / "events.jsonl").read_text().splitlines()]
    assert sorted(e["job"] for e in events if e["event"] == "cancelled") == ["a", "b"]


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


@pytest.mark.parametrize("bad", ["../done/d1", "../pending/p1", "../../outside/victim",
                                 "/etc/victim", ".hidden", "", 5])
def test_ids_no_job_can_have_touch_nothing_inside_the_queue_or_out(
        queue_dir: Path, tmp_path: Path, bad: Any) -> None:
    # Given a queue with a done job and a pending one, a record-like file outside the
    # queue, and every file's bytes as they are
    q = Queue(queue_dir)
    q.submit([pyjob("d1"), pyjob("p1")], base=tmp_path, out_root=tmp_path / "out")
    os.replace(queue_dir / "pending" / "d1.json", queue_dir / "done" / "d1.json")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.json").write_text('{"not": "a job"}')
    q.request_cancel("p1")  # (an open request a bad id must not clear)

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*")
                if p.is_file() and "journal" not in p.parts and p.name != "events.jsonl"}

    before = files()

    # When a web tier passes it on to cancel, to dead retry, and to the request calls
    results = cancel_jobs(q, [bad])
    revived = q.dead_retry([bad])
    with pytest.raises(RenderctlError, match="not a job id"):
        q.request_cancel(bad)
    with pytest.raises(RenderctlError, match="not a job id"):
        q.clear_cancel_request(bad)

    # Then the cancel says "not found" (before: "cancelled", having rewritten d1's done
    # record, left p1 pending to run, or moved a file outside the queue into corrupt/;
    # audit CX), nothing is retried, and no file anywhere changed
    assert [r.outcome for r in results] == ["not found"]
    assert revived == []
    assert files() == before
    assert not any(queue_dir.joinpath("corrupt").iterdir())
    assert {v.state for v in (q.get("d1"), q.get("p1"))} == {State.DONE, State.PENDING}


def test_a_changed_job_is_refused_naming_the_fields_that_differ(queue_dir: Path,
                                                                tmp_path: Path) -> None:
    # Given a job in the queue
    q = Queue(queue_dir)
    q.submit([pyjob("a")], base=tmp_path, out_root=tmp_path / "out")

    # When a web tier submits it again with another timeout
    with pytest.raises(ManifestError) as refused:
        q.submit([{**pyjob("a"), "timeout_s": 5}], base=tmp_path, out_root=tmp_path / "out")

    # Then the refusal names the field, and how the API replaces it (before: neither, and a
    # command line flag; audit CX)
    [problem] = refused.value.problems
    assert "differs in timeout_s" in problem.message, problem.message
    assert "replace=True" in problem.message, problem.message


def test_a_submit_says_which_accepted_jobs_look_doomed_here(
        queue_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given jobs that are valid but doomed where they are submitted: a module not found, a
    # program not on PATH, an output that exists, a deadline past; and one that is fine
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "taken.pdf").write_bytes(b"%PDF-1.4 someone's\n")
    (tmp_path / "fine_mod.py").write_text("def f(inputs, output, params): pass\n")
    jobs = [{**pyjob("nomod"), "callable": "no_such_module_here:f"},
            {"id": "noprog", "kind": "command", "argv": ["no-such-renderctl-tool", "{output}"],
             "output": "noprog.pdf"},
            {**pyjob("taken"), "output": "taken.pdf"},
            {**pyjob("late"), "deadline": "2000-01-01T00:00:00Z"},
            {**pyjob("fine"), "callable": "fine_mod:f"}]
    sys_path, finders = list(sys.path), dict(sys.path_importer_cache)

    # When a web tier submits them
    with caplog.at_level("WARNING", logger="renderctl"):
        res = Queue(queue_dir).submit(jobs, base=tmp_path, out_root=tmp_path / "out")

    # Then all are accepted, and the result says which look doomed and why, as `submit`
    # warns (before: nothing, to an API caller; audit CX), each also logged; the module
    # was looked up with sys.path left as it was (other threads import meanwhile), and
    # no finder kept for the upload folder (one per folder, for good; review CY)
    assert len(res.accepted) == 5
    said = {(p.job, p.field): p.message for p in res.advice}
    assert set(said) == {("nomod", "callable"), ("noprog", "argv[0]"), ("taken", "output"),
                         ("late", "deadline")}, said
    assert "module 'no_such_module_here' not found here" in said["nomod", "callable"]
    assert "dead-lettered (output_exists)" in said["taken", "output"]
    assert "will expire without running" in said["late", "deadline"]
    assert len([r for r in caplog.records if r.name == "renderctl"]) == 4
    assert sys.path == sys_path
    assert str(tmp_path) not in sys.path_importer_cache
    assert sys.path_importer_cache.keys() == finders.keys()


def test_many_doomed_jobs_are_all_in_the_advice_and_logged_in_bounded_form(
        queue_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Given 40 jobs whose deadline is past (a stale batch resubmitted)
    jobs = [{**pyjob(f"late{i}"), "deadline": "2000-01-01T00:00:00Z"} for i in range(40)]

    # When a web tier submits them
    with caplog.at_level("WARNING", logger="renderctl"):
        res = Queue(queue_dir).submit(jobs, base=tmp_path, out_root=tmp_path / "out")

    # Then the result names each, and the log the first five and how many more (before:
    # one line a job, 5,001 lines for 5,000; review CY)
    assert len(res.advice) == 40
    logged = [r.getMessage() for r in caplog.records if r.name == "renderctl"]
    assert len(logged) == 6, logged
    assert logged[-1] == "35 more accepted job(s) whose deadline is already past"


def test_a_submit_of_jobs_already_accepted_gives_no_advice_again(queue_dir: Path,
                                                                 tmp_path: Path) -> None:
    q = Queue(queue_dir)
    job = {**pyjob("late"), "deadline": "2000-01-01T00:00:00Z"}
    assert len(q.submit([job], base=tmp_path, out_root=tmp_path / "out").advice) == 1
    again = q.submit([job], base=tmp_path, out_root=tmp_path / "out")
    assert (again.already, again.advice) == (("late",), ())
