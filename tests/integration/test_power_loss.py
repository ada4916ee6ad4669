"""A power cut, staged for real: what renderctl said was done is on the disk afterwards.

A SIGKILL (test_run_crash.py) loses only what a process held; the kernel still writes back
everything it was given. A power cut also loses what the kernel held and had not written:
file data never fsynced, a rename whose folder was never synced. To stage one, the queue
and the outputs live on an ext4 file system of their own (an image file, loop-mounted);
the cut is ext4's shutdown ioctl without a log flush (what xfstests' "godown" does: from
that instant nothing more reaches the device), and the disk as it is at that instant is a
copy of the image. The copy is mounted where the original was (records name outputs by
absolute path) and a new runner works on it, as after a reboot.

What must hold afterwards (the promise, and what was reported before the cut):
- every job whose submit had returned is in the queue, and a plain `run` settles each in
  exactly one terminal folder, its output published once and complete (pypdf reads it);
- every `completed` a runner printed before the cut is on the disk as printed: the done
  record, and the output with the recorded sha256;
- nothing is quarantined as corrupt (no record is ever torn), and no temporary is left.

Like the machine this is measured on, the file system has no journal (each folder's block
reaches the disk on its own, in no fixed order); one test also runs with a journal.
Needs root and loop devices (skipped where the mount is refused).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import struct
import subprocess
from collections.abc import Iterator
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
    sha256_of,
    stage,
    stopped,
    stray_temporaries,
    wait_until,
    waiting_for_a_lock,
)

from renderctl.runner import CRASH_POINTS
from renderctl.store import Queue

# linux/ext4.h: EXT4_IOC_SHUTDOWN = _IOR('X', 125, __u32); the flag that drops what the
# log (and the page cache) holds instead of writing it: a power cut.
EXT4_IOC_SHUTDOWN = 0x8004587D
EXT4_GOING_FLAGS_NOLOGFLUSH = 2
FAST = ("--workers", "2", "--backoff-base", "0.01")


class Disk:
    """An ext4 file system on an image file, mounted at ``mnt``, whose power can be cut."""

    def __init__(self, tmp_path: Path, *, journal: bool, name: str = "disk") -> None:
        self.dir = tmp_path / name
        self.dir.mkdir()
        self.mnt = tmp_path / f"{name}-mnt"
        self.mnt.mkdir()
        self.image = self.dir / "0.img"
        self.cuts = 0
        self.fsck: list[int] = []  # e2fsck's exit status at each reboot
        with open(self.image, "wb") as f:
            f.truncate(96 << 20)
        features = "has_journal" if journal else "^has_journal"
        mkfs = subprocess.run(["mkfs.ext4", "-q", "-F", "-O", features, str(self.image)],
                              capture_output=True, text=True)
        if mkfs.returncode != 0:
            pytest.skip(f"cannot make an ext4 image here: {mkfs.stderr.strip()}")
        self._mount()

    def _mount(self) -> None:
        res = subprocess.run(["mount", "-o", "loop", str(self.image), str(self.mnt)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot loop-mount a file system here: {res.stderr.strip()}")

    def cut(self) -> None:
        """Cut the power: nothing more reaches the disk; keep what it holds now."""
        self.shut_down()
        self.keep()

    def shut_down(self) -> None:
        fd = os.open(self.mnt, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)

    def is_down(self) -> bool:
        """Whether the power is cut already (a shut-down ext4 fails every fsync; listing a
        folder may still answer from the cache)."""
        fd = os.open(self.mnt, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def keep(self) -> None:
        self.cuts += 1
        kept = self.dir / f"{self.cuts}.img"
        # The device as it is now (the loop device has written what it was given into the
        # image's page cache; reading the file sees it). Taken before any unmount: an
        # unmount writes the block device's dirty buffers (a folder block never synced)
        # even after the shutdown, and would hand the test a kinder disk than a power cut.
        subprocess.run(["cp", "--sparse=always", str(self.image), str(kept)], check=True)
        self.image = kept

    def reboot(self) -> None:
        """Check the disk as the cut left it and mount it where the old one was (its
        processes, if any are left, keep the old one: lazily unmounted)."""
        subprocess.run(["umount", "-l", str(self.mnt)], check=True)
        # As a boot does for a file system not cleanly unmounted (without a journal, the
        # cut can leave its own metadata inconsistent: a block bitmap, a checksum): fsck's
        # preen, and, when preen asks for a person, what that person runs.
        fsck = subprocess.run(["e2fsck", "-f", "-p", str(self.image)], capture_output=True,
                              text=True)
        self.fsck.append(fsck.returncode)
        if fsck.returncode >= 4:
            fsck = subprocess.run(["e2fsck", "-f", "-y", str(self.image)],
                                  capture_output=True, text=True)
            self.fsck.append(fsck.returncode)
        if os.environ.get("RCTL_TEST_FSCK_LOG"):
            with open(os.environ["RCTL_TEST_FSCK_LOG"], "a") as log:
                log.write(f"{self.fsck} {fsck.stdout}\n")
        assert fsck.returncode < 4, fsck.stdout + fsck.stderr
        self._mount()

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)


@pytest.fixture
def disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Disk]:
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to stage a power cut")
    d = Disk(tmp_path, journal=getattr(request, "param", False))
    try:
        yield d
    finally:
        d.close()


def printed(runner: Runner) -> list[dict[str, Any]]:
    """Everything ``runner`` (stopped or dead) has printed, as JSON objects."""
    with contextlib.suppress(OSError, ValueError):
        runner.read_available()
    return [json.loads(line) for line in runner.lines if line.startswith("{")]


def freeze_cut_kill(runner: Runner, *disks: Disk, stops_itself: bool = False
                    ) -> list[dict[str, Any]]:
    """The runner stopped (where it is, unless it ``stops_itself`` at a point), the power
    of ``disks`` cut (of all of them before any is kept: one machine), the runner killed;
    returns what it had printed (all of it said before the cut)."""
    if not stops_itself:
        os.kill(runner.pid, signal.SIGSTOP)
    wait_until(lambda: runner.proc.poll() is not None or stopped(runner.pid),
               what="the runner to stop")
    assert runner.proc.poll() is None, f"the runner ended ({runner.proc.returncode})"
    said = printed(runner)
    for d in disks:
        d.shut_down()
    for d in disks:
        d.keep()
    runner.kill()
    runner.close()
    return said


@contextlib.contextmanager
def stopped_at(point: str, *args: str | os.PathLike[str]) -> Iterator[None]:
    """``renderctl ARGS`` started and stopped at ``point`` (RENDERCTL_STOP_AT) for the
    block (a cut, say), killed after it."""
    proc = subprocess.Popen([*RENDERCTL, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env={**os.environ, "RENDERCTL_STOP_AT": point, "NO_COLOR": "1"})
    try:
        wait_until(lambda: stopped(proc.pid), what=f"renderctl {args[0]} to stop at {point}")
        yield
    finally:
        proc.kill()
        proc.communicate()


def until_completed(runner: Runner, n: int) -> None:
    """Read the runner's output until it has reported ``n`` completions."""
    seen = 0

    def count(line: str) -> bool:
        nonlocal seen
        seen += '"completed"' in line
        return seen >= n

    runner.until(count, timeout_s=60)


