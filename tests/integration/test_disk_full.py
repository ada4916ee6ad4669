"""A disk that fills up mid-run, and a worker that cannot write its own bookkeeping.

The disk is real: a 24 MB ext4 file system on a loop device (needs root, mkfs.ext4 and a
free loop device; skipped, saying why, where those are missing), filled by the test once
part of the run is done, and kept full until the runner gives up.
The worker's error is real too: its started log is /dev/full, where every write fails with
ENOSPC.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    RENDERCTL,
    QueueView,
    Runner,
    assert_pdf,
    cli_args,
    py_job,
    run_cli,
    stage,
    stray_temporaries,
    wait_until,
)

from renderctl.errors import ExitCode, QueueIOError, SubmitIncomplete
from renderctl.lifecycle import State
from renderctl.messages import Broken, Ready, RunJob, Stop
from renderctl.recovery import started_tokens
from renderctl.store import Queue
from renderctl.worker import WorkerConfig, worker_main


@contextlib.contextmanager
def mounted(mnt: Path, *args: str) -> Iterator[Path]:
    """``mount ARGS MNT`` for the block (skipped, saying why, where it cannot be)."""
    mnt.mkdir(exist_ok=True)
    r = subprocess.run(["mount", *args, str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount {args[-1]} here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)])


def ext4_image(tmp_path: Path, *mkfs: str) -> Path:
    """A 24 MB ext4 image (skipped where root or mkfs.ext4 is missing)."""
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to make a small real file system")
    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(24 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", *mkfs, str(image)], check=True)
    return image


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    # -m 0: no blocks reserved for root (we are root; the disk must really fill).
    image = ext4_image(tmp_path, "-m", "0")
    with mounted(tmp_path / "disk", "-o", "loop", str(image)) as mnt:
        yield mnt


def fill(path: Path) -> int:
    """Write ``path`` until the disk refuses even 4 KB; returns its fd, still open."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for size in (1 << 20, 4096):
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, bytes(size))
    return fd


def begun_attempts(queue: Path) -> dict[str, int]:
    """Jobs left in running/ whose attempt a worker had begun (its token in a started log),
    with that attempt's number."""
    q = Queue(queue)
    started = started_tokens(q)
    begun = {}
    for jid in q.list_ids(State.RUNNING):
        view = q.find(jid)
        lease = view.record.lease if view is not None else None
        if lease is not None and lease.token in started:
            begun[jid] = lease.attempt
    return begun


