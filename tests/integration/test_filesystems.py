"""The file systems users put the queue and the outputs on, beyond one ext4.

All real mounts (they need root; each test skips, saying why, where it cannot mount):
tmpfs, overlayfs (lower, upper and work folders on a tmpfs), and exFAT through FUSE
(`mkfs.exfat` from exfatprogs, `mount.exfat-fuse` from exfat-fuse): a file system with
no hard links, no user xattrs and no RENAME_NOREPLACE, whose folders all read 0777 unless
mounted with a umask. Queue, outputs and the runner's TMPDIR are put on different ones,
so that nothing may rename across them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jobfns import (
    QueueView,
    Runner,
    assert_pdf,
    cli_args,
    py_job,
    run_cli,
    stage,
    stopped,
    stray_temporaries,
    wait_until,
)

from renderctl.errors import ExitCode
from renderctl.runner import WORK_ROOT_PREFIX

Mounter = Callable[..., Path]


def _umount(mnt: Path) -> None:
    if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mounter]:
    """``mount(kind, name, **opts) -> Path``: a fresh file system of ``kind`` ("tmpfs",
    "overlay", "exfat") mounted at ``tmp_path/name``; all unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount file systems")
    undo: list[Callable[[], None]] = []

    def tmpfs(mnt: Path) -> None:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        undo.append(lambda: _umount(mnt))

    def mk(kind: str, name: str, umask: str | None = None) -> Path:
        mnt = tmp_path / name
        mnt.mkdir()
        if kind == "tmpfs":
            tmpfs(mnt)
        elif kind == "overlay":
            layers = tmp_path / f"{name}.layers"
            layers.mkdir()
            tmpfs(layers)
            for d in ("lower", "upper", "work"):
                (layers / d).mkdir()
            r = subprocess.run(
                ["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={layers}/lower,upperdir={layers}/upper,workdir={layers}/work",
                 str(mnt)], capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount an overlayfs here: {r.stderr.strip()}")
            undo.append(lambda: _umount(mnt))
        else:
            assert kind == "exfat"
            tools = ("mkfs.exfat", "mount.exfat-fuse", "losetup")
            if any(shutil.which(t) is None for t in tools) or not os.path.exists("/dev/fuse"):
                pytest.skip("needs /dev/fuse, mkfs.exfat (exfatprogs) and mount.exfat-fuse "
                            "(exfat-fuse): a file system without hard links")
            image = tmp_path / f"{name}.img"
            with open(image, "wb") as fh:
                fh.truncate(32 << 20)
            subprocess.run(["mkfs.exfat", str(image)], check=True, capture_output=True)
            r = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True,
                               text=True)
            if r.returncode != 0:
                pytest.skip(f"no free loop device: {r.stderr.strip()}")
            dev = r.stdout.strip()
            undo.append(lambda: subprocess.run(["losetup", "-d", dev], capture_output=True))
            opts = ["-o", f"umask={umask}"] if umask is not None else []
            r = subprocess.run(["mount.exfat-fuse", *opts, dev, str(mnt)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot mount exFAT through FUSE here: {r.stderr.strip()}")
            undo.append(lambda: _umount(mnt))
        return mnt

    try:
        yield mk
    finally:
        for u in reversed(undo):
            u()


# Names a user gives: spaces, accents, CJK (4 bytes of UTF-8 a character is not needed:
# 3 is), and names at NAME_MAX (255 bytes) in a folder at NAME_MAX. The temporary beside
# each is a fixed `.rctl-<16>-<16>.tmp`, whatever the name's length.
LONG_ASCII = "n" * 251 + ".pdf"  # 255 bytes
LONG_UTF8 = "ü" * 125 + ".pdf"  # 254 bytes, 129 characters
NAMES = {"spaced": "with spaces/a b c.pdf", "accented": "façade/Ünïcödé ü.pdf",
         "cjk": "請求書/株式会社.pdf", "long": LONG_ASCII, "long-utf8": f"{'d' * 255}/{LONG_UTF8}"}


@pytest.mark.parametrize(("queue_fs", "out_fs", "tmpdir_fs"), [
    ("overlay", "overlay", "tmpfs"), ("tmpfs", "overlay", "tmpfs"), ("overlay", "tmpfs", "overlay"),
], ids=["queue+outputs on overlayfs, TMPDIR on tmpfs",
        "queue on tmpfs, outputs on overlayfs, TMPDIR on a third",
        "queue on overlayfs, outputs on tmpfs, TMPDIR on overlayfs"])
def test_queue_outputs_and_tmpdir_on_other_file_systems_survive_a_crash_after_publish(
        mount: Mounter, tmp_path: Path, write_manifest: Any,
        queue_fs: str, out_fs: str, tmpdir_fs: str) -> None:
    # Given queue, output root and TMPDIR on file systems of their own (or queue and
    # outputs on one overlayfs), and jobs whose outputs have awkward names
    qm = mount(queue_fs, "qfs")
    om = qm if (queue_fs, out_fs) == ("overlay", "overlay") else mount(out_fs, "ofs")
    tm = mount(tmpdir_fs, "tfs")
    stage(tmp_path)
    manifest = write_manifest([py_job(jid, "write_pdf", output=name)
                               for jid, name in NAMES.items()])
    queue, out = qm / "q", om / "out"
    env = {"TMPDIR": str(tm)}

    # When the runner is killed right after publishing the first output, and run again
    first = run_cli("run", manifest, *cli_args(queue, out, "--workers", "2"),
                    env={**env, "RENDERCTL_CRASH_AT": "publish:after_link"})
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    second = run_cli("run", *cli_args(queue, out, "--workers", "2"), env=env)

    # Then every job completed once, its output a whole PDF at exactly its name; nothing
    # crossed file systems (no EXDEV), and nothing is left behind in outputs or TMPDIR
    assert second.returncode == ExitCode.OK, second.stdout + second.stderr
    assert "Traceback" not in first.stderr + second.stderr
    view = QueueView(queue)
    assert view.states_of(NAMES) == {jid: ["done"] for jid in NAMES}
    for jid, name in NAMES.items():
        assert view.record("done", jid)["result"]["path"] == str(out / name)
        assert_pdf(out / name, jid)
    assert stray_temporaries(out) == []
    assert not [p for p in tm.iterdir() if p.name.startswith(("pymp-", WORK_ROOT_PREFIX))], \
        list(tm.iterdir())


def test_an_output_name_over_name_max_is_refused_before_anything_is_enqueued(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given a job whose output name is 256 bytes (one byte over NAME_MAX; 128 characters)
    manifest = write_manifest([py_job("long", "write_pdf", output="sub/" + "ü" * 126 + ".pdf")])

    # When it is submitted
    res = run_cli("submit", manifest, *cli_args(tmp_path / "q", tmp_path / "out"))

    # Then it is refused on one line naming the file, the job and the field
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert f"{manifest}: job long: output: has a segment longer than 255 bytes" in res.stderr
    assert not (tmp_path / "q" / "pending").exists() or not os.listdir(tmp_path / "q" / "pending")


def _deep_output(root: Path, longest: int) -> str:
    """A relative output whose longest path under ``root`` (its folder with the 45-byte
    name of its temporary's private folder beside it) is ``longest`` bytes."""
    from renderctl.manifest import TEMP_NAME_BYTES

    left = longest - len(os.fsencode(root)) - 1 - 1 - TEMP_NAME_BYTES  # the folder's bytes
    segments = []
    while left > 0:
        seg = min(left, 200)
        if left - seg == 1:  # a last segment of one byte would need a lone "/"
            seg -= 1
        segments.append("d" * seg)
        left -= seg + 1  # and the "/" before the next
    assert left == -1, left
    return "/".join(segments) + "/x.pdf"


def test_an_output_too_long_under_its_root_is_refused_before_anything_is_enqueued(
        tmp_path: Path, write_manifest: Any) -> None:
    # Given an output root not made yet, and outputs whose longest path under it (with the
    # attempt's temporary name beside it) is 4,095 bytes (the most a path may hold) and
    # one byte more
    out = tmp_path / "out"
    fits = write_manifest([py_job("fits", "write_pdf", output=_deep_output(out, 4095))],
                          name="fits.toml")
    over = write_manifest([py_job("fits", "write_pdf", output=_deep_output(out, 4095)),
                           py_job("deep", "write_pdf", output=_deep_output(out, 4096))],
                          name="over.toml")

    # When they are validated and submitted
    ok = run_cli("validate", fits, "--out", out)
    res = run_cli("submit", over, *cli_args(tmp_path / "q", out))

    # Then the one that fits passes, and the longer one is refused, naming the file, the job
    # and the field (it was accepted, and failed every attempt, or stopped every runner
    # that recovered it with exit 74), with nothing of the batch enqueued
    assert ok.returncode == 0, ok.stderr
    assert res.returncode == ExitCode.USAGE, res.stdout + res.stderr
    assert f"{over}: job deep: output: is too long under the output root {out}: 4096 " \
        "bytes" in res.stderr, res.stderr
    assert res.stderr.count(": job ") == 1, res.stderr
    assert not (tmp_path / "q" / "pending").exists() or not os.listdir(tmp_path / "q" / "pending")


@pytest.mark.parametrize("longest", [4200, 4100], ids=["the output", "its temporaries"])
def test_a_queued_job_whose_output_path_is_too_long_dead_letters_and_the_queue_goes_on(
        tmp_path: Path, longest: int) -> None:
    from dataclasses import replace

    from renderctl.manifest import jobs_from_dicts
    from renderctl.store import Queue

    # Given a queue that accepted, before submit measured whole paths, a job whose output
    # is too long under its root (never made), and a good job
    stage(tmp_path)
    queue, out = tmp_path / "q", tmp_path / "out"
    deep, good = jobs_from_dicts(
        [{**py_job("deep", "write_pdf"), "priority": 9, "max_attempts": 1},
         py_job("good", "write_pdf")], base=tmp_path, out_root=out)
    deep = replace(deep, output=_deep_output(out, longest))
    q = Queue(queue)
    try:
        q.submit([deep, good])
    finally:
        q.close()
    # and a runner SIGKILLed with it claimed (first: its priority), before any folder was
    # made for it
    first = run_cli("run", *cli_args(queue, out, "--workers", "1"),
                    env={"RENDERCTL_CRASH_AT": "lease"})
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    assert "deep" in QueueView(queue).ids("running")

    # When the queue is run again
    res = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then the long one is dead-lettered (it stopped every runner's recovery, or its first
    # attempt's end, with exit 74, the queue stuck), and the good one completes: a path
    # too long for the output itself is the job's own fault at once; one too long only for
    # its temporaries fails where the job writes its output
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    view = QueueView(queue)
    assert view.states_of(["deep", "good"]) == {"deep": ["dead"], "good": ["done"]}
    last = view.record("dead", "deep")["attempts"][-1]
    assert last["outcome"] == ("invalid_output" if longest == 4200 else "failed"), last
    assert "File name too long" in last["error"], last
    assert_pdf(out / "good.pdf", "good")
    assert "Traceback" not in res.stderr


def test_an_output_folder_made_read_only_before_its_publish_halts_the_run_charging_nothing(
        mount: Mounter, tmp_path: Path, write_manifest: Any) -> None:
    # Given three jobs of one attempt each and a runner frozen just before it publishes
    # the first output
    out = mount("tmpfs", "out")
    stage(tmp_path)
    ids = ["r1", "r2", "r3"]
    manifest = write_manifest([py_job(j, "write_pdf") for j in ids],
                              defaults={"max_attempts": 1})
    queue = tmp_path / "q"
    runner = Runner(manifest, *cli_args(queue, out, "--workers", "1"),
                    env={"RENDERCTL_STOP_AT": "publish:before_link"})
    try:
        wait_until(lambda: stopped(runner.pid), what="the runner to freeze before publishing")

        # When the output file system is remounted read-only meanwhile (once the worker,
        # which goes on with the jobs prefetched to it, has closed what it was writing
        # there: until then the remount fails, "mount point is busy")
        wait_until(lambda: subprocess.run(["mount", "-o", "remount,ro", str(out)],
                                          capture_output=True).returncode == 0,
                   what=f"{out} to be remounted read-only")
        os.kill(runner.pid, signal.SIGCONT)
        code = runner.wait(60)
        stderr = runner.stderr()
    finally:
        runner.close()
        subprocess.run(["mount", "-o", "remount,rw", str(out)], check=True)

    # Then the run halts (saying so, naming the folder) with 74, a summary and no
    # traceback, and no job was charged: each is pending with only released attempts
    assert code == ExitCode.IO_ERROR, (runner.lines, stderr)
    assert f"cannot write outputs: {out}" in stderr, stderr
    assert any(ln.startswith("halted ") for ln in runner.lines), runner.lines
    assert runner.lines[-1].startswith("summary:"), runner.lines
    assert "Traceback" not in stderr
    view = QueueView(queue)
    assert view.states_of(ids) == {j: ["pending"] for j in ids}
    for jid in ids:
        outcomes = [a["outcome"] for a in view.record("pending", jid)["attempts"]]
        assert set(outcomes) <= {"released"}, (jid, outcomes)

    # (What the first run wrote could not be removed from the read-only folder: hidden,
    # never published.)
    assert stray_temporaries(out)

    # When the file system is writable again and the queue run again
    second = run_cli("run", *cli_args(queue, out, "--workers", "1"))

    # Then each job completes once, with a whole PDF, and leaves nothing behind: not even
    # what its released attempt could not remove then (a job is swept of its earlier
    # attempts' temporaries when it completes after a release)
    assert second.returncode == ExitCode.OK, second.stdout + second.stderr
    for jid in ids:
        assert_pdf(out / f"{jid}.pdf", jid)
        assert [a["outcome"] for a in view.record("done", jid)["attempts"]][-1] == "completed"
    assert stray_temporaries(out) == []


def test_outputs_on_a_file_system_without_hard_links_halt_the_run_and_overwrite_nothing(
        mount: Mounter, tmp_path: Path, write_manifest: Any) -> None:
    # Given outputs on exFAT (no hard links, no user xattrs, no RENAME_NOREPLACE; mounted
    # 0755, so that only we can write there), where job x's output holds someone's file
    out = mount("exfat", "exfat", umask="022") / "out"
    out.mkdir()
    foreign = out / "x.pdf"
    foreign.write_bytes(b"someone else's file")
    stage(tmp_path)
    manifest = write_manifest([py_job("x", "write_pdf"), py_job("y", "write_pdf")],
                              defaults={"max_attempts": 1})
    queue = tmp_path / "q"

    # When they run
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the foreign file is untouched and x dead-letters with output_exists; y, which
    # cannot be published there without risking an overwrite, is not charged: the run
    # halts with 74 naming the output and why, with a summary and no traceback
    assert foreign.read_bytes() == b"someone else's file"
    assert res.returncode == ExitCode.IO_ERROR, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert f"cannot write outputs: {out / 'y.pdf'}" in res.stderr, res.stderr
    assert any(ln.startswith("halted ") for ln in res.stdout.splitlines()), res.stdout
    assert res.stdout.splitlines()[-1].startswith("summary:"), res.stdout
    view = QueueView(queue)
    assert view.states_of(["x", "y"]) == {"x": ["dead"], "y": ["pending"]}
    assert view.record("dead", "x")["attempts"][-1]["outcome"] == "output_exists"
    assert {a["outcome"] for a in view.record("pending", "y")["attempts"]} == {"released"}
    assert not (out / "y.pdf").exists()
    assert stray_temporaries(out) == []


def test_a_folder_whose_file_system_ignores_permissions_fails_each_job_clearly(
        mount: Mounter, tmp_path: Path, write_manifest: Any) -> None:
    # Given outputs on exFAT mounted as it comes (every folder reads 0777: others can
    # write there, and no folder can be made private)
    out = mount("exfat", "exfat") / "out"
    stage(tmp_path)
    manifest = write_manifest([py_job("a", "write_pdf"), py_job("b", "write_pdf")],
                              defaults={"max_attempts": 3})
    queue = tmp_path / "q"

    # When they run
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then each job is dead-lettered at once (a retry cannot fix the folder) with an error
    # that says why, no worker prints a traceback, and nothing is left in the folder
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr, res.stderr
    view = QueueView(queue)
    for jid in ("a", "b"):
        attempts = view.record("dead", jid)["attempts"]
        assert [a["outcome"] for a in attempts] == ["invalid_output"], attempts
        assert "does not keep permissions" in attempts[0]["error"], attempts[0]["error"]
        assert str(out) in attempts[0]["error"], attempts[0]["error"]
    assert stray_temporaries(out) == []
    assert os.listdir(out) == []


def test_a_folder_output_on_a_file_system_without_rename_noreplace_is_dead_at_once_clearly(
        mount: Mounter, tmp_path: Path, write_manifest: Any) -> None:
    # Given a split job (a folder output, published only by renameat2(RENAME_NOREPLACE))
    # whose output root is on exFAT through FUSE, which refuses that flag (EINVAL)
    out = mount("exfat", "exfat", umask="022") / "out"
    pdf = Path(__file__).resolve().parents[2] / "sample-inputs" / "pdf" / "a.pdf"
    manifest = write_manifest([{"id": "sp", "kind": "split", "input": str(pdf),
                                "output": "pages"}])
    queue = tmp_path / "q"

    # When it runs
    res = run_cli("run", manifest, *cli_args(queue, out, "--workers", "1"))

    # Then the runner goes on (exit 1, a summary, no traceback) and the job is dead at once
    # with an error naming the output and the likely cause; nothing is left in the folder
    assert res.returncode == ExitCode.JOBS_FAILED, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert res.stdout.splitlines()[-1].startswith("summary:"), res.stdout
    attempts = QueueView(queue).record("dead", "sp")["attempts"]
    assert [a["outcome"] for a in attempts] == ["invalid_output"], attempts
    assert f"cannot publish {out / 'pages'}: Invalid argument" in attempts[0]["error"]
    assert "RENAME_NOREPLACE" in attempts[0]["error"]
    assert os.listdir(out) == []