def assert_reported_on_disk(said: list[dict[str, Any]], qv: QueueView) -> set[str]:
    """Each `completed` printed before the cut is on the disk: its done record, and its
    output with the recorded hash (a complete PDF). Returns those jobs."""
    completed = {e["job"]: e for e in said if e.get("event") == "completed"}
    for jid, ev in completed.items():
        # (Its running copy may be back beside it: removed after the done record was
        # durable, and that removal not synced yet. The next runner settles the two.)
        assert "done" in qv.states_of([jid])[jid], f"{jid} was reported completed"
        rec = qv.record("done", jid)
        final = Path(ev["output"])
        assert rec["result"]["sha256"] == sha256_of(final), f"{jid}: output not as recorded"
        assert_pdf(final, jid)
    return set(completed)


def assert_settled_once(qv: QueueView, out: Path, outputs: dict[str, Path],
                        hashes: dict[str, str], *, damaged: str = "") -> None:
    """Every job done in exactly one folder, its output complete and as recorded, once;
    ``hashes``: outputs reported before a cut, which must not have changed since;
    ``damaged``: the name (in its folder) of a file the test damaged, which may be in
    corrupt/ (whether it is depends on what reached the disk of it)."""
    where = qv.states_of(outputs)
    assert {j: s for j, s in where.items() if s != ["done"]} == {}, "not all done, once"
    for jid, final in outputs.items():
        assert_pdf(final, jid)
        rec = qv.record("done", jid)
        assert rec["result"]["sha256"] == sha256_of(final)
        assert [a["outcome"] for a in rec["attempts"]].count("completed") == 1
        if jid in hashes:
            assert hashes[jid] == rec["result"]["sha256"], f"{jid} published again"
    torn = [n for n in os.listdir(qv.path / "corrupt")
            if not (damaged and n.startswith(damaged + "."))]
    assert torn == [], "a record was torn"
    assert stray_temporaries(out) == []
    assert qv.tmp_entries() == []