@pytest.mark.parametrize("crash", [None, "shutdown"])
def test_a_full_disk_stops_the_run_with_74_and_a_rerun_after_freeing_space_loses_nothing(
        small_disk: Path, tmp_path: Path, write_manifest, crash: str | None) -> None:
    # Given a run of 200 short jobs on the small disk, 20 of them done (and, in one case,
    # a runner that SIGKILLs itself at the end of its shutdown: after it wrote its jobs off
    # as released, before it exits)
    folder = stage(small_disk / "jobs")
    jobs = [py_job(f"j{i}", "sleep_then_write", s=0.02) for i in range(200)]
    # Enough attempts that no job runs out of them while the disk is full.
    manifest = write_manifest(jobs, defaults={"max_attempts": 10}, folder=folder)
    queue, out = small_disk / "q", small_disk / "out"
    ids = {j["id"] for j in jobs}
    view = QueueView(queue)
    logs = tmp_path / "stdout", tmp_path / "stderr"
    with open(logs[0], "w") as so, open(logs[1], "w") as se:
        runner = subprocess.Popen([*RENDERCTL, "run", str(manifest),
                                   *cli_args(queue, out, "--workers", "2", "--quiet")],
                                  stdout=so, stderr=se,
                                  env={**os.environ, **({"RENDERCTL_CRASH_AT": crash}
                                                        if crash else {})})
    try:
        wait_until(lambda: len(view.ids("done")) >= 20, what="20 jobs to complete")

        # When the disk fills up, and stays full (every block freed is taken again)
        ballast = small_disk / "ballast"
        fd = fill(ballast)
        try:
            while True:
                try:
                    runner.wait(timeout=0.005)
                    break
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(OSError):
                        os.write(fd, bytes(4096))
        finally:
            os.close(fd)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    stdout, stderr = logs[0].read_text(), logs[1].read_text()

    # Then the run stops with 74, naming the error and a file on that disk, and nobody
    # (runner or worker) prints a traceback; its summary is still the last line (audit EW:
    # none); every accepted job is still in the queue
    if crash:
        assert runner.returncode == -signal.SIGKILL, (stdout, stderr)
    else:
        assert runner.returncode == ExitCode.IO_ERROR, (stdout, stderr)
        assert "No space left on device" in stderr
        assert f"({small_disk}" in stderr, stderr
        assert stdout.splitlines()[-1].startswith("summary: ") and "exit 74" in stdout, stdout
    assert "Traceback" not in stdout + stderr, stderr
    assert view.all_ids() == ids
    # and the attempts that had begun are still on record for the next run to charge
    begun = begun_attempts(queue)
    assert begun, "no attempt was under way when the disk filled: the test proves nothing"

    # When space is freed and the queue is run again
    ballast.unlink()
    second = run_cli("run", *cli_args(queue, out, "--workers", "2", "--quiet"), timeout=120)

    # Then every job completed exactly once, each output a whole PDF, nothing left over
    assert second.returncode == ExitCode.OK, (second.stdout, second.stderr)
    assert all(states == ["done"] for states in view.states_of(ids).values())
    for jid in ids:
        assert_pdf(Path(view.record("done", jid)["result"]["path"]), jid)
    # and each attempt the first run had begun is released, not charged: the queue's disk
    # was full, not the job at fault (audit EW: charged `crashed`, dead at max_attempts = 1)
    for jid, attempt in begun.items():
        outcomes = dict(enumerate((a["outcome"] for a in view.record("done", jid)["attempts"]),
                                  start=1))
        assert outcomes.get(attempt) == "released", (jid, outcomes)
    assert stray_temporaries(out) == []


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs: a failed fallocate there gives nothing back (ext4 keeps what it got)."""
    with mounted_tmpfs(tmp_path / "tmpfs", "size=24m") as mnt:
        yield mnt


def test_a_run_started_with_little_room_still_releases_its_jobs_uncharged_when_it_fills(
        small_tmpfs: Path, write_manifest: Any) -> None:
    # Given 20 jobs of one attempt each queued on a file system with 128 KiB free: less
    # than the room the runner reserves for its release log
    folder = stage(small_tmpfs / "jobs")
    jobs = [py_job(f"j{i}", "sleep_then_write", s=0.5) for i in range(20)]
    manifest = write_manifest(jobs, defaults={"max_attempts": 1}, folder=folder)
    queue, out = small_tmpfs / "q", small_tmpfs / "out"
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    ballast = small_tmpfs / "ballast"
    os.close(fill(ballast))
    os.truncate(ballast, ballast.stat().st_size - (128 << 10))

    # When it runs, and the disk fills as its first jobs run
    runner = Runner(*cli_args(queue, out, "--workers", "2", "--json"))
    try:
        runner.until(lambda ln: '"event": "started"' in ln)
        fd = fill(small_tmpfs / "more")
        try:
            while runner.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.write(fd, bytes(4096))
        finally:
            os.close(fd)
        code = runner.wait(60)
        said = runner.stderr()
    finally:
        runner.close()

    # Then it stops with 74 and its summary, saying its jobs in flight go back uncharged
    # (review EX: the 256 KiB reservation failed whole, the release had no block to go to,
    # and the next run charged them `crashed`, dead at one attempt)
    assert code == ExitCode.IO_ERROR, (runner.lines, said)
    assert json.loads(runner.lines[-1])["event"] == "summary", runner.lines[-3:]
    assert "go back to pending uncharged" in said, said

    # and run again with the room freed, every job completes
    ballast.unlink()
    (small_tmpfs / "more").unlink()
    second = run_cli("run", *cli_args(queue, out, "--workers", "2", "--quiet"), timeout=120)
    assert second.returncode == ExitCode.OK, (second.stdout, second.stderr)
    assert QueueView(queue).ids("done") == {j["id"] for j in jobs}


def test_a_queue_gone_read_only_under_a_run_ends_it_with_its_summary_and_says_so(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a run on an ext4 that goes read-only on its first error (errors=remount-ro)
    image = ext4_image(tmp_path)
    with mounted(tmp_path / "disk", "-o", "loop,errors=remount-ro", str(image)) as mnt:
        dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mnt)], capture_output=True,
                             text=True).stdout.strip()
        trigger = Path("/sys/fs/ext4") / Path(dev).name / "trigger_fs_error"
        if not trigger.exists():
            pytest.skip(f"no {trigger} to make the file system fail")
        folder = stage(mnt / "jobs")
        manifest = write_manifest([py_job(f"j{i}", "sleep_then_write", s=0.05)
                                   for i in range(100)], folder=folder)
        queue = mnt / "q"
        runner = Runner(manifest, *cli_args(queue, tmp_path / "out", "--workers", "2",
                                             "--json"))
        try:
            view = QueueView(queue)
            wait_until(lambda: len(view.ids("done")) >= 10, what="10 jobs to complete")

            # When the file system fails and goes read-only
            trigger.write_text("test\n")
            code = runner.wait(60)
            said = runner.stderr()
        finally:
            runner.close()

    # Then the run ends with 74, its summary the last line (review EX: a `completed` event
    # was, and the error named a file the shutdown failed to remove), saying why and what
    # becomes of the jobs in flight (nothing could be recorded)
    assert code == ExitCode.IO_ERROR, runner.lines
    last = json.loads(runner.lines[-1])
    assert last["event"] == "summary" and last["exit_code"] == 74, runner.lines[-3:]
    assert "; stopped (the queue's own file system)" in said, said
    assert "Read-only file system" in said or "Input/output error" in said, said  # (syncfs)
    assert "Traceback" not in said


def test_a_submit_onto_a_full_disk_enqueues_nothing_and_keeps_what_was_accepted(
        small_disk: Path, write_manifest) -> None:
    queue, out = small_disk / "q", small_disk / "out"
    before = write_manifest([py_job(f"a{i}", "write_one_byte") for i in range(100)],
                            name="a.toml")
    assert run_cli("submit", before, *cli_args(queue, out)).returncode == 0
    fd = fill(small_disk / "ballast")
    os.close(fd)

    more = write_manifest([py_job(f"b{i}", "write_one_byte") for i in range(100)],
                          name="b.toml")
    r = run_cli("submit", more, *cli_args(queue, out))

    assert r.returncode == ExitCode.IO_ERROR, (r.stdout, r.stderr)
    assert "No space left on device" in r.stderr and f"({small_disk}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    view = QueueView(queue)
    assert view.all_ids() == {f"a{i}" for i in range(100)}
    assert view.tmp_entries() == []


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KB tmpfs: room for a 40-job batch's journal entry, not for its 40 job files."""
    with mounted_tmpfs(tmp_path / "tiny", "size=64k") as mnt:
        yield mnt


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mnt`` (made) with ``options``; skips the test without root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    with mounted(mnt, "-t", "tmpfs", "-o", options, "tmpfs"):
        yield mnt


