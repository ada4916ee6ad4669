"""What must be on disk before a step that depends on it, read from the real system calls.

What a power loss would undo can be named: anything not synced (test_power_loss.py stages
real cuts; this names the order, for every command, without needing a loop device).
Each test runs a real renderctl command under strace and checks that the sync comes before
the step that would otherwise lose, or contradict, what it depends on: the running copy of a
job unlinked before its later record is durable; a done record placed before the output's
publish on another file system is; a `wait` answering "done" before the runner synced it; a
`prune` deleting records a lost journal retirement would need. (This ext4 runs without a
journal: each folder's block reaches the disk on its own, in no fixed order.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jobfns import RENDERCTL, QueueView, _env, assert_pdf, cli_args, py_job, run_cli, stage

SIGKILLED = -9

pytestmark = pytest.mark.skipif(shutil.which("strace") is None,
                                reason="strace is not installed: system-call order unseen")


def traced(tmp_path: Path, *args: str | os.PathLike[str],
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                        list[str]]:
    """Run ``renderctl ARGS`` under strace (its own thread only: the runner's, not its
    workers'); the result and the calls that sync, name or write, in order, with each
    descriptor's path (-y)."""
    trace = tmp_path / f"trace.{len(list(tmp_path.glob('trace.*')))}"
    res = subprocess.run(
        ["strace", "-qq", "-y", "-e", "signal=none", "-o", str(trace), "-e",
         "trace=syncfs,fsync,unlink,unlinkat,rename,renameat,renameat2,write",
         *RENDERCTL, *map(str, args)],
        capture_output=True, text=True, timeout=120, env=_env(env))
    return res, trace.read_text().splitlines()


def first(calls: list[str], pattern: str) -> int:
    """Index of the first call matching ``pattern`` (a regex); fails if there is none."""
    for i, call in enumerate(calls):
        if re.search(pattern, call):
            return i
    raise AssertionError(f"no call matches {pattern!r}:\n" + "\n".join(calls[-60:]))


def crash_one_job_at(tmp_path: Path, write_manifest: Any, point: str,
                     out: Path) -> tuple[Path, QueueView]:
    stage(tmp_path)
    queue = tmp_path / "q"
    manifest = write_manifest([py_job("only", "write_pdf")])
    crashed = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"),
                      env={"RENDERCTL_CRASH_AT": point})
    assert crashed.returncode == SIGKILLED, crashed.stdout + crashed.stderr
    return queue, QueueView(queue)