def pdf_jobs(folder: Path, n: int) -> tuple[Path, dict[str, Path], Path]:
    """A manifest of ``n`` one-page PDF jobs written in ``folder`` (off the disk)."""
    stage(folder)
    jobs = [{**py_job(f"j{i:03d}", "write_pdf", f"o/{i:03d}.pdf"), "max_attempts": 10}
            for i in range(n)]
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    return manifest, {j["id"]: Path(j["output"]) for j in jobs}, folder


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_power_cut_at_each_crash_point_keeps_what_was_reported(
        tmp_path: Path, disk: Disk, point: str) -> None:
    # Given twelve PDF jobs (and, to reach the `dead` point, one with a bad input, first)
    folder = stage(tmp_path / "m")
    jobs = [py_job(f"job-{n:02d}", "write_pdf", f"pdfs/job-{n:02d}.pdf") for n in range(12)]
    if point == "dead":
        jobs.insert(0, {**py_job("bad", "invalid", "pdfs/bad.pdf"), "priority": 5})
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    qv = QueueView(queue)

    # When the power is cut while the runner is at the point
    runner = Runner(manifest, *cli_args(queue, out, *FAST, "--json"),
                    env={"RENDERCTL_STOP_AT": point})
    said = freeze_cut_kill(runner, disk, stops_itself=True)
    assert any(e.get("event") == "runner_started" for e in said), said

    # Then after the reboot, what the runner reported is on the disk
    disk.reboot()
    reported = assert_reported_on_disk(said, qv)
    hashes = {j: qv.record("done", j)["result"]["sha256"] for j in reported}

    # And a runner settles every job (all were accepted before the runner started)
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode in (0, 1), again.stdout + again.stderr
    assert "Traceback" not in again.stderr, again.stderr
    dead = {"bad"} if point == "dead" else set()
    assert QueueView(queue).states_of(dead) == {j: ["dead"] for j in dead}
    assert_settled_once(qv, out, {j["id"]: out / j["output"] for j in jobs
                                  if j["id"] not in dead}, hashes)


@pytest.mark.parametrize("disk", [False, True], ids=["no-journal", "journal"],
                         indirect=True)