def test_a_batch_cut_by_a_full_disk_after_its_commit_is_reported_accepted_and_placed_by_a_retry(
        tiny_tmpfs: Path, tmp_path: Path) -> None:
    # Given a web tier's Queue on a disk with room for a batch's journal entry (the commit
    # point) but not for its job files
    q = Queue(tiny_tmpfs / "q")
    jobs = [{"id": f"j{i}", "kind": "python", "callable": "m:f", "output": f"o/j{i}.pdf"}
            for i in range(40)]
    ids = {j["id"] for j in jobs}

    # When it submits the batch
    with pytest.raises(QueueIOError) as caught:
        q.submit(jobs, base=tmp_path, out_root=tmp_path / "out")

    # Then the error says, on one line, that the jobs were accepted, and names them and the
    # disk's error: the caller must not think them refused
    err = caught.value
    assert isinstance(err, SubmitIncomplete), repr(err)
    assert set(err.accepted) == ids and set(err.unplaced) == ids, err
    assert "accepted" in str(err) and "No space left on device" in str(err), err
    assert "\n" not in str(err)
    # and it did not leave its temporaries holding the space
    assert os.listdir(tiny_tmpfs / "q" / "tmp") == []

    # When space is freed and the web tier retries the same submit with the same object
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_tmpfs)], check=True)
    res = q.submit(jobs, base=tmp_path, out_root=tmp_path / "out")

    # Then every job is pending once, reported as already accepted (not accepted twice),
    # and no journal entry is left to be replayed
    assert (res.accepted, set(res.already)) == ((), ids)
    assert set(q.list_ids(State.PENDING)) == ids
    assert [n for n in os.listdir(tiny_tmpfs / "q" / "journal") if n.endswith(".txn")] == []
    seqs = {q.get(jid).record.seq for jid in ids}
    assert len({s.split(".")[0] for s in seqs}) == 1, "the jobs come from two submits"
    q.close()


