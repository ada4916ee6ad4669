"""`renderctl status` of a queue as a person or script reads it: each file counted once,
the queue's path as it really is. Real files, real `renderctl status` processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobfns import run_cli

from renderctl.lifecycle import State
from renderctl.store import Queue


def test_a_corrupt_running_record_is_counted_as_corrupt_only(tmp_path: Path) -> None:
    # Given a queue with an unreadable record in running/
    queue = tmp_path / "q"
    Queue(queue).close()
    (queue / "running" / "bad.json").write_text("{not json")

    # When `status` reads it (and quarantines it)
    plain = run_cli("status", "--queue", str(queue))

    # Then the file is counted once, as corrupt, not also as running
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "running=0" in plain.stdout and "corrupt=1" in plain.stdout, plain.stdout
    assert os.listdir(queue / "running") == []
    st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)
    assert (st["running"], st["corrupt"]) == (0, 1)


def test_files_no_job_can_be_named_after_are_not_counted_as_jobs(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a queue with one pending job, and copies made by hand beside it in pending/ and
    # done/ under names no job can have
    queue = tmp_path / "q"
    (tmp_path / "in.txt").write_text("x")
    manifest = write_manifest([{"id": "a", "kind": "command",
                                "argv": ["cp", "{input}", "{output}"],
                                "input": str(tmp_path / "in.txt"), "output": "a.txt"}])
    assert run_cli("submit", manifest, "--queue", queue, "--out", tmp_path / "o").returncode == 0
    record = (queue / "pending" / "a.json").read_bytes()
    for name in ("pending/a (copy).json", "pending/.a.json", "done/a copy.json"):
        (queue / name).write_bytes(record)

    # When `status --json` counts them
    st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)

    # Then each folder counts its jobs only (it said pending 3, done 1)
    assert (st["pending"], st["done"]) == (1, 0), st


def test_status_shows_the_queue_path_without_dot_dot(tmp_path: Path) -> None:
    # Given a queue named through a path with `..` in it, one of whose folders is a symlink
    # (so that `w/..` is not the folder `w` is in)
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "w").symlink_to(tmp_path / "real" / "inner")
    Queue(tmp_path / "real" / "qD").close()
    given = tmp_path / "x" / "w" / ".." / "qD"

    # When `status` shows it
    st = json.loads(run_cli("status", "--json", "--queue", str(given)).stdout)
    plain = run_cli("status", "--queue", str(given)).stdout

    # Then the path shown has no `..` and names the folder the kernel found
    assert st["queue"] == str(tmp_path / "real" / "qD"), st["queue"]
    assert plain.startswith(f"queue {tmp_path / 'real' / 'qD'}: "), plain


def test_status_keeps_a_plain_path_as_given(tmp_path: Path) -> None:
    # Given a queue reached through a symlinked folder, with no `..` in the path
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    Queue(tmp_path / "real" / "q").close()

    # When `status` shows it, then it is the path the user gave (absolute), not resolved
    st = json.loads(run_cli("status", "--json", "--queue", str(tmp_path / "link" / "q")).stdout)
    assert st["queue"] == str(tmp_path / "link" / "q")


def test_a_job_caught_between_two_folders_is_counted_once_where_show_finds_it(
        tmp_path: Path) -> None:
    # Given two jobs as a runner's group commit leaves them for a moment (the new record is
    # renamed into place before the running copy is retired): `a` finished (done/ and still
    # running/), `b` going back for a retry (pending/ and still running/)
    queue = tmp_path / "q"
    q = Queue(queue)
    q.submit([{"id": j, "kind": "python", "callable": "m:f", "output": f"{j}.bin"}
              for j in ("a", "b")], base=tmp_path, out_root=tmp_path / "out")
    q.close()
    (queue / "running" / "a.json").write_bytes((queue / "pending" / "a.json").read_bytes())
    os.rename(queue / "pending" / "a.json", queue / "done" / "a.json")
    (queue / "running" / "b.json").write_bytes((queue / "pending" / "b.json").read_bytes())

    # When `status` and `metrics` count the queue
    st = json.loads(run_cli("status", "--json", "--queue", str(queue)).stdout)
    plain = run_cli("status", "--queue", str(queue)).stdout
    metrics = run_cli("metrics", "--queue", str(queue)).stdout

    # Then each job is counted once, in the state `show` gives it: two jobs, none running
    assert {s: st[s] for s in ("pending", "running", "done")} == {
        "pending": 1, "running": 0, "done": 1}, st
    assert st["running_jobs"] == [], st["running_jobs"]
    assert "pending=1 running=0 done=1 " in plain, plain
    assert "running " not in plain.split("\n", 2)[2], plain  # no `running ID` line
    assert 'renderctl_jobs{state="running"} 0\n' in metrics, metrics
    assert json.loads(run_cli("show", "a", "--json", "--queue", str(queue)).stdout)[
        "state"] == "done"


def test_status_and_top_say_when_the_runner_is_stopped(tmp_path: Path) -> None:
    import signal

    from jobfns import Runner, cli_args, stopped, wait_until

    from renderctl.errors import ExitCode

    # Given a runner following a queue
    queue = tmp_path / "q"
    runner = Runner(*cli_args(queue, tmp_path / "out", "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)

        def status() -> tuple[str, dict[str, object]]:
            plain = run_cli("status", "--queue", str(queue))
            st = run_cli("status", "--json", "--queue", str(queue))
            assert plain.returncode == st.returncode == 0, plain.stderr + st.stderr
            return plain.stdout, json.loads(st.stdout)["runner"]

        text, info = status()
        assert info["pid"] == runner.pid and info["stopped"] is False, info
        assert "stopped" not in text, text

        # When it is stopped (Ctrl-Z, kill -STOP), nothing progresses
        os.kill(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid), what="the runner to stop")

        # Then `status` says so, and how to resume it (before: a live runner, no more), and
        # so does `top` (before: its last figures, frozen, as if live)
        text, info = status()
        assert info["stopped"] is True, info
        assert f"runner pid {runner.pid} on " in text, text
        assert f"(stopped: `fg` in its shell or `kill -CONT {runner.pid}` resumes it)" in text
        top = run_cli("top", "--once", "--queue", str(queue))
        assert f"pid {runner.pid} is STOPPED (Ctrl-Z, SIGSTOP): `fg` in its shell or " \
               f"`kill -CONT {runner.pid}` resumes it" in top.stdout, top.stdout + top.stderr
        os.kill(runner.pid, signal.SIGCONT)
        wait_until(lambda: status()[1]["stopped"] is False, what="status to see it running")
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    finally:
        runner.close()


@contextlib.contextmanager
def _stopped_runner(queue: Path, out: Path) -> Iterator[Any]:
    """A following runner of ``queue``, stopped (Ctrl-Z, SIGSTOP) once it has started, its
    runner.state.json removed; continued and stopped (SIGTERM, 143) at the end."""
    from jobfns import Runner, cli_args, stopped, wait_until

    from renderctl.errors import ExitCode

    runner = Runner(*cli_args(queue, out, "--workers", "1", "--follow", "--json"))
    try:
        runner.until(lambda ln: '"runner_started"' in ln)
        os.kill(runner.pid, signal.SIGSTOP)
        wait_until(lambda: stopped(runner.pid), what="the runner to stop")
        (queue / "runner.state.json").unlink(missing_ok=True)
        yield runner
        os.kill(runner.pid, signal.SIGCONT)
        runner.proc.send_signal(signal.SIGTERM)
        assert runner.wait() == ExitCode.SIGTERM
    finally:
        runner.close()


def test_top_names_a_stopped_runner_that_wrote_no_snapshot_yet(tmp_path: Path) -> None:
    # Given a following runner stopped (Ctrl-Z, SIGSTOP) before its first snapshot: its
    # runner.state.json, written each second, not there yet (removed here, as it is in the
    # runner's first second; the full suite stopped one within it)
    queue = tmp_path / "q"
    with _stopped_runner(queue, tmp_path / "out") as runner:
        # When `top` draws a frame
        top = run_cli("top", "--once", "--queue", str(queue))

        # Then it names the runner by its pid (it said "pid - is STOPPED ... kill -CONT -")
        assert f"pid {runner.pid} is STOPPED (Ctrl-Z, SIGSTOP): `fg` in its shell or " \
               f"`kill -CONT {runner.pid}` resumes it" in top.stdout, top.stdout + top.stderr


def test_metrics_and_top_read_a_state_files_worth_of_a_device_put_in_its_place(
        tmp_path: Path) -> None:
    # Given a stopped runner whose runner.state.json is now a character device that never
    # ends (/dev/zero's numbers)
    queue = tmp_path / "q"
    with _stopped_runner(queue, tmp_path / "out"):
        os.mknod(queue / "runner.state.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))

        # When `metrics` and `top` read the queue
        metrics = run_cli("metrics", "--queue", str(queue), timeout=20)
        top = run_cli("top", "--once", "--queue", str(queue), timeout=20)

        # Then both answer (each read it until memory ran out; the runner's own read was
        # bounded in review FM)
        assert metrics.returncode == 0, metrics.stderr
        assert "renderctl_workers_alive" in metrics.stdout, metrics.stdout
        assert top.returncode == 0, top.stdout + top.stderr


class _MovesBackDuringListing(Queue):
    """A queue whose job x goes from dead/ back to pending/ (a `dead retry`) just as status
    lists done/: after pending/ was listed, before dead/ is. A real rename, at a named
    point: the interleaving a concurrent `dead retry` can produce."""

    armed = False

    def dir(self, name: Any) -> Path:
        d = super().dir(name)
        if self.armed and name == State.DONE:
            self.armed = False
            os.rename(super().dir(State.DEAD) / "x.json", super().dir(State.PENDING) / "x.json")
        return d


def test_a_job_moving_back_to_pending_between_the_listings_is_still_counted(
        tmp_path: Path) -> None:
    # Given a dead job x
    queue = tmp_path / "q"
    q = _MovesBackDuringListing(queue)
    q.submit([{"id": "x", "kind": "python", "callable": "m:f", "output": "x.bin"}],
             base=tmp_path, out_root=tmp_path / "out")
    os.rename(queue / "pending" / "x.json", queue / "dead" / "x.json")

    # When it is retried while status lists the folders
    q.armed = True
    st = q.status()
    q.close()

    # Then it is counted (pending), not lost between the folders
    assert not q.armed, "the move was not made"
    assert sum(st.counts.values()) == 1, st.counts
    assert st.counts["pending"] == 1, st.counts


def test_the_running_count_and_the_running_jobs_agree_when_a_claim_lands_mid_status(
        tmp_path: Path, write_manifest: Any, monkeypatch: Any) -> None:
    # Given a queue with a job running and one pending
    queue = tmp_path / "q"
    (tmp_path / "in.txt").write_text("x")
    manifest = write_manifest([{"id": j, "kind": "command", "argv": ["cp", "{input}", "{output}"],
                                "input": str(tmp_path / "in.txt"), "output": f"{j}.txt"}
                               for j in ("a", "b")])
    assert run_cli("submit", manifest, "--queue", queue, "--out", tmp_path / "o").returncode == 0
    os.rename(queue / "pending" / "a.json", queue / "running" / "a.json")
    q = Queue(queue)
    try:
        # When a runner claims the pending one just after status read the running records,
        # before it lists the folders (the claim made here, as its rename into running/)
        read = q._read_or_quarantine

        def read_then_claim(path: Path) -> Any:
            rec = read(path)
            if (queue / "pending" / "b.json").exists():
                os.rename(queue / "pending" / "b.json", queue / "running" / "b.json")
            return rec

        monkeypatch.setattr(q, "_read_or_quarantine", read_then_claim)
        st = q.status()
    finally:
        q.close()

    # Then both are counted as running and both are listed (it said running 2, listing a
    # alone: `status --json` had `running` above the length of `running_jobs`)
    assert st.counts[State.RUNNING.value] == len(st.running) == 2, st
    assert [r.spec.id for r in st.running] == ["a", "b"]


def test_a_job_queued_in_a_worker_behind_another_is_shown_as_not_started(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import QueueView, Runner, cli_args, held_job, py_job, wait_for_pid, wait_until

    # Given one worker running a job the test holds, and b queued behind it (--prefetch 2)
    queue, out = tmp_path / "q", tmp_path / "out"
    a, go = held_job(tmp_path, "a", priority=2)
    manifest = write_manifest([a, {**py_job("b", "write_pdf"), "priority": 1}])
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1", "--prefetch", "2"))
    try:
        wait_for_pid(tmp_path / "a.pid")
        wait_until(lambda: "b" in QueueView(queue).ids("running"), what="b to be claimed")

        # When `status` looks
        doc = json.loads(run_cli("status", "--json", "--queue", queue).stdout)
        plain = run_cli("status", "--queue", queue).stdout
    finally:
        go.touch()
        runner.close()

    # Then both count as running (claimed), but only a has started; b, waiting in the
    # worker, is said to be (audit DM: timed from its claim, it looked like a second job
    # running on the one worker)
    assert doc["running"] == 2, doc
    assert {j["id"]: j["started"] for j in doc["running_jobs"]} == {"a": True, "b": False}
    assert [j["orphaned"] for j in doc["running_jobs"]] == [False, False]
    assert "running b kind=python attempt=1 elapsed=queued" in plain, plain
    assert "running a kind=python attempt=1 elapsed=queued" not in plain, plain


def test_a_job_whose_runner_died_is_shown_as_orphaned(
        tmp_path: Path, write_manifest: Any) -> None:
    from jobfns import orphan_a_job

    # Given a runner SIGKILLed while its job ran
    queue, _ = orphan_a_job(tmp_path, write_manifest)

    # When `status` looks
    doc = json.loads(run_cli("status", "--json", "--queue", queue).stdout)
    plain = run_cli("status", "--queue", queue).stdout

    # Then the job is still in running/ (until a run recovers it), and both say its runner
    # is dead (audit DM: listed as running, its time growing, with nothing to say why)
    assert [(j["id"], j["orphaned"]) for j in doc["running_jobs"]] == [("a", True)], doc
    assert "(its runner is dead: the next run recovers it)" in plain, plain


def test_status_reads_only_the_end_of_a_long_started_log(tmp_path: Path) -> None:
    from renderctl.recovery import STARTED_LOG, started_tokens

    # Given a worker's started log of 200,000 starts (a long-lived worker), the last one the
    # job it runs now
    q = Queue(tmp_path / "q")
    try:
        log = q.dir("control") / STARTED_LOG.format("w1")
        log.write_text("".join(f"old-{n} 1.5\n" for n in range(200_000)) + "now 2.5\n")

        # When the tokens are read as status reads them (its last 4 KB)
        tail = started_tokens(q, last_bytes=4096)
    finally:
        q.close()

    # Then the running job's start is found, and the bulk of the log was not read
    assert tail["now"] == 2.5 and "old-0" not in tail
    assert 40 < len(tail) < 400, len(tail)