def test_recovery_syncs_the_later_record_before_it_unlinks_the_running_copy(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a runner killed after renaming a job's done record into done/, before its sync
    out = tmp_path / "out"
    queue, qv = crash_one_job_at(tmp_path, write_manifest, "commit:placed", out)
    assert qv.ids("done") == {"only"} and qv.ids("running") == {"only"}

    # When the next runner recovers the queue
    res, calls = traced(tmp_path, "run", *cli_args(queue, out))
    assert res.returncode == 0, res.stdout + res.stderr

    # Then it syncs before it unlinks the running copy: the dead runner may never have
    # synced the done record (nor the output's publish), and a power loss after the unlink
    # would leave the job in no folder (it unlinked with no sync at all)
    unlink = first(calls, r'unlink(at)?\(.*running/only\.json"')
    assert any(c.startswith("syncfs(") for c in calls[:unlink]), "\n".join(calls[:unlink + 1])
    assert qv.ids("done") == {"only"} and qv.ids("running") == set()
    assert_pdf(out / "only.pdf", "only")


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no /dev/shm to write")
def test_recovery_syncs_an_outputs_other_file_system_before_its_done_record(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given an output root on another file system than the queue (tmpfs), and a runner
    # killed after publishing a job's output, before recording it (nothing synced since)
    shm = Path(os.environ.get("RENDERCTL_TEST_SHM", "/dev/shm"))
    out = shm / f"renderctl-test-{os.getpid()}-{tmp_path.name}"
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("/dev/shm is on the same file system as the test's folder")
    try:
        queue, qv = crash_one_job_at(tmp_path, write_manifest, "publish:after_link", out)
        assert (out / "only.pdf").exists() and qv.ids("done") == set()

        # When the next runner completes it from that evidence
        res, calls = traced(tmp_path, "run", *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr

        # Then the output's file system is synced before the done record vouching for its
        # publish is renamed into done/ (only the queue's was: a power loss could keep the
        # record and lose the publish, with nothing left to restore it)
        placed = first(calls, r'rename(at2?)?\(.*done/only\.json"')
        assert any(c.startswith("syncfs(") and f"<{out}" in c for c in calls[:placed]), \
            "\n".join(calls[:placed + 1])
        assert qv.ids("done") == {"only"}
        assert qv.record("done", "only")["result"].get("recovered") is True
        assert_pdf(out / "only.pdf", "only")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_wait_syncs_before_it_answers(tmp_path: Path, write_manifest: Any) -> None:
    # Given a job done (as a runner that has placed its record, before syncing it, shows it)
    out = tmp_path / "out"
    queue, qv = crash_one_job_at(tmp_path, write_manifest, "commit:placed", out)
    assert qv.ids("done") == {"only"}

    # When a script waits for it
    res, calls = traced(tmp_path, "wait", "only", "--queue", queue)
    assert res.returncode == 0 and res.stdout == "only: done\n", res.stdout + res.stderr

    # Then the answer comes after a sync: a power loss after it cannot undo the job's end,
    # which would run it again and publish its output anew after "done" was said
    answer = first(calls, r'^write\(1.*only: done')
    assert any(c.startswith("syncfs(") for c in calls[:answer]), "\n".join(calls[:answer + 1])


def test_prune_syncs_before_it_deletes(tmp_path: Path, write_manifest: Any) -> None:
    # Given a job accepted and then cancelled, with no runner
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    manifest = write_manifest([py_job("gone", "write_pdf")])
    assert run_cli("submit", manifest, *cli_args(queue, out)).returncode == 0
    assert run_cli("cancel", "gone", "--queue", queue).returncode == 0

    # When its record is pruned
    res, calls = traced(tmp_path, "prune", "--older-than", "0s", "--queue", queue)
    assert res.returncode == 0, res.stdout + res.stderr

    # Then everything before it is durable first: the submit's journal entry was retired
    # without a sync (replays are idempotent while the job's records exist), and replayed
    # after a power loss with the record deleted, it would put the cancelled job back in
    # pending, to run
    unlink = first(calls, r'unlink(at)?\(.*cancelled/gone\.json"')
    assert any(c.startswith("syncfs(") for c in calls[:unlink]), "\n".join(calls[:unlink + 1])
    assert QueueView(queue).ids("cancelled") == set()


def test_an_output_folder_mounted_inside_the_root_is_synced_before_its_record(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given an output folder that is a mount point inside the output root (another file
    # system than the root's and the queue's)
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    mounted = out / "mounted"
    mounted.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mounted)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace rights)")
    try:
        manifest = write_manifest([py_job("deep", "write_pdf", "mounted/deep.pdf")])

        # When a job publishing there runs
        res, calls = traced(tmp_path, "run", manifest, *cli_args(queue, out))
        assert res.returncode == 0, res.stdout + res.stderr

        # Then that file system is synced before the done record vouching for the publish is
        # placed (the root's was, which does not hold the output)
        placed = first(calls, r'rename(at2?)?\(.*done/deep\.json"')
        assert any(c.startswith("syncfs(") and f"<{mounted}" in c for c in calls[:placed]), \
            "\n".join(calls[:placed + 1])
        assert_pdf(mounted / "deep.pdf", "deep")
    finally:
        subprocess.run(["umount", "-l", str(mounted)], capture_output=True)


def test_submit_into_a_new_queue_reports_no_acceptance_after_any_failed_fsync(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a manifest, and a queue to be made under two folders that do not exist yet
    stage(tmp_path)
    manifest = write_manifest([py_job("a", "write_one_byte", output="a.bin"),
                               py_job("b", "write_one_byte", output="b.bin")])
    ancestors_hit = 0
    for when in range(1, 9):
        queue = tmp_path / f"new{when}" / "x" / "q"
        trace = tmp_path / f"inject.{when}"

        # When its fsync number `when` fails (EIO)
        res = subprocess.run(
            ["strace", "-qq", "-y", "-o", str(trace), "-e", "trace=fsync",
             "-e", f"inject=fsync:error=EIO:when={when}",
             *RENDERCTL, "submit", str(manifest), *cli_args(queue, tmp_path / "out")],
            capture_output=True, text=True, timeout=120, env=_env(None))
        injected = [c for c in trace.read_text().splitlines() if "INJECTED" in c]
        if not injected:
            assert res.returncode == 0, res.stderr  # fewer fsyncs than `when`
            continue

        # Then the submit fails (74) rather than report "accepted": a folder made for the
        # queue whose entry is not durable loses every job under it at a power cut
        assert res.returncode == 74, (when, injected, res.stdout, res.stderr)
        assert "accepted 2" not in res.stdout, res.stdout
        folder = re.search(r"fsync\(\d+<([^>]*)>", injected[0])
        assert folder is not None, injected
        if Path(folder[1]) in queue.parents:
            ancestors_hit += 1
    # (The sweep reached the fsyncs of the new folders' parents.)
    assert ancestors_hit >= 2, ancestors_hit


def test_an_open_that_replays_a_batch_and_fails_an_fsync_exits_74_not_a_warning(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a batch committed by a submit killed before it placed it
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    batch = write_manifest([py_job("a", "write_one_byte", output="a.bin"),
                            py_job("b", "write_one_byte", output="b.bin")])
    killed = run_cli("submit", batch, *cli_args(queue, out),
                     env={"RENDERCTL_CRASH_AT": "submit:staged"})
    assert killed.returncode == SIGKILLED, killed.stderr

    # When `status` opens the queue, places the batch, and the fsync of that fails (EIO)
    res = subprocess.run(
        ["strace", "-qq", "-o", str(tmp_path / "trace"), "-e", "trace=fsync,syncfs",
         "-e", "inject=fsync:error=EIO:when=1", *RENDERCTL, "status", "--queue", str(queue)],
        capture_output=True, text=True, timeout=120, env=_env(None))

    # Then it exits 74 naming the failed fsync: a failed fsync is fatal, not a warning about
    # a full disk (and nothing is reported as if the queue were whole)
    assert res.returncode == 74, res.stdout + res.stderr
    assert "fsync failed" in res.stderr and "free room" not in res.stderr, res.stderr
    assert res.stdout == ""