def test_submit_json_names_the_jobs_a_batch_cut_after_its_commit_accepted(
        tiny_tmpfs: Path, write_manifest) -> None:
    import json

    # Given a disk with room for a batch's journal entry but not for its 40 job files
    queue = tiny_tmpfs / "q"
    manifest = write_manifest([py_job(f"j{i}", "write_one_byte") for i in range(40)])

    # When a script submits it with --json
    r = run_cli("submit", manifest, *cli_args(queue, tiny_tmpfs / "out"), "--json")

    # Then it exits 74 and stdout says which jobs were accepted after all (a script that
    # read "nothing" there would submit them again, or give them up)
    assert r.returncode == ExitCode.IO_ERROR, (r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    ids = [f"j{i}" for i in range(40)]
    assert (doc["error"], sorted(doc["accepted"]), sorted(doc["unplaced"])) == (
        "incomplete", sorted(ids), sorted(ids)), doc
    assert "No space left on device" in doc["message"] and "Traceback" not in r.stderr


def test_a_worker_that_cannot_write_its_started_log_says_so_once_and_runs_nothing(
        tmp_path: Path) -> None:
    # Given a worker whose started log is /dev/full (every write: ENOSPC)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    marker = tmp_path / "ran"
    config = WorkerConfig(slot_path="", started_log="/dev/full", work_root=str(tmp_path))
    proc = ctx.Process(target=worker_main, args=(child, config))
    proc.start()
    child.close()
    try:
        assert isinstance(parent.recv(), Ready)

        # When it is given a job
        stage(tmp_path / "jobs")
        spec = {"id": "a", "kind": "python", "callable": "jobfns:write_one_byte",
                "pythonpath": str(tmp_path / "jobs"), "inputs": [], "params": {}}
        parent.send((RunJob("a", 1, "t-1", spec, str(marker), "file", 1 << 30), Stop()))

        # Then it reports why it cannot go on, naming the file, and exits 74 without
        # starting the job
        msg = parent.recv()
        assert isinstance(msg, Broken), msg
        assert msg.error == "I/O error (/dev/full): No space left on device"
        proc.join(timeout=10)
        assert proc.exitcode == ExitCode.IO_ERROR
        assert not marker.exists()
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


@contextlib.contextmanager
def _made_unwritable(out: Path, how: str) -> Iterator[Callable[[], None]]:
    """``out`` unwritable even to root, by ``chattr +i`` (EPERM) or as a read-only mount
    (EROFS, where even unlinking a missing file fails); yields what makes it writable."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    if how == "chattr +i":
        if shutil.which("chattr") is None:
            pytest.skip("needs chattr")
        out.mkdir()
        subprocess.run(["chattr", "+i", str(out)], check=True)
        undo = ["chattr", "-i", str(out)]
    else:
        out.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        subprocess.run(["mount", "-o", "remount,ro", str(out)], check=True)
        undo = ["mount", "-o", "remount,rw", str(out)]
    done = False

    def writable() -> None:
        nonlocal done
        if not done:
            subprocess.run(undo, check=True)
            done = True

    try:
        yield writable
    finally:
        writable()
        if how != "chattr +i":
            subprocess.run(["umount", str(out)], check=True)


@pytest.mark.parametrize(("how", "output"), [
    ("chattr +i", "x.pdf"), ("chattr +i", "sub/x.pdf"), ("read-only mount", "x.pdf")],
    ids=["job cannot write its output", "output folder cannot be made", "read-only mount"])
def test_an_unwritable_output_folder_stops_the_run_with_74_charging_nothing(
        tmp_path: Path, write_manifest: Any, how: str, output: str) -> None:
    # Given two jobs of one attempt each, and an output root nobody can write to
    stage(tmp_path)
    manifest = write_manifest([py_job("x", "write_pdf", output=output),
                               py_job("y", "write_pdf")], defaults={"max_attempts": 1})
    queue, out = tmp_path / "q", tmp_path / "out"
    with _made_unwritable(out, how) as make_writable:
        # When they run
        res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

        # Then the run halts (saying so) and exits 74 with the reason, and no job was
        # charged or dead-lettered
        assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
        assert f"cannot write outputs: {out}" in res.stderr, res.stderr
        assert any(ln.startswith("halted ") for ln in res.stdout.splitlines()), res.stdout
        assert res.stdout.splitlines()[-1].startswith("summary:"), res.stdout
        assert "Traceback" not in res.stdout + res.stderr
        view = QueueView(queue)
        assert view.states_of({"x", "y"}) == {"x": ["pending"], "y": ["pending"]}
        for jid in ("x", "y"):
            outcomes = [a["outcome"] for a in view.record("pending", jid)["attempts"]]
            assert set(outcomes) <= {"released"}, (jid, outcomes)

        # When the folder is fixed and the queue run again
        make_writable()
        second = run_cli("run", *cli_args(queue, out, "--workers", "1"))

        # Then both complete, once
        assert second.returncode == ExitCode.OK, second.stdout + second.stderr
        assert_pdf(out / output, "x")
        assert_pdf(out / "y.pdf", "y")
        assert stray_temporaries(out) == []


def test_a_batch_left_unplaced_keeps_the_queue_readable_and_run_says_why_until_there_is_room(
        tiny_tmpfs: Path, tmp_path: Path, write_manifest) -> None:
    # Given a queue holding a committed batch of 40 jobs its full disk could not place
    stage(tmp_path)
    manifest = write_manifest([py_job(f"j{i}", "write_one_byte", output=f"j{i}.bin")
                               for i in range(40)])
    queue, out = tiny_tmpfs / "q", tmp_path / "out"
    cut = run_cli("submit", manifest, *cli_args(queue, out))
    assert cut.returncode == ExitCode.IO_ERROR and "accepted" in cut.stderr, cut.stderr

    # When a script asks for the queue's status
    status = run_cli("status", "--json", "--queue", queue)

    # Then it gets it (the batch is no reason to hide the queue), and stderr says why those
    # jobs are not in pending/ yet
    assert status.returncode == ExitCode.OK, status.stdout + status.stderr
    json.loads(status.stdout)
    assert "40 accepted job(s) of an earlier submit are not yet in pending/" in status.stderr
    assert "No space left on device" in status.stderr and "Traceback" not in status.stderr

    # When a script cancels everything, or asks for one of those jobs
    cancel_all = run_cli("cancel", "--all", "--queue", queue)
    show = run_cli("show", "j3", "--queue", queue)

    # Then neither answers as if the 40 did not exist ("nothing to cancel", "no such job"):
    # both refuse with 74 and the reason
    for r in (cancel_all, show):
        assert r.returncode == ExitCode.IO_ERROR, r.stdout + r.stderr
        assert "40 accepted job(s) of an earlier submit are not yet in pending/" in r.stderr

    # When the queue is run while the disk is still full
    stuck = run_cli("run", *cli_args(queue, out))

    # Then it refuses with 74 saying the same, rather than finish "all done" without them
    assert stuck.returncode == ExitCode.IO_ERROR, stuck.stdout + stuck.stderr
    assert "40 accepted job(s) of an earlier submit are not yet in pending/" in stuck.stderr
    assert "Traceback" not in stuck.stdout + stuck.stderr

    # When room is made and it is run again
    subprocess.run(["mount", "-o", "remount,size=4m", str(tiny_tmpfs)], check=True)
    done = run_cli("run", *cli_args(queue, out))

    # Then all 40 complete, once each
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    view = QueueView(queue)
    assert view.ids("done") == {f"j{i}" for i in range(40)}
    assert view.ids("pending") == view.ids("running") == set()
    assert sorted(p.name for p in out.iterdir()) == sorted(f"j{i}.bin" for i in range(40))


@pytest.fixture
def few_inodes(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs with 64 inodes (the queue's folders take ~15)."""
    with mounted_tmpfs(tmp_path / "few", "size=4m,nr_inodes=64") as mnt:
        yield mnt


def _queue_with_one_job(fs: Path, tmp_path: Path, write_manifest: Any) -> tuple[Path, Path]:
    """(queue, output root): a queue on ``fs`` holding job ``a`` pending."""
    stage(tmp_path)
    queue, out = fs / "q", tmp_path / "out"
    first = run_cli("submit", write_manifest([py_job("a", "write_one_byte", output="a.bin")]),
                    *cli_args(queue, out))
    assert first.returncode == ExitCode.OK, first.stderr
    return queue, out


def test_a_submit_of_more_jobs_than_the_file_system_has_inodes_is_refused_whole(
        few_inodes: Path, tmp_path: Path, write_manifest) -> None:
    # Given a queue on a file system with room for a few dozen more files
    queue, out = _queue_with_one_job(few_inodes, tmp_path, write_manifest)

    # When a batch of 100 jobs (a file each) is submitted
    big = write_manifest([py_job(f"j{i}", "write_one_byte", output=f"j{i}.bin")
                          for i in range(100)],
                         name="big.toml")
    r = run_cli("submit", big, *cli_args(queue, out))

    # Then it is refused before its commit point, saying why: nothing of it is accepted
    # (no batch left that could never be placed), and the queue works on
    assert r.returncode == ExitCode.IO_ERROR, r.stdout + r.stderr
    assert "free inode(s), and this needs 101" in r.stderr, r.stderr
    assert "nothing of this submit was enqueued" in r.stderr and "Traceback" not in r.stderr
    view = QueueView(queue)
    assert view.ids("pending") == {"a"}
    assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")] == []
    assert os.listdir(queue / "tmp") == []
    ran = run_cli("run", *cli_args(queue, out))
    assert ran.returncode == ExitCode.OK and view.ids("done") == {"a"}, ran.stderr


def test_a_batch_that_takes_the_last_inodes_is_placed_and_its_doorbell_rung(
        few_inodes: Path, tmp_path: Path, write_manifest) -> None:
    # Given a queue on a file system with room for exactly one more batch's job files (and
    # its journal entry), none for the runner's small doorbell after them
    queue, out = _queue_with_one_job(few_inodes, tmp_path, write_manifest)
    free = os.statvfs(queue).f_ffree
    jobs = [py_job(f"j{i}", "write_one_byte", output=f"j{i}.bin") for i in range(free - 1)]

    # When that batch is submitted
    r = run_cli("submit", write_manifest(jobs, name="fill.toml"), *cli_args(queue, out))

    # Then it is accepted and placed, its journal entry becoming the doorbell (as before the
    # doorbell was a file of its own): no entry is left to replay at every open, saying its
    # jobs are not in pending/ (review CJ)
    assert r.returncode == ExitCode.OK, r.stdout + r.stderr
    assert [n for n in os.listdir(queue / "journal") if n.endswith(".txn")] == []
    shown = run_cli("show", "j0", "--queue", queue)
    assert shown.returncode == ExitCode.OK and "not yet in pending" not in shown.stderr, \
        shown.stderr
    assert QueueView(queue).ids("pending") == {"a", *(f"j{i}" for i in range(free - 1))}


def test_a_job_that_fails_on_a_full_output_disk_and_removes_its_partial_file_is_not_charged(
        tmp_path: Path, write_manifest) -> None:
    # Given an output root on a 2 MB disk, and jobs copying a 3 MB file there with cp, which
    # removes its partial file when the disk refuses it (the room is back before we look)
    with mounted_tmpfs(tmp_path / "out", "size=2m") as out:
        big = tmp_path / "big.bin"
        big.write_bytes(os.urandom(3 << 20))
        script = f'cp {big} "$1" || {{ rm -f "$1"; exit 1; }}'
        jobs = [{"id": f"c{i}", "kind": "command", "output": f"c{i}.bin",
                 "argv": ["sh", "-c", script, "sh", "{output}"]} for i in range(3)]
        manifest = write_manifest(jobs, defaults={"max_attempts": 2})
        queue = tmp_path / "q"

        # When they run
        res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

        # Then the run halts with 74 blaming the disk, and no job is charged or dead
        assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
        assert f"cannot write outputs: {out}: No space left on device" in res.stderr, \
            res.stderr
        view = QueueView(queue)
        assert view.ids("dead") == set() and view.ids("pending") == {"c0", "c1", "c2"}
        for jid in ("c0", "c1", "c2"):
            outcomes = {a["outcome"] for a in view.record("pending", jid)["attempts"]}
            assert outcomes <= {"released"}, (jid, outcomes)
        assert os.listdir(out) == []


@pytest.mark.parametrize("mode", ["1777", "0755"], ids=["private-folder", "beside-output"])
def test_jobs_failing_together_on_a_full_output_disk_are_none_of_them_charged(
        tmp_path: Path, write_manifest: Any, mode: str) -> None:
    # Given an output root on a 6 MB disk and two one-attempt jobs, each holding 2 MB of its
    # output written, and the rest of the disk filled from outside (1777: others can write
    # there, so each job writes in a private folder the worker empties when it fails; 0755:
    # at its temporary name, which the runner removes)
    stage(tmp_path)
    with mounted_tmpfs(tmp_path / "out", f"size=6m,mode={mode}") as out:
        go = tmp_path / "go"
        marks = {j: tmp_path / f"{j}.written" for j in ("a", "b")}
        manifest = write_manifest(
            [py_job(j, "grow_output_after_go", f"{j}.bin", mb=2, marker=str(marks[j]),
                    go=str(go), pidfile=str(tmp_path / f"{j}.pid")) for j in marks],
            defaults={"max_attempts": 1})
        queue = tmp_path / "q"
        runner = Runner(manifest, *cli_args(queue, out, "--workers", "2"))
        try:
            wait_until(lambda: all(m.exists() for m in marks.values()),
                       what="both jobs to have written their first 2 MB")
            filler = fill(out / "filler")
            # When both go on writing, and fail ("No space left on device", no file named)
            go.touch()
            code = runner.wait()
            said = f"{runner.lines} {runner.stderr()}"
            os.close(filler)
        finally:
            go.touch()
            runner.close()
        # Then the run halts (74) and neither job is charged: both pending, released
        # (before: the first one judged was released, its partial output removed, and
        # the room that freed made the other's failure look like its own: dead)
        assert code == ExitCode.IO_ERROR, said
        view = QueueView(queue)
        assert view.ids("dead") == set() and view.ids("pending") == {"a", "b"}, said
        for jid in marks:
            assert [a["outcome"] for a in view.record("pending", jid)["attempts"]] \
                == ["released"], (jid, view.record("pending", jid)["attempts"])


@pytest.mark.parametrize("mode", ["1777", "0755"], ids=["private-folder", "beside-output"])
def test_an_output_that_can_never_fit_ends_dead_not_released_at_every_run(
        tmp_path: Path, write_manifest: Any, mode: str) -> None:
    # Given an output root on a 4 MB disk, and a job whose output fills any disk
    stage(tmp_path)
    with mounted_tmpfs(tmp_path / "out", f"size=4m,mode={mode}") as out:
        manifest = write_manifest([py_job("hog", "write_until_full", "hog.bin")],
                                  defaults={"max_attempts": 2})
        queue = tmp_path / "q"
        # When it is run, and run again after the run halts on it
        first = run_cli("run", manifest, *cli_args(queue, out, "--backoff-base", "0.01"))
        second = run_cli("run", *cli_args(queue, out, "--backoff-base", "0.01"))
    # Then the disk is blamed once (released, 74), and after that the job is charged like
    # any failure: dead after its two attempts (before: released at every run, for ever,
    # with the full disk judged while its own partial output filled it: review BW)
    assert first.returncode == ExitCode.IO_ERROR, first.stdout + first.stderr
    assert second.returncode == ExitCode.JOBS_FAILED, second.stdout + second.stderr
    outcomes = [a["outcome"] for a in QueueView(queue).record("dead", "hog")["attempts"]]
    assert outcomes == ["released", "failed", "failed"], outcomes


def test_a_job_that_always_fails_naming_its_output_and_a_full_disk_still_ends_dead(
        tmp_path: Path, write_manifest) -> None:
    # Given a job that fails every time saying "No space left on device" about a scratch
    # file named after its output (a full /tmp, not the output's disk, which has room)
    script = 'echo "scratch for $1: /tmp/scratch: No space left on device" >&2; exit 1'
    manifest = write_manifest([{"id": "s", "kind": "command", "output": "s.pdf",
                                "argv": ["sh", "-c", script, "sh", "{output}"]}],
                              defaults={"max_attempts": 2})
    queue, out = tmp_path / "q", tmp_path / "out"

    # When it is run, and run again after the run halts on it
    first = run_cli("run", manifest, *cli_args(queue, out, "--backoff-base", "0.01"))
    second = run_cli("run", *cli_args(queue, out, "--backoff-base", "0.01"))

    # Then the first run takes it for the output disk's fault once (released, halted, 74),
    # and after that it is charged like any failure: dead after its two attempts, not
    # released at every run for ever
    assert first.returncode == ExitCode.IO_ERROR, first.stdout + first.stderr
    assert second.returncode == ExitCode.JOBS_FAILED, second.stdout + second.stderr
    view = QueueView(queue)
    outcomes = [a["outcome"] for a in view.record("dead", "s")["attempts"]]
    assert outcomes == ["released", "failed", "failed"], outcomes


def test_a_job_that_fills_tmpdir_halts_the_run_naming_it_and_charges_no_one_else(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a following run whose TMPDIR (the jobs' working folders, and the runner's work
    # root) is a small file system, one job per worker (a successor is started as a job is
    # handed out), and a job that fills it and holds
    stage(tmp_path)
    with mounted_tmpfs(tmp_path / "tmpdir", "size=4m") as tmpdir:
        filled, go = tmp_path / "filled", tmp_path / "go"
        manifest = write_manifest([
            {**py_job("filler", "fill_workdir_then_hold", marker=str(filled),
                      pidfile=str(tmp_path / "filler.pid"), go=str(go)), "max_attempts": 2}])
        queue, out = tmp_path / "q", tmp_path / "out"
        runner = Runner(manifest, *cli_args(queue, out, "--workers", "2", "--follow",
                                            "--max-jobs-per-worker", "1"),
                        env={"TMPDIR": str(tmpdir)})
        try:
            wait_until(filled.exists, what="the file system to be full")
            # When a job is handed out, and its worker's successor must be started there
            # (submitted now: nothing that ends frees room meanwhile)
            res = run_cli("submit", write_manifest([py_job("next", "write_pdf")]),
                          *cli_args(queue, out))
            assert res.returncode == 0, res.stderr
            line = runner.until(lambda ln: ln.startswith("halted "))
            go.touch()
            code = runner.wait()
        finally:
            go.touch()
            runner.close()
    # Then the run halts naming the file it could not make and why, and exits 74 once the
    # running jobs finished (an exception out of its loop said "I/O error: No space left on
    # device" and killed them, each charged `crashed` later)
    assert code == ExitCode.IO_ERROR, runner.lines
    assert f"cannot start a worker: I/O error ({tmpdir}/" in line, line
    assert "No space left on device" in line, line
    view = QueueView(queue)
    for state, jid in [(s, j) for s in ("pending", "done") for j in view.ids(s)]:
        outcomes = [a["outcome"] for a in view.record(state, jid).get("attempts", [])]
        assert "crashed" not in outcomes, (jid, outcomes)
    assert [a["outcome"] for a in view.record("pending", "filler")["attempts"]] == ["failed"]