def test_power_cut_at_random_moments_loses_nothing_reported(tmp_path: Path,
                                                            disk: Disk) -> None:
    # Given 60 PDF jobs and 6 that always fail (two attempts, then dead/) submitted (the
    # submit returned: they are accepted)
    manifest, outputs, folder = pdf_jobs(tmp_path / "m", 60)
    failing = [{**py_job(f"bad{i}", "fail", f"o/bad{i}.pdf"), "max_attempts": 2}
               for i in range(6)]
    doc = json.loads(manifest.read_text())
    # (one every ten, so that each stretch between cuts meets some)
    doc["jobs"] = [j for i, pdf in enumerate(doc["jobs"])
                   for j in ([failing[i // 10], pdf] if i % 10 == 0 else [pdf])]
    manifest.write_text(json.dumps(doc))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    qv = QueueView(queue)
    sub = run_cli("submit", manifest, *cli_args(queue, out))
    assert sub.returncode == 0, sub.stdout + sub.stderr
    rng = random.Random(20_261_204)
    hashes: dict[str, str] = {}
    dead: set[str] = set()

    # When the power is cut three times at seeded moments of a run (counted in jobs
    # reported completed, so that each cut lands mid-run however fast the machine is),
    # each time after a reboot a new runner goes on
    for cut in range(3):
        need = rng.randint(3, 12)
        left = sum(1 for j in outputs if "done" not in qv.states_of([j])[j])
        if cut and left < need + 6:
            # A loaded machine's runner ran far ahead of the reading of its lines before
            # an earlier cut (jobs of milliseconds): no moment mid-run is left to cut at
            # (CI once had 3 to complete where the next cut waited for more).
            break
        runner = Runner(*cli_args(queue, out, *FAST, "--json"))
        until_completed(runner, need)
        said = freeze_cut_kill(runner, disk)
        disk.reboot()

        # Then every completion reported before the cut is on the disk, unchanged, and
        # every job reported dead-lettered is in dead/
        reported = assert_reported_on_disk(said, qv)
        dead |= {e["job"] for e in said if e.get("event") == "dead"}
        assert all("dead" in qv.states_of([j])[j] for j in dead), qv.states_of(dead)
        for jid in reported:
            sha = qv.record("done", jid)["result"]["sha256"]
            assert hashes.setdefault(jid, sha) == sha
        for jid, sha in hashes.items():
            assert qv.record("done", jid)["result"]["sha256"] == sha, f"{jid} changed"

    # And a last runner settles every job once, the failing ones dead-lettered (exit 1 if
    # it dead-lettered some itself, 0 if the runners before it had)
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode in (0, 1), again.stdout + again.stderr
    bad = {j["id"] for j in failing}
    assert qv.states_of(bad) == {j: ["dead"] for j in bad}
    assert_settled_once(qv, out, {j: out / p for j, p in outputs.items() if j not in bad},
                        hashes)
    # And the tools that read the event log a cut may have left torn still read it
    for cmd in (["status"], ["metrics"], ["dead", "list"]):
        res = run_cli(*cmd, "--queue", queue)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stdout + res.stderr


def test_power_cut_right_after_submit_returns_keeps_every_job(tmp_path: Path,
                                                               disk: Disk) -> None:
    # Given a submit of 300 jobs that returned (exit 0: accepted)
    manifest, outputs, _ = pdf_jobs(tmp_path / "m", 300)
    queue, out = disk.mnt / "q", disk.mnt / "out"
    sub = run_cli("submit", manifest, *cli_args(queue, out))
    assert sub.returncode == 0, sub.stdout + sub.stderr

    # When the power is cut at once, and the machine comes back
    disk.cut()
    disk.reboot()

    # Then every job is in the queue, and a run settles them all
    st = run_cli("status", "--json", "--queue", queue)
    assert st.returncode == 0, st.stdout + st.stderr
    assert json.loads(st.stdout)["pending"] == len(outputs), st.stdout
    again = run_cli("run", *cli_args(queue, out, *FAST), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_settled_once(QueueView(queue), out, {j: out / p for j, p in outputs.items()}, {})


@pytest.mark.parametrize(("point", "n"), [
    ("submit:checked", 40), ("submit:staged", 40), ("submit:placed", 40),
    ("submit:before_doorbell", 1),  # (one job is placed without the journal)
])
def test_power_cut_during_a_submit_keeps_all_of_it_or_none(tmp_path: Path, disk: Disk,
                                                          point: str, n: int) -> None:
    # Given a submit stopped at a point of its commit
    manifest, outputs, _ = pdf_jobs(tmp_path / "m", n)
    queue, out = disk.mnt / "q", disk.mnt / "out"
    # (the queue made and on the disk before: the cut is of this submit, not of the
    # queue's creation)
    Queue(queue, create=True).close()
    os.sync()
    with stopped_at(point, "submit", manifest, *cli_args(queue, out)):
        # When the power is cut there, and the machine comes back
        disk.cut()
    disk.reboot()

    # Then the queue holds all of the submit or none of it, and a run settles what it holds
    again = run_cli("run", *cli_args(queue, out, *FAST), timeout=60)
    assert again.returncode == 0, again.stdout + again.stderr
    qv = QueueView(queue)
    held = qv.all_ids()
    assert held in (set(), set(outputs)), f"{len(held)} of {len(outputs)} jobs kept"
    assert_settled_once(qv, out, {j: out / outputs[j] for j in held}, {})


def test_power_cut_after_cancel_returns_keeps_the_jobs_cancelled(tmp_path: Path,
                                                                disk: Disk) -> None:
    # Given 20 jobs accepted, half of them cancelled one by one and the other half at once
    # by group (each cancel returned: done, as far as its caller knows)
    manifest, outputs, folder = pdf_jobs(tmp_path / "m", 20)
    doc = json.loads(manifest.read_text())
    for job in doc["jobs"][15:]:
        job["group"] = "late"
    manifest.write_text(json.dumps(doc))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    doomed = sorted(outputs)[10:]
    for jid in doomed[:5]:
        res = run_cli("cancel", jid, "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
    res = run_cli("cancel", "--group", "late", "--queue", queue)
    assert res.returncode == 0, res.stdout + res.stderr

    # When the power is cut at once, the machine comes back and a runner runs the queue
    disk.cut()
    disk.reboot()
    again = run_cli("run", *cli_args(queue, out, *FAST))

    # Then the cancelled jobs stayed cancelled (none ran), and the others are done
    assert again.returncode == 0, again.stdout + again.stderr
    qv = QueueView(queue)
    assert qv.states_of(doomed) == {j: ["cancelled"] for j in doomed}
    assert not any((out / outputs[j]).exists() for j in doomed)
    assert_settled_once(qv, out, {j: out / p for j, p in outputs.items()
                                  if j not in doomed}, {})


def test_power_cut_after_dead_retry_returns_keeps_the_jobs_revived(tmp_path: Path,
                                                                  disk: Disk) -> None:
    # Given five jobs dead-lettered, then `dead retry --all` returned
    folder = stage(tmp_path / "m")
    jobs = [{**py_job(f"f{i}", "fail_until_marker", f"o/f{i}.pdf",
                      marker=str(folder / "fixed")), "max_attempts": 1} for i in range(5)]
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": jobs}))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    first = run_cli("run", manifest, *cli_args(queue, out, *FAST))
    assert first.returncode == 1, first.stdout + first.stderr
    assert QueueView(queue).ids("dead") == {j["id"] for j in jobs}
    res = run_cli("dead", "retry", "--all", "--queue", queue)
    assert res.returncode == 0, res.stdout + res.stderr

    # When the power is cut at once, the machine comes back, the fault is fixed and a
    # runner runs the queue
    disk.cut()
    disk.reboot()
    (folder / "fixed").touch()
    again = run_cli("run", *cli_args(queue, out, *FAST))

    # Then every retried job ran again and is done (none fell back to dead/)
    assert again.returncode == 0, again.stdout + again.stderr
    assert_settled_once(QueueView(queue), out,
                        {j["id"]: out / j["output"] for j in jobs}, {})


def test_power_cut_after_wait_returns_keeps_every_job_it_waited_for(tmp_path: Path,
                                                                   disk: Disk) -> None:
    # Given a runner working through 30 jobs, and a `wait` for all of them that returned 0
    manifest, outputs, _ = pdf_jobs(tmp_path / "m", 30)
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    runner = Runner(*cli_args(queue, out, *FAST, "--json", "--follow"))
    waited = run_cli("wait", *outputs, "--queue", queue, "--timeout", "60", timeout=90)
    assert waited.returncode == 0, waited.stdout + waited.stderr

    # When the power is cut at once (the runner frozen first), and the machine comes back
    freeze_cut_kill(runner, disk)
    disk.reboot()

    # Then every job `wait` saw done is done on the disk, output and all
    qv = QueueView(queue)
    assert qv.ids("done") >= set(outputs)
    for jid, rel in outputs.items():
        assert qv.record("done", jid)["result"]["sha256"] == sha256_of(out / rel)
        assert_pdf(out / rel, jid)


def test_power_cut_with_outputs_on_another_disk_keeps_what_was_reported(
        tmp_path: Path, disk: Disk) -> None:
    # Given outputs on a file system of their own (the queue's disk is another), and a
    # runner working through 40 jobs
    other = Disk(tmp_path, journal=False, name="outputs")
    try:
        manifest, outputs, _ = pdf_jobs(tmp_path / "m", 40)
        queue, out = disk.mnt / "q", other.mnt / "out"
        assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
        runner = Runner(*cli_args(queue, out, *FAST, "--json"))
        until_completed(runner, 8)

        # When the power of both is cut at once, and the machine comes back
        said = freeze_cut_kill(runner, disk, other)
        disk.reboot()
        other.reboot()

        # Then every completion reported is on both disks: record and output
        qv = QueueView(queue)
        reported = assert_reported_on_disk(said, qv)
        assert len(reported) >= 8
        hashes = {j: qv.record("done", j)["result"]["sha256"] for j in reported}

        # And a runner settles the rest
        again = run_cli("run", *cli_args(queue, out, *FAST))
        assert again.returncode == 0, again.stdout + again.stderr
        assert_settled_once(qv, out, {j: out / p for j, p in outputs.items()}, hashes)
    finally:
        other.close()


def test_a_job_that_brings_the_machine_down_every_time_ends_dead(
        tmp_path: Path, disk: Disk) -> None:
    # Given a job that brings the machine down a second into each run (a poison pill:
    # a kernel bug it triggers, the host's memory exhausted), beside one ordinary job.
    # (Within the first milliseconds, before the runner has synced its start, the start is
    # lost with the machine and not charged: README, "A job that takes the machine down".)
    after_s = 1.0
    folder = stage(tmp_path / "m")
    flag = tmp_path / "went-down"
    pill = {"id": "pill", "kind": "python", "callable": "jobfns:cut_power",
            "output": "pill.pdf", "max_attempts": 3, "priority": 5,
            "params": {"after_s": after_s, "mnt": str(disk.mnt), "flag": str(flag)}}
    manifest = folder / "jobs.json"
    manifest.write_text(json.dumps({"jobs": [pill, py_job("plain", "write_pdf")]}))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0

    # When the machine is brought back and the queue run after each time it goes down
    downs = 0
    for _ in range(6):
        runner = Runner(*cli_args(queue, out, *FAST, "--json"))

        def ran_or_ended(r: Runner = runner) -> bool:
            return flag.exists() or r.proc.poll() is not None

        wait_until(ran_or_ended, what="the pill to run, or the run to end", timeout_s=60)
        if not flag.exists():
            assert runner.wait() in (0, 1), runner.stderr()
            runner.close()
            break
        wait_until(disk.is_down, what="the pill to bring the machine down")
        downs += 1
        flag.unlink()
        disk.keep()
        runner.kill()
        runner.close()
        disk.reboot()

    # Then after max_attempts downs the pill is dead-lettered with each attempt recorded
    # (crashed), instead of taking the machine down at every boot; the other job is done
    qv = QueueView(queue)
    assert downs == 3, f"the machine went down {downs} times"
    assert qv.states_of(["pill", "plain"]) == {"pill": ["dead"], "plain": ["done"]}
    assert [a["outcome"] for a in qv.record("dead", "pill")["attempts"]] == ["crashed"] * 3


@pytest.mark.parametrize("then", ["submit", "submit-batch", "cancel", "quarantine"])
def test_power_cut_after_claims_and_a_command_that_syncs_pending_keeps_every_job(
        tmp_path: Path, disk: Disk, then: str) -> None:
    # Given 12 jobs submitted one per command (the journal-free path a web tier's requests
    # take), and a runner stopped right after its first claims, before it synced them
    folder = stage(tmp_path / "m")
    queue, out = disk.mnt / "q", disk.mnt / "out"
    ids = [f"req-{i:02d}" for i in range(12)]

    def submit(jid: str) -> None:
        manifest = folder / f"{jid}.json"
        manifest.write_text(json.dumps({"jobs": [py_job(jid, "write_pdf", f"o/{jid}.pdf")]}))
        res = run_cli("submit", manifest, *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr

    for jid in ids[:8]:
        submit(jid)
    runner = Runner(*cli_args(queue, out, *FAST, "--json", "--follow"),
                    env={"RENDERCTL_STOP_AT": "lease"})
    wait_until(lambda: stopped(runner.pid), what="the runner to stop after its claims")
    claimed = QueueView(queue).ids("running")
    assert claimed, "nothing claimed"

    # When another command changes pending/ and syncs it (more jobs submitted, or pending
    # ones cancelled), and the power is cut right after it returned
    cancelled: list[str] = []
    if then == "submit":
        for jid in ids[8:]:
            submit(jid)
    elif then == "submit-batch":  # (a few jobs: the journal, a fsync per record)
        manifest = folder / "batch.json"
        manifest.write_text(json.dumps({"jobs": [py_job(j, "write_pdf", f"o/{j}.pdf")
                                                 for j in ids[8:]]}))
        res = run_cli("submit", manifest, *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr
    elif then == "quarantine":
        # (a damaged record a reader finds and moves to corrupt/, syncing pending/)
        (queue / "pending" / "bad.json").write_text("{not json")
        res = run_cli("show", "bad", "--queue", queue)
        assert "corrupt" in res.stdout + res.stderr, res.stdout + res.stderr
        ids = ids[:8]
    else:
        cancelled = sorted(set(ids[:8]) - claimed)[:2]
        res = run_cli("cancel", *cancelled, "--queue", queue)
        assert res.returncode == 0, res.stdout + res.stderr
        ids = ids[:8]
    freeze_cut_kill(runner, disk, stops_itself=True)
    disk.reboot()

    # Then no job is lost (the claimed ones were in neither folder: the claim's removal
    # from pending/ went to the disk with that sync, its addition to running/ did not),
    # and a runner settles every one
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode in (0, 1), again.stdout + again.stderr
    qv = QueueView(queue)
    assert qv.states_of(cancelled) == {j: ["cancelled"] for j in cancelled}
    assert_settled_once(qv, out, {j: out / "o" / f"{j}.pdf" for j in ids
                                  if j not in cancelled}, {},
                        damaged="pending.bad.json" if then == "quarantine" else "")


def test_power_cut_after_a_cancels_take_and_a_submit_keeps_every_job(tmp_path: Path,
                                                                     disk: Disk) -> None:
    # Given five jobs, and a cancel of two of them stopped after taking them out of
    # pending/ (not yet settled nor synced: not reported either)
    manifest, outputs, folder = pdf_jobs(tmp_path / "m", 5)
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    os.sync()  # (all of it on the disk, the submit's journal entry retired: no replay)
    with stopped_at("cancel:moved", "cancel", "j000", "j001", "--queue", queue):
        # When a one-job submit (which syncs pending/) returns, and the power is cut
        extra = folder / "extra.json"
        extra.write_text(json.dumps({"jobs": [py_job("extra", "write_pdf", "o/extra.pdf")]}))
        res = run_cli("submit", extra, *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr
        disk.cut()
    disk.reboot()

    # Then no job is lost: the two taken are cancelled or (the cancel never said so) run,
    # the others run
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode in (0, 1), again.stdout + again.stderr
    qv = QueueView(queue)
    where = qv.states_of([*outputs, "extra"])
    assert all(len(s) == 1 for s in where.values()), where
    assert {j for j, s in where.items() if s != ["done"]} <= {"j000", "j001"}, where
    assert all(s in (["done"], ["cancelled"]) for s in where.values()), where


def test_power_cut_during_a_replace_of_a_cancelled_job_never_runs_it_again(
        tmp_path: Path, disk: Disk) -> None:
    # Given a job cancelled while it ran (the cancel returned), its run over, and a submit
    # --replace of it stopped after its commit point, before it placed the new copy
    folder = stage(tmp_path / "m")
    log = tmp_path / "runs.log"

    def version(v: str, s: float) -> dict[str, Any]:
        return {"id": "x", "kind": "python", "callable": "jobfns:count_runs",
                "output": "o/x.pdf", "max_attempts": 3,
                "params": {"log": str(log), "version": v, "s": s}}

    (folder / "old.json").write_text(json.dumps({"jobs": [version("v1", 30)]}))
    (folder / "new.json").write_text(json.dumps({"jobs": [version("v2", 0)]}))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", folder / "old.json", *cli_args(queue, out)).returncode == 0
    runner = Runner(*cli_args(queue, out, *FAST, "--json"))
    runner.until(lambda line: '"started"' in line)
    assert run_cli("cancel", "x", "--queue", queue).returncode == 0
    assert runner.wait(30) == 1
    runner.close()
    with stopped_at("submit:staged", "submit", "--replace", folder / "new.json",
                    *cli_args(queue, out)):
        # When the power is cut there, and a runner runs the queue after the reboot
        disk.cut()
    disk.reboot()
    again = run_cli("run", *cli_args(queue, out, *FAST))
    assert again.returncode in (0, 1), again.stdout + again.stderr

    # Then the cancelled version never ran again: x is cancelled still, or done as v2
    qv = QueueView(queue)
    assert log.read_text().split().count("v1") == 1, log.read_text()
    where = qv.states_of(["x"])["x"]
    assert where in (["cancelled"], ["done"]), where
    if where == ["done"]:
        assert qv.record("done", "x")["spec"]["params"]["version"] == "v2"
    assert os.listdir(queue / "corrupt") == []


def test_power_cut_after_dead_purge_of_a_job_just_dead_lettered_never_brings_it_back(
        tmp_path: Path, disk: Disk) -> None:
    # Given a following runner stopped just after it dead-lettered a job (the dead record
    # synced, the running copy not yet retired), and a `dead purge` that has made its
    # first sync, listed that record and waits for submit's lock (a long submit holds it)
    folder = stage(tmp_path / "m")
    (folder / "jobs.json").write_text(json.dumps(
        {"jobs": [{**py_job("x", "fail", "o/x.pdf"), "max_attempts": 1}]}))
    queue, out = disk.mnt / "q", disk.mnt / "out"
    assert run_cli("submit", folder / "jobs.json", *cli_args(queue, out)).returncode == 0
    runner = Runner(*cli_args(queue, out, *FAST, "--json", "--follow"),
                    env={"RENDERCTL_STOP_AT": "dead"})
    wait_until(lambda: stopped(runner.pid), what="the runner to stop after the dead record")
    held = [os.open(queue / ".submit.lock", os.O_RDWR), os.open(queue / "journal", os.O_RDONLY)]
    for fd in held:
        fcntl.flock(fd, fcntl.LOCK_EX)
    purge = subprocess.Popen([*RENDERCTL, "dead", "purge", "--queue", str(queue)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: waiting_for_a_lock(purge.pid), what="the purge to wait")

        # When the runner goes on (it retires the running copy; nothing syncs that yet),
        # the purge goes on and returns (it purged the job), and the power is cut
        os.kill(runner.pid, signal.SIGCONT)
        wait_until(lambda: not (queue / "running" / "x.json").exists(),
                   what="the running copy to be retired")
        for fd in held:
            os.close(fd)
        held = []
        said, err = purge.communicate(timeout=30)
        assert purge.returncode == 0 and "purged 1" in said, said + err
        freeze_cut_kill(runner, disk)
    finally:
        for fd in held:
            os.close(fd)
        purge.kill()
        runner.close()
    disk.reboot()
    again = run_cli("run", *cli_args(queue, out, *FAST))

    # Then the purged job stays gone (its running copy came back beside no record, and
    # recovery took it for orphaned: dead again, or run again with attempts to spare)
    assert again.returncode == 0, again.stdout + again.stderr
    assert QueueView(queue).all_ids() == set()
