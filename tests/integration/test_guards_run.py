"""Resource guards of `renderctl run`, end to end: real runners, real processes, real signals.

Memory ceilings (cgroup v1 and sampling), timeouts with a SIGTERM-ignoring tree, cancel
(pending, running, racing a claiming runner), drain on SIGTERM/SIGINT, and memory-aware
admission. Every wait polls the queue folders, the runner's JSON Lines or the process table
against a deadline; nothing sleeps hoping a condition has become true.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from jobfns import RENDERCTL, STATES, cgroup_v1_writable, wait_until
from pypdf import PdfReader

from renderctl import proctree

MB = 1024 * 1024
GUARDFNS = Path(__file__).with_name("guardfns.py")



# -- helpers -------------------------------------------------------------------------------


def pid_gone(pid: int) -> bool:
    """Not running any more (a zombie waiting for its reaper counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def kill_leftovers(pids: Sequence[int]) -> None:
    """Teardown: SIGKILL what a job of this test left behind (its group if it leads one)."""
    for p in pids:
        if pid_gone(p):
            continue
        try:
            if os.getpgid(p) == p:
                os.killpg(p, signal.SIGKILL)
            else:
                os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


class RunnerProc:
    """`renderctl run --json ...` in its own session; its stdout events collected by a thread."""

    def __init__(self, args: Sequence[str], log_dir: Path) -> None:
        self.stderr_path = log_dir / f"runner-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in close()
        env = {**os.environ, "NO_COLOR": "1"}
        self.proc = subprocess.Popen([*RENDERCTL, "run", "--json", *args], stdout=subprocess.PIPE,
                                     stderr=self._stderr, stdin=subprocess.DEVNULL, text=True,
                                     start_new_session=True, env=env)
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.raw.append(line)
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                ev["_seen"] = time.monotonic()
                self.events.append(ev)

    def find(self, event: str, job: str | None = None) -> list[dict[str, Any]]:
        return [e for e in list(self.events)
                if e.get("event") == event and (job is None or e.get("job") == job)]

    def wait_event(self, event: str, job: str | None = None, *, count: int = 1,
                   timeout: float = 20.0) -> list[dict[str, Any]]:
        def got() -> list[dict[str, Any]] | None:
            if self.proc.poll() is not None and len(self.find(event, job)) < count:
                self._reader.join(timeout=2)
                if len(self.find(event, job)) < count:
                    raise AssertionError(f"runner exited {self.proc.returncode} before "
                                         f"{count}x {event} {job or ''}\n{self.diag()}")
            found = self.find(event, job)
            return found if len(found) >= count else None

        return wait_until(got, timeout_s=timeout,
                          what=lambda: f"{count}x event {event} {job or ''}\n{self.diag()}")

    def wait_exit(self, timeout: float = 30.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"runner still running after {timeout}s\n{self.diag()}") from None
        self._reader.join(timeout=5)
        return rc

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def diag(self) -> str:
        try:
            err = self.stderr_path.read_text()[-3000:]
        except OSError:
            err = ""
        return "stdout:\n" + "".join(self.raw[-40:]) + "\nstderr:\n" + err

    def close(self) -> None:
        """Teardown: stop a runner a failed (or xfail) test left running, and reap it."""
        # SIGTERM, then SIGTERM again (skips the grace), so that it removes its own cgroups;
        # SIGKILL of its session as the last resort (workers die with it: PDEATHSIG).
        for sig, wait_s in ((signal.SIGTERM, 0.5), (signal.SIGTERM, 5.0),
                            (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                if sig == signal.SIGKILL:
                    os.killpg(self.proc.pid, sig)
                else:
                    self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        self._reader.join(timeout=5)
        self._stderr.close()


class Env:
    """One test's queue, output root and manifest folder (with guardfns.py beside it)."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.queue = tmp_path / "queue"
        self.out = tmp_path / "out"
        shutil.copy(GUARDFNS, tmp_path / "guardfns.py")
        self.runners: list[RunnerProc] = []

    def manifest(self, jobs: Sequence[Mapping[str, Any]], name: str = "jobs.json",
                 defaults: Mapping[str, Any] | None = None) -> Path:
        doc: dict[str, Any] = {"jobs": [dict(j) for j in jobs]}
        if defaults:
            doc["defaults"] = dict(defaults)
        path = self.root / name
        path.write_text(json.dumps(doc))
        return path

    def qargs(self, *, out: bool = True) -> list[str]:
        return ["--queue", str(self.queue)] + (["--out", str(self.out)] if out else [])

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        qargs = self.qargs(out=args[0] in ("submit", "run"))
        res = subprocess.run([*RENDERCTL, *args, *qargs], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "NO_COLOR": "1"})
        if check and res.returncode != 0:
            raise AssertionError(f"renderctl {' '.join(args)} exit {res.returncode}\n"
                                 f"{res.stdout}\n{res.stderr}")
        return res

    def run(self, *args: str) -> RunnerProc:
        r = RunnerProc([*self.qargs(), *args], self.root)
        self.runners.append(r)
        return r

    def show(self, jid: str) -> dict[str, Any]:
        return json.loads(self.cli("show", jid, "--json").stdout)

    def state_of(self, jid: str) -> list[str]:
        """Every state folder holding the job (a correct queue says exactly one)."""
        return [s for s in STATES if (self.queue / s / f"{jid}.json").exists()]

    def ids_in(self, state: str) -> set[str]:
        folder = self.queue / state
        if not folder.exists():
            return set()
        return {n[:-5] for n in os.listdir(folder) if n.endswith(".json")}

    def record(self, state: str, jid: str) -> dict[str, Any]:
        return json.loads((self.queue / state / f"{jid}.json").read_text())


def job(jid: str, fn: str, **extra: Any) -> dict[str, Any]:
    return {"id": jid, "kind": "python", "callable": f"guardfns:{fn}",
            "output": f"{jid}.pdf", **extra}


def pdf_ok(path: Path) -> bool:
    return path.is_file() and len(PdfReader(path).pages) >= 1


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    yield e
    for r in e.runners:
        r.close()


# -- 1. memory ceiling -----------------------------------------------------------------------

GUARDS = [
    # (guard, allocation pace MB/s (0: flat out), allowed overshoot of the recorded peak)
    pytest.param("cgroup-v1", 0, 1 * MB, id="cgroup-v1",
                 marks=pytest.mark.skipif(not cgroup_v1_writable(),
                                          reason="cgroup v1 memory controller not writable")),
    pytest.param("sampling", 400, 64 * MB, id="sampling"),
]


@pytest.mark.parametrize(("guard", "rate", "margin"), GUARDS)
def test_memory_ceiling_kills_the_hog_and_spares_its_neighbour(env: Env, guard: str, rate: int,
                                                               margin: int) -> None:
    # Given a job growing towards 2 GB under a 300 MB ceiling, beside a quiet 1 s job
    (env.root / "batch.csv").write_bytes(b"x")
    m = env.manifest([job("hog", "hog", params={"mb": 2000, "rate_mb_s": rate},
                          inputs=["batch.csv"]),
                      job("calm", "sleep_then_write", params={"s": 1.0})])
    t0 = time.monotonic()
    # (one job per worker: see test_idle_worker_is_not_left_idle_while_a_job_waits)
    r = env.run(str(m), "--workers", "2", "--memory-mb", "300", "--max-attempts", "1",
                "--memory-guard", guard, "--max-jobs-per-worker", "1")
    rc = r.wait_exit(timeout=30)
    wall = time.monotonic() - t0
    started = r.find("runner_started")
    assert started and started[0]["guard"] == guard, r.diag()

    # Then the hog is dead after one attempt, outcome memory, with its peak recorded
    hog = env.show("hog")
    assert hog["state"] == "dead", hog
    assert hog["spec"]["memory_mb"] == 300
    assert [a["outcome"] for a in hog["attempts"]] == ["memory"], hog["attempts"]
    att = hog["attempts"][0]
    # (naming what it was given: a big input is told from a leak; audit DC)
    assert att["error"].endswith("; its input: batch.csv"), att
    peak = att.get("peak_memory_bytes")
    shown = f"{peak / MB:.1f} MB" if peak else repr(peak)
    print(f"\n[memory/{guard}] recorded peak {shown} "
          f"(ceiling 300 MB, allowed <= {300 + margin / MB:.0f} MB); "
          f"attempt elapsed {att['elapsed_s']:.3f}s; run wall {wall:.2f}s")
    assert peak is not None and peak > 0
    assert peak <= 300 * MB + margin
    assert "300 MB" in att["error"]
    assert not (env.out / "hog.pdf").exists()

    # And the neighbour completed untouched, while the hog was running beside it
    calm = env.show("calm")
    assert calm["state"] == "done", calm
    assert [a["outcome"] for a in calm["attempts"]] == ["completed"]
    assert calm["attempts"][0]["started_at"] < att["ended_at"], "the jobs never overlapped"
    assert pdf_ok(env.out / "calm.pdf")
    assert rc == 1  # a job was dead-lettered


GUARDS_CHILD = [
    pytest.param("cgroup-v1", id="cgroup-v1", marks=[
        pytest.mark.skipif(not cgroup_v1_writable(),
                           reason="cgroup v1 memory controller not writable"),
        ]),
    pytest.param("sampling", id="sampling"),
]


@pytest.mark.parametrize("guard", GUARDS_CHILD)
def test_memory_ceiling_kills_the_whole_tree_when_a_child_crosses_it(env: Env,
                                                                    guard: str) -> None:
    # Given a job whose helper child grows towards 2 GB under a 300 MB ceiling, and which
    # would shrug off the child's death and carry on for 5 s (a tool retrying its helper)
    marker = env.root / "child-died.txt"
    m = env.manifest([job("tool", "hog_in_child", memory_mb=300, max_attempts=1,
                          params={"mb": 2000, "rate_mb_s": 400, "after_s": 5,
                                  "marker": str(marker)})])
    r = env.run(str(m), "--workers", "1", "--memory-guard", guard)
    assert r.wait_exit(timeout=30) == 1, r.diag()
    att = env.show("tool")["attempts"]
    assert [a["outcome"] for a in att] == ["memory"], att
    # The marker may be empty: the kill can land while the job writes it.
    died = marker.read_text().split() if marker.exists() else []
    seen = (f"child died {float(died[1]) - att[0]['started_at']:.2f}s into the attempt; "
            if len(died) > 1 else "")
    print(f"\n[memory-child/{guard}] {seen}attempt ended after {att[0]['elapsed_s']:.2f}s, "
          f"peak {att[0].get('peak_memory_bytes', 0) / MB:.1f} MB")
    # Then the job's process group is killed as the ceiling is crossed, not 5 s later
    assert att[0]["elapsed_s"] < 2.0, "the job's tree ran on after crossing its ceiling"
    assert not (env.out / "tool.pdf").exists()


# -- 2. timeout with a SIGTERM-ignoring tree --------------------------------------------------


def test_timeout_escalates_to_sigkill_and_leaves_no_grandchild(env: Env) -> None:
    pidfile = env.root / "grandchildren.txt"
    m = env.manifest([job("stubborn", "ignore_term_with_grandchild", timeout_s=1,
                          max_attempts=2, params={"pidfile": str(pidfile)})])
    r = env.run(str(m), "--workers", "1", "--kill-grace", "0.5", "--backoff-base", "0")

    def pids() -> list[int]:
        return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []

    try:
        for n, recorded in ((1, "retry"), (2, "dead")):
            # Given attempt n running with its SIGTERM-ignoring grandchild alive
            worker = r.wait_event("started", "stubborn", count=n, timeout=20)[n - 1]["worker"]
            gc = wait_until(lambda n=n: len(pids()) >= n and pids()[n - 1], timeout_s=10,
                            what=f"the grandchild pid of attempt {n}")
            assert not pid_gone(gc), "the grandchild should be running before the timeout"
            # When the attempt is recorded (timeout, then SIGTERM ignored, then SIGKILL)
            ev = r.wait_event(recorded, "stubborn", timeout=10)[0]
            assert ev["outcome"] == "timeout", ev
            # Then the grandchild is gone within 2 s of that
            wait_until(lambda gc=gc, w=worker: pid_gone(gc) and not proctree.group_alive(w),
                       timeout_s=max(0.0, ev["_seen"] + 2 - time.monotonic()),
                       what=f"grandchild {gc} (and group {worker}) of attempt {n} to be gone")
        assert r.wait_exit(timeout=10) == 1
        rec = env.show("stubborn")
        assert rec["state"] == "dead"
        outcomes = [a["outcome"] for a in rec["attempts"]]
        assert outcomes == ["timeout", "timeout"], rec["attempts"]
        for a in rec["attempts"]:
            # timeout_s, then the full kill grace (SIGTERM is ignored), then SIGKILL
            assert 1.0 <= a["elapsed_s"] < 1.0 + 0.5 + 1.0, a
            assert a.get("signal") == signal.SIGKILL, a
            # (said so: "terminated" alone hid that it had ignored the SIGTERM; audit CI)
            assert a["error"] == ("exceeded timeout_s=1; process group terminated, and killed "
                                  "(SIGKILL) when the 0.5 s kill grace ended"), a
        print(f"\n[timeout] attempt elapsed: {[a['elapsed_s'] for a in rec['attempts']]}")
        assert all(pid_gone(p) for p in pids())
    finally:
        kill_leftovers(pids())


def test_a_job_queued_behind_a_timed_out_one_that_survives_sigterm_runs_once(env: Env) -> None:
    # Given one worker, a job that leaves when SIGTERMed (its worker survives the signal),
    # and a job queued behind it that records each start
    log = env.root / "starts.txt"
    # (quick jobs first: with short recent jobs the runner queues the next job in the worker
    # behind the running one, rather than keep it)
    m = env.manifest([*(job(f"quick{i}", "write_pdf", priority=20) for i in range(5)),
                      job("stays", "leave_on_sigterm", timeout_s=1, max_attempts=1,
                          priority=10),
                      job("next", "record_times", params={"file": str(log), "s": 2.5})])
    # When the first times out, with a kill grace shorter than the second job
    r = env.run(str(m), "--workers", "1", "--kill-grace", "1.5", "--backoff-base", "0")
    assert r.wait_exit(timeout=20) == 1, r.diag()
    # Then the second ran once, in a fresh worker: it was not started in the doomed worker,
    # killed with it at the end of the grace, released and run again (its effects twice)
    assert env.show("stays")["attempts"][0]["outcome"] == "timeout"
    rec = env.show("next")
    assert rec["state"] == "done", rec
    assert [a["outcome"] for a in rec["attempts"]] == ["completed"], rec["attempts"]
    assert len(log.read_text().splitlines()) == 1
    assert pdf_ok(env.out / "next.pdf")
    requeued = r.find("requeued", "next")
    assert [e["reason"] for e in requeued] == ["its worker is being killed"], r.diag()


def test_a_timed_out_attempt_keeps_the_tail_of_what_the_job_said(env: Env) -> None:
    # Given a python job and a command job that each say something, then hang
    m = env.manifest([job("py", "say_then_hang", params={"say": "python job was here"}),
                      {"id": "cmd", "kind": "command", "output": "cmd.pdf",
                       "argv": ["sh", "-c", "echo command job was here >&2; exec sleep 60",
                                "sh", "{output}"]}],
                     defaults={"timeout_s": 1, "max_attempts": 1})

    # When both time out
    r = env.run(str(m), "--workers", "2", "--kill-grace", "0.2")
    assert r.wait_exit(timeout=30) == 1, r.diag()

    # Then each attempt's record keeps its last words, as a failed attempt's does
    for jid, said in (("py", "python job was here"), ("cmd", "command job was here")):
        (attempt,) = env.show(jid)["attempts"]
        assert attempt["outcome"] == "timeout", attempt
        assert said in (attempt.get("stderr_tail") or ""), attempt


def _time_out_command(env: Env, script: str, grace_s: int) -> dict[str, Any]:
    """Run the shell ``script`` as a command job with a 1 s timeout and a kill grace of
    ``grace_s``; the attempt it ends with (a timeout, exit 1)."""
    m = env.manifest([{"id": "cmd", "kind": "command", "output": "cmd.pdf",
                       "argv": ["sh", "-c", script, "sh", "{output}"], "timeout_s": 1,
                       "max_attempts": 1}])
    r = env.run(str(m), "--workers", "1", "--kill-grace", str(grace_s))
    assert r.wait_exit(timeout=grace_s * 2) == 1, r.diag()
    (attempt,) = env.show("cmd")["attempts"]
    assert attempt["outcome"] == "timeout", attempt
    return attempt


def test_a_timed_out_command_gets_the_kill_grace_to_clean_up(env: Env) -> None:
    # Given a command that cleans up for 0.3 s on SIGTERM (a tool removing its lock files),
    # when it times out with a kill grace of 5 s
    marker = env.root / "cleaned-up"
    attempt = _time_out_command(
        env, f"trap 'echo got TERM >&2; sleep 0.3; touch {marker}; exit 1' TERM; "
             "echo working >&2; sleep 60 & wait", grace_s=5)

    # Then it got SIGTERM and the time to finish its clean-up, well before the SIGKILL,
    # and the attempt is a timeout that kept what it said
    assert marker.exists(), "the command was killed before it could clean up"
    assert 1.3 <= attempt["elapsed_s"] < 5.0, attempt
    assert "got TERM" in (attempt.get("stderr_tail") or ""), attempt


def test_a_command_gets_its_kill_grace_even_if_the_sigterm_meets_it_just_started(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a worker frozen just after starting a command that cleans up for 0.3 s on
    # SIGTERM, so that the timeout's SIGTERM reaches it there (the runner continues it)
    monkeypatch.setenv("RENDERCTL_STOP_AT", "worker:command_started")
    marker = env.root / "cleaned-up"

    # When the command times out, with a kill grace of 5 s
    attempt = _time_out_command(
        env, f"trap 'sleep 0.3; touch {marker}; exit 1' TERM; sleep 60 & wait", grace_s=5)

    # Then it had its clean-up (before: the worker died of the SIGTERM at once, and the
    # command with it, by its parent-death signal: audit DL)
    assert marker.exists(), "the command was killed before it could clean up"
    assert attempt["elapsed_s"] < 5.0, attempt


def test_a_command_the_timeout_meets_before_its_exec_ends_without_its_grace(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a command frozen in its own process after the fork, before its exec, when its
    # 1 s timeout sends the group SIGTERM (and SIGCONT), with a kill grace of 5 s
    monkeypatch.setenv("RENDERCTL_STOP_AT", "worker:command_forked")

    # When it times out
    attempt = _time_out_command(env, "sleep 60", grace_s=5)

    # Then the SIGTERM ends it before it ever runs (review DO: taken by the worker's
    # handler in the child, it was lost; the command ran until the grace's SIGKILL)
    assert attempt["elapsed_s"] < 3.0, attempt


def test_a_stopped_command_that_times_out_is_continued_to_clean_up(env: Env) -> None:
    # Given a command that cleans up on SIGTERM, but has stopped itself (kill -STOP $$),
    # when it times out with a kill grace of 30 s
    marker = env.root / "cleaned-up"
    attempt = _time_out_command(
        env, f"trap 'touch {marker}; exit 1' TERM; kill -STOP $$; sleep 60", grace_s=30)

    # Then it was continued after its SIGTERM, cleaned up and ended long before the grace
    # was out (before: it stayed stopped, the SIGTERM pending, until the SIGKILL 30 s on:
    # audit CB)
    assert marker.exists(), "the command never ran its clean-up"
    assert attempt["elapsed_s"] < 20, attempt


@pytest.mark.parametrize("kind", ["python", "command"])
def test_a_timed_out_job_is_sent_sigterm_once(env: Env, kind: str) -> None:
    # Given a job that counts the SIGTERMs it is sent (for 0.5 s after the first), then exits
    count = env.root / "terms"
    if kind == "python":
        spec = job("counter", "count_sigterms", params={"countfile": str(count)})
    else:
        spec = {"id": "counter", "kind": "command", "output": "counter.pdf",
                "argv": [sys.executable, str(env.root / "guardfns.py"), "count_sigterms",
                         str(count), "{output}"]}
    m = env.manifest([{**spec, "timeout_s": 1, "max_attempts": 1}])

    # When it times out, with a kill grace of 5 s
    r = env.run(str(m), "--workers", "1", "--kill-grace", "5")
    assert r.wait_exit(timeout=30) == 1, r.diag()

    # Then it was sent one SIGTERM: before, the group's signal was sent again to each
    # process of the job's tree and slot, up to three times (a second SIGTERM is "stop
    # now, skip the clean-up" to many programs)
    assert count.read_text() == "1"
    (attempt,) = env.show("counter")["attempts"]
    assert attempt["outcome"] == "timeout", attempt


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
def test_memory_a_killed_job_left_in_its_slot_is_not_charged_to_the_next_job(env: Env) -> None:
    # Given a job that leaves 150 MB in /dev/shm and hangs until its timeout kills it, and
    # then, in the same worker slot, a job that needs 120 MB of its 200 MB ceiling
    shm = Path("/dev/shm") / f"renderctl-test-{os.getpid()}-{time.monotonic_ns()}"
    m = env.manifest([job("leaver", "shm_then_hang", priority=1, timeout_s=2,
                          params={"mb": 150, "path": str(shm)}),
                      job("next", "hog", params={"mb": 120})],
                     defaults={"memory_mb": 200, "max_attempts": 1})
    try:
        # When they run one after the other on one worker
        r = env.run(str(m), "--workers", "1", "--kill-grace", "0.2",
                    "--memory-guard", "cgroup-v1")
        assert r.wait_exit(timeout=60) == 1, r.diag()
        assert shm.stat().st_size == 150 * MB  # the leftover is still there, charged
    finally:
        shm.unlink(missing_ok=True)

    # Then the first timed out, and the second was not killed for what the first left
    assert env.show("leaver")["attempts"][0]["outcome"] == "timeout"
    assert env.state_of("next") == ["done"], env.show("next")["attempts"]
    assert pdf_ok(env.out / "next.pdf")


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
def test_a_jobs_recorded_peak_leaves_out_the_page_cache_earlier_jobs_left(env: Env) -> None:
    # Given, in one worker slot, ten jobs that each write 8 MB of output (page cache that
    # stays charged to the slot once written), then one that writes a tiny PDF
    m = env.manifest([*(job(f"big{i}", "write_big", priority=1, params={"mb": 8, "pdf": True})
                        for i in range(10)),
                      job("small", "write_pdf")])

    # When they run one after the other on one worker
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    assert r.wait_exit(timeout=60) == 0, r.diag()

    # Then each job's recorded peak is its own: 8 MB and a little for each big one, a few MB
    # for the small one (before: the cache of every earlier job besides, ~80 MB for the
    # small one, growing with the slot's age up to the ceiling; audit CV)
    peaks = {j: env.show(j)["attempts"][0]["peak_memory_bytes"]
             for j in (*(f"big{i}" for i in range(10)), "small")}
    assert all(8 * MB <= peaks[f"big{i}"] < 30 * MB for i in range(10)), peaks
    assert peaks["small"] < 30 * MB, peaks


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
@pytest.mark.parametrize(("params", "memory_mb", "low", "high"), [
    # (review CZ: a worker retiring for a thread left running got no discount, 142 MiB;
    # one that removed the earlier output and wrote 100 MB of its own was recorded at 60)
    ({"mb": 30, "leave_thread": True}, 300, 30, 80),
    ({"mb": 50, "write_mb": 100, "remove": True}, 400, 140, 260),
], ids=["retiring", "removes-and-writes"])
def test_a_jobs_peak_after_an_earlier_jobs_cache_is_its_own(
        env: Env, params: dict[str, Any], memory_mb: int, low: int, high: int) -> None:
    # Given, in one worker slot, a job that writes 100 MB of output (page cache charged to
    # the slot), then one that allocates (and more, as params say)
    if params.pop("remove", False):
        params["remove"] = str(env.out / "big.pdf")
    fn = "lift_then_hog" if params.pop("lift", False) else "hog"
    m = env.manifest([job("big", "write_big", priority=1, params={"mb": 100, "pdf": True}),
                      job("next", fn, memory_mb=memory_mb, max_attempts=1, params=params)])

    # When they run one after the other on one worker
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    r.wait_exit(timeout=60)

    # Then the second completes, its peak what it used, not the first's cache
    [attempt] = env.show("next")["attempts"]
    assert attempt["outcome"] == "completed", attempt
    assert low * MB <= attempt["peak_memory_bytes"] <= high * MB, attempt


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
def test_a_job_that_lifted_its_ceiling_is_judged_on_its_peak_as_read(env: Env) -> None:
    # Given a 100 MB writer, then a job that lifts its 100 MB ceiling, removes that output,
    # uses 150 MB, lets it go and writes 100 MB of scratch (cache at its end that is not
    # the earlier job's)
    m = env.manifest([job("big", "write_big", priority=1, params={"mb": 100, "pdf": True}),
                      job("next", "lift_then_hog", memory_mb=100, max_attempts=1,
                          params={"mb": 150, "scratch": str(env.root / "scratch.bin"),
                                  "scratch_mb": 100, "remove": str(env.out / "big.pdf")})])

    # When they run one after the other on one worker
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    r.wait_exit(timeout=60)

    # Then it is judged by what it used (before: completed at 48.8 MiB, the scratch taken
    # for the earlier job's cache; review DA)
    [attempt] = env.show("next")["attempts"]
    assert attempt["outcome"] == "memory", attempt
    assert attempt["peak_memory_bytes"] >= 140 * MB, attempt


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
@pytest.mark.parametrize("lift", [False, True], ids=["own-ceiling", "lifted-ceiling"])
def test_a_jobs_peak_keeps_what_it_used_of_cache_that_went_away(env: Env, lift: bool) -> None:
    # Given, in one worker slot, a job that writes 100 MB of output (page cache charged to
    # the slot), then one that removes that output and allocates 150 MB: under its own
    # 300 MB ceiling, or under a 100 MB one (it lifts its ceiling first, as root may)
    m = env.manifest([job("big", "write_big", priority=1, params={"mb": 100, "pdf": True}),
                      job("hog", "lift_then_hog" if lift else "hog",
                          memory_mb=100 if lift else 300, max_attempts=1,
                          params={"mb": 150, "remove": str(env.out / "big.pdf")})])

    # When they run one after the other on one worker
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    r.wait_exit(timeout=60)

    # Then the hog's peak is its ~150 MB (before: less the 100 MB of cache that had gone by
    # its end, ~50 MB), and one that lifted its ceiling is judged by it (before: completed,
    # "93.8 MiB"; review CY)
    [attempt] = env.show("hog")["attempts"]
    assert attempt["peak_memory_bytes"] >= 140 * MB, attempt
    if lift:
        assert attempt["outcome"] == "memory", attempt
        assert "which the job had lifted" in attempt["error"], attempt
    else:
        assert attempt["outcome"] == "completed", attempt


def freezer_v1_cell() -> Path | None:
    """A new cgroup v1 freezer group for one test, or None where there is none to write."""
    root = Path("/sys/fs/cgroup/freezer")
    if not (root / "cgroup.procs").exists():  # no v1 freezer hierarchy mounted
        return None
    cell = root / f"renderctl-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        cell.mkdir()
    except OSError:
        return None
    return cell


@pytest.fixture
def frozen_cell() -> Iterator[Path]:
    """A freezer group whose tasks are thawed, killed and the group removed at teardown."""
    cell = freezer_v1_cell()
    if cell is None:
        pytest.skip("no writable cgroup v1 freezer")
    yield cell
    pids = [int(p) for p in (cell / "cgroup.procs").read_text().split()]
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    (cell / "freezer.state").write_text("THAWED\n")  # the SIGKILLs land once thawed
    wait_until(lambda: not (cell / "cgroup.procs").read_text().split(), timeout_s=20,
               what="the frozen tasks to die once thawed")
    cell.rmdir()


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
def test_a_worker_replaced_while_its_slot_empties_gets_another_slot(env: Env,
                                                                    frozen_cell: Path) -> None:
    # Given a job whose 400 MB child outlives its worker (the worker dies of the timeout's
    # SIGTERM, the child ignores it and is frozen, so the runner's SIGKILL cannot empty the
    # slot until the test thaws it: a kill of that much memory takes tens of ms here, less
    # than a millisecond on a machine freeing huge pages, which made the race the test's),
    # then a job for the worker that replaces it
    pidfile = env.root / "child.pid"
    m = env.manifest([job("slow-to-die", "big_child_then_hang", priority=1, timeout_s=2,
                          params={"mb": 400, "pidfile": str(pidfile),
                                  "freezer": str(frozen_cell)}),
                      job("next", "sleep_then_write", params={"s": 1.5})],
                     defaults={"memory_mb": 1000, "max_attempts": 1})
    r = env.run(str(m), "--workers", "1", "--kill-grace", "0.2", "--memory-guard", "cgroup-v1")

    def cgroup_of(pid: int) -> str:
        return next(line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                    if ":memory:" in line)

    first = r.wait_event("started", "slow-to-die", timeout=20)[0]["worker"]
    wait_until(pidfile.exists, timeout_s=20, what="the child to hold its memory, frozen")
    child = int(pidfile.read_text())
    first_slot = cgroup_of(first)
    # When the timeout kills the first worker, and its successor starts the next job while
    # the child, SIGKILLed, still sits in the first slot
    second = r.wait_event("started", "next", timeout=20)[0]["worker"]
    second_slot = cgroup_of(second)
    assert cgroup_of(child) == first_slot
    (frozen_cell / "freezer.state").write_text("THAWED\n")
    assert r.wait_exit(timeout=30) == 1, r.diag()

    # Then the successor ran in a slot of its own (README: "its successor starts in another
    # slot and this one is judged later"), not in the one still being emptied: a slot
    # opened under the dead worker's name was that same cgroup, judged later while the
    # successor ran in it (and handed out again, to two workers at once, once emptied)
    assert second != first
    assert second_slot != first_slot, (first_slot, second_slot)
    assert pid_gone(child)  # the runner's SIGKILL landed once thawed
    assert env.show("slow-to-die")["attempts"][0]["outcome"] == "timeout"
    assert env.state_of("next") == ["done"], env.show("next")["attempts"]


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
def test_a_jobs_peak_does_not_count_what_the_previous_job_wrote_to_stderr(env: Env) -> None:
    # Given a job that writes 150 MB to stderr, then a small one in the same worker
    m = env.manifest([job("loud", "shout_then_write", priority=1, params={"mb": 150}),
                      job("quiet", "write_pdf")], defaults={"memory_mb": 300})

    # When they run one after the other
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    assert r.wait_exit(timeout=60) == 0, r.diag()

    # Then the small job's peak is its own (a one-page PDF: a few MB beyond the worker),
    # not the page cache of the first one's captured output
    peak = env.record("done", "quiet")["result"]["peak_memory_bytes"]
    assert peak < 60 * MB, peak / MB


@pytest.mark.parametrize("guard", [
    pytest.param("cgroup-v1", marks=pytest.mark.skipif(
        not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")),
    "sampling"])
def test_an_output_bigger_than_the_ceiling_is_checked_within_it(env: Env, guard: str) -> None:
    import hashlib

    # Given jobs that each write 300 MB of output (a PDF, and a file of another kind) 1 MB
    # at a time, holding little, under a 150 MB ceiling
    m = env.manifest([job("bigpdf", "write_big", params={"mb": 300, "pdf": True}),
                      {**job("bigbin", "write_big", params={"mb": 300}),
                       "output": "bigbin.bin"}],
                     defaults={"memory_mb": 150, "max_attempts": 1})

    # When they run
    r = env.run(str(m), "--workers", "1", "--memory-guard", guard)

    # Then both complete: renderctl's own check of the output (its hash, the PDF's pages)
    # stays within the job's ceiling (it read the file whole and was killed `memory`)
    assert r.wait_exit(timeout=120) == 0, r.diag()
    for jid, name, pages in (("bigpdf", "bigpdf.pdf", 1), ("bigbin", "bigbin.bin", None)):
        result = env.record("done", jid)["result"]
        path = env.out / name
        with open(path, "rb") as fh:
            assert result["sha256"] == hashlib.file_digest(fh, "sha256").hexdigest()
        assert result["bytes"] == path.stat().st_size > 300 * MB - 1
        assert result["pages"] == pages
        # (Under sampling, None when no sample saw the job's tree above what its worker
        # held before it: writing 1 MB at a time it need not grow at all.)
        assert (result["peak_memory_bytes"] or 0) <= 150 * MB
    assert len(PdfReader(env.out / "bigpdf.pdf").pages) == 1


ESCAPE_PLUGIN = textwrap.dedent('''
    import sys
    from renderctl.render.base import ParamSpec, RendererSpec

    SPEC = RendererSpec(kind="escape", target="escape_plugin:render", description="escapes",
                        min_inputs=0, max_inputs=0, params=(ParamSpec("mb", "int"),))


    def render(inputs, output, params):
        sys.path.insert(0, {root!r})
        from guardfns import escape_then_hog
        escape_then_hog(inputs, output, params)
''')


@pytest.mark.skipif(not cgroup_v1_writable(), reason="cgroup v1 memory controller not writable")
@pytest.mark.parametrize("kind", ["python", "plugin"])
def test_a_job_that_moves_its_worker_out_of_its_slot_is_caught_and_the_next_job_is_held(
        env: Env, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a root job (a python callable, or a plugin renderer's code, which runs in the
    # worker too: audit DL) that moves its worker out of its memory slot and then takes 300
    # MB of its 200 MB ceiling, and then a job that takes 150 MB
    escaper = job("escaper", "escape_then_hog", priority=1, params={"mb": 300})
    if kind == "plugin":
        site = env.root / "site"
        site.mkdir()
        (site / "escape_plugin.py").write_text(ESCAPE_PLUGIN.format(root=str(env.root)))
        info = site / "escape_plugin-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: escape-plugin\n"
                                       "Version: 0.1\n")
        (info / "entry_points.txt").write_text(
            "[renderctl.renderers]\nescape = escape_plugin:SPEC\n")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            [str(site), os.environ.get("PYTHONPATH", "")]))
        del escaper["callable"]
        escaper["kind"] = "escape"
    m = env.manifest([escaper, job("next", "hog", params={"mb": 150})],
                     defaults={"memory_mb": 200, "max_attempts": 1})

    # When they run on one worker
    r = env.run(str(m), "--workers", "1", "--memory-guard", "cgroup-v1")
    assert r.wait_exit(timeout=60) == 1, r.diag()

    # Then the escape is the first job's memory failure, and the next job runs in a slot
    # again: its 150 MB are charged (its peak shows them), not hidden
    (attempt,) = env.show("escaper")["attempts"]
    assert attempt["outcome"] == "memory", attempt
    assert "moved its worker out of its memory slot" in attempt["error"], attempt
    assert env.record("done", "next")["result"]["peak_memory_bytes"] >= 150 * MB


@pytest.mark.skipif(not cgroup_v1_writable() or shutil.which("unshare") is None,
                    reason="needs a writable cgroup v1 memory controller and unshare")
def test_python_jobs_run_where_the_cgroup_mount_does_not_start_at_the_root(env: Env) -> None:
    # Given a cgroup v1 memory mount whose root is our own cgroup, not the hierarchy's (as
    # in a container without a cgroup namespace: /proc/self/cgroup then shows paths the
    # mount does not), in a private mount namespace that nothing else sees
    m = env.manifest([job("py1", "write_pdf"), job("py2", "write_pdf")],
                     defaults={"max_attempts": 1})
    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().split()
               if line.split(":", 2)[1] == "memory")
    mnt = env.root / "mnt"
    mnt.mkdir()
    script = (f"mount --bind /sys/fs/cgroup/memory{own} {mnt} && "
              f"umount -l /sys/fs/cgroup/memory && mount --move {mnt} /sys/fs/cgroup/memory && "
              'exec "$@"')
    res = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                          *RENDERCTL, "run", str(m), *env.qargs(), "--workers", "1",
                          "--memory-guard", "cgroup-v1"],
                         capture_output=True, text=True, timeout=120)

    # When they run there, then they complete (a worker is not taken for one that left
    # its slot because the two views of its cgroup differ)
    assert res.returncode == 0, res.stdout + res.stderr
    assert env.ids_in("done") == {"py1", "py2"}


# -- 3. cancel ---------------------------------------------------------------------------------


def test_cancel_pending_without_a_runner(env: Env) -> None:
    times = env.root / "ran.txt"
    m = env.manifest([job("p1", "record_times", params={"file": str(times), "s": 0.01}),
                      job("p2", "record_times", params={"file": str(times), "s": 0.01})])
    env.cli("submit", str(m))
    res = env.cli("cancel", "p1")
    assert res.stdout.strip() == "p1: cancelled"
    assert env.state_of("p1") == ["cancelled"]
    assert env.record("cancelled", "p1")["reason"] == "cancelled while pending"
    # A later run never runs it (and still completes the other one)
    r = env.run("--workers", "1")
    assert r.wait_exit(timeout=30) == 0, r.diag()
    assert env.state_of("p1") == ["cancelled"] and env.state_of("p2") == ["done"]
    assert [ln.split()[0] for ln in times.read_text().splitlines()] == ["p2"]
    assert not (env.out / "p1.pdf").exists()
    assert env.show("p1")["attempts"] == []


def test_cancel_running_job_kills_it_fast_and_never_publishes(env: Env) -> None:
    m = env.manifest([job("long", "sleep_then_write", params={"s": 30})])
    r = env.run(str(m), "--workers", "1")
    r.wait_event("started", "long", timeout=20)
    assert (env.queue / "running" / "long.json").exists()
    worker_pid = r.find("started", "long")[0]["worker"]
    assert not pid_gone(worker_pid)

    t_invoked = time.monotonic()
    res = env.cli("cancel", "long")
    t_returned = time.monotonic()
    assert res.stdout.strip() == "long: cancel requested", res.stdout
    cancelled = env.queue / "cancelled" / "long.json"
    wait_until(cancelled.exists, timeout_s=5, what="cancelled/long.json")
    t_recorded = time.monotonic()
    latency = t_recorded - t_returned
    print(f"\n[cancel] record in cancelled/ {latency * 1000:.1f} ms after `renderctl cancel` "
          f"returned ({(t_recorded - t_invoked) * 1000:.0f} ms after it was invoked, "
          "interpreter start included)")
    assert latency < 1.0

    assert r.wait_exit(timeout=10) == 1
    assert env.state_of("long") == ["cancelled"]
    rec = env.show("long")
    assert [a["outcome"] for a in rec["attempts"]] == ["cancelled"]
    assert pid_gone(worker_pid)
    assert not (env.out / "long.pdf").exists()
    leftovers = sorted(p.name for p in env.out.rglob("*")) if env.out.exists() else []
    assert leftovers == [], f"temporaries left in the output root: {leftovers}"


def test_cancel_racing_a_claiming_runner(env: Env) -> None:
    n = 40
    ids = [f"r{i:02d}" for i in range(n)]
    m = env.manifest([job(j, "sleep_then_write", params={"s": 0.05}) for j in ids])
    env.cli("submit", str(m))
    doomed = ids[::2]
    r = env.run("--workers", "2")
    r.wait_event("started", timeout=20)
    res = env.cli("cancel", *doomed, "--json")
    answers = json.loads(res.stdout)
    rc = r.wait_exit(timeout=60)

    by_state = {s: env.ids_in(s) for s in STATES}
    # Exit 1 iff the runner itself cancelled something: a job `cancel` took from pending/
    # was never this runner's, and every "cancel requested" may lose to its completion.
    by_runner = [j for j in by_state["cancelled"]
                 if env.record("cancelled", j)["reason"] != "cancelled while pending"]
    assert rc == (1 if by_runner else 0), (by_runner, r.diag())
    for j in ids:
        held = [s for s in STATES if j in by_state[s]]
        assert held in (["done"], ["cancelled"]), f"{j}: {held}"
    for j in ids:
        if j in by_state["cancelled"]:
            assert j in doomed, f"{j} was never cancelled"
            assert not (env.out / f"{j}.pdf").exists(), f"cancelled {j} was published"
            assert all(a["outcome"] == "cancelled" for a in env.record("cancelled", j)["attempts"])
        else:
            assert pdf_ok(env.out / f"{j}.pdf")
            if j in doomed:  # completion won the race (committed before the request was read)
                assert answers[j] in ("already done", "cancel requested"), (j, answers[j])
    for j in doomed:
        assert answers[j] in ("cancelled", "cancel requested", "already done"), (j, answers[j])
        if answers[j] == "cancelled":  # taken from pending/ atomically: it can never run
            assert j in by_state["cancelled"], f"{j}: {answers[j]} but ended {env.state_of(j)}"
        # "cancel requested" may still lose to an attempt that had already finished
    kinds = {a: sum(1 for j in doomed if answers[j] == a) for a in set(answers.values())}
    print(f"\n[cancel race] answers {kinds}; done {len(by_state['done'])}, "
          f"cancelled {len(by_state['cancelled'])}")
    outputs = {p.name for p in env.out.iterdir()}
    assert outputs == {f"{j}.pdf" for j in by_state["done"]}, "stray files in the output root"


# -- 4. drain -----------------------------------------------------------------------------------


def test_sigterm_releases_running_jobs_without_charging_them(env: Env) -> None:
    # Attempt 1 of each sleeps 30 s. "solo" may run once; "twice" may run twice and fails
    # on attempt 2: it completes only if the released attempt was not charged.
    m = env.manifest([
        job("solo", "by_attempt", max_attempts=1, params={"plan": {"1": "sleep"}, "s": 30}),
        job("twice", "by_attempt", max_attempts=2,
            params={"plan": {"1": "sleep", "2": "fail"}, "s": 30}),
    ])
    # One job per worker, so both run at once whichever worker is ready first (the
    # dispatcher may queue both on one worker: test_idle_worker_is_not_left_idle...).
    r = env.run(str(m), "--workers", "2", "--grace", "0.5", "--max-jobs-per-worker", "1")
    r.wait_event("started", count=2, timeout=20)
    t_sig = time.monotonic()
    r.signal(signal.SIGTERM)
    rc = r.wait_exit(timeout=10)
    took = time.monotonic() - t_sig
    print(f"\n[drain] SIGTERM -> exit {rc} in {took:.2f}s (grace 0.5s)")
    assert rc == 143, r.diag()
    assert 0.5 <= took < 3.0
    for j in ("solo", "twice"):
        assert env.state_of(j) == ["pending"], (j, env.state_of(j))
        rec = env.record("pending", j)
        assert [a["outcome"] for a in rec["attempts"]] == ["released"], rec["attempts"]
        assert rec["lease"] is None
    assert not any((env.out / f"{j}.pdf").exists() for j in ("solo", "twice"))

    # A later run finishes both: the released attempt cost nothing
    r2 = env.run("--workers", "2", "--backoff-base", "0")
    assert r2.wait_exit(timeout=30) == 0, r2.diag()
    solo, twice = env.show("solo"), env.show("twice")
    assert solo["state"] == "done" and twice["state"] == "done", (solo, twice)
    assert [a["outcome"] for a in solo["attempts"]] == ["released", "completed"]
    assert [a["outcome"] for a in twice["attempts"]] == ["released", "failed", "completed"]
    assert pdf_ok(env.out / "solo.pdf") and pdf_ok(env.out / "twice.pdf")


def test_sigterm_lets_a_short_job_finish_within_the_grace(env: Env) -> None:
    m = env.manifest([job("short", "sleep_then_write", params={"s": 1.0})])
    r = env.run(str(m), "--workers", "1", "--grace", "10")
    r.wait_event("started", "short", timeout=20)
    r.signal(signal.SIGTERM)
    assert r.wait_exit(timeout=10) == 143, r.diag()
    assert env.state_of("short") == ["done"]
    assert [a["outcome"] for a in env.show("short")["attempts"]] == ["completed"]
    assert pdf_ok(env.out / "short.pdf")


@pytest.mark.parametrize("again", [signal.SIGTERM, signal.SIGHUP])
def test_the_same_stop_signal_again_at_once_is_the_same_stop(env: Env, again: int) -> None:
    # Given a run with a job running
    m = env.manifest([job("short", "sleep_then_write", params={"s": 1.5})])
    r = env.run(str(m), "--workers", "1", "--grace", "20")
    r.wait_event("started", "short", timeout=20)
    # When SIGTERM arrives, and again (or SIGHUP) once the runner has taken the first (as
    # `timeout` passes one on twice: to its child and to the group, the kernel merging two
    # only if the first is still pending; as systemd's SendSIGHUP=yes follows SIGTERM)
    from renderctl.runner import SAME_STOP_S

    t_first = time.monotonic()
    r.signal(signal.SIGTERM)
    r.wait_event("stopping", timeout=5)
    if time.monotonic() - t_first > SAME_STOP_S * 0.75:
        pytest.skip("the machine took too long to report the first signal")
    r.signal(again)
    # Then the grace holds: the job finishes, and one stop was reported
    assert r.wait_exit(timeout=20) == 143, r.diag()
    assert env.state_of("short") == ["done"], r.diag()
    assert [e.get("again") for e in r.find("stopping")] == [None], r.diag()
    assert pdf_ok(env.out / "short.pdf")


def test_second_sigint_skips_the_grace(env: Env) -> None:
    plan = {"plan": {"1": "sleep"}, "s": 60}
    m = env.manifest([job("first", "by_attempt", params=plan),
                      job("second", "by_attempt", params=plan)])
    r = env.run(str(m), "--workers", "1", "--max-jobs-per-worker", "1", "--grace", "30")
    r.wait_event("started", "first", timeout=20)
    t_first = time.monotonic()
    r.signal(signal.SIGINT)
    r.wait_event("stopping", timeout=5)
    assert r.proc.poll() is None, "the first signal must wait for the grace"
    from renderctl.runner import SAME_STOP_S

    # (the same signal sooner would be the same stop: see the next test)
    time.sleep(max(0.0, t_first + SAME_STOP_S + 0.1 - time.monotonic()))
    t_second = time.monotonic()
    r.signal(signal.SIGINT)
    rc = r.wait_exit(timeout=10)
    took = time.monotonic() - t_second
    print(f"\n[drain] second SIGINT -> exit {rc} in {took:.2f}s (grace was 30s)")
    assert rc == 130, r.diag()
    assert took < 2.0
    # And the run said why its job was killed before the grace was out (before: nothing,
    # and a run's jobs killed 10 s into a 30 s grace were a mystery: audit BM)
    r._reader.join(timeout=5)
    said = [{k: e.get(k) for k in ("signal", "grace_s", "again", "running")}
            for e in r.find("stopping")]
    assert said == [{"signal": "SIGINT", "grace_s": 30.0, "again": None, "running": 1},
                    {"signal": "SIGINT", "grace_s": 0.0, "again": True, "running": 1}], said
    assert env.state_of("first") == ["pending"] and env.state_of("second") == ["pending"]
    assert [a["outcome"] for a in env.record("pending", "first")["attempts"]] == ["released"]
    assert env.record("pending", "second")["attempts"] == []


# -- 5. memory-aware admission ---------------------------------------------------------------


def max_overlap(spans: Sequence[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                    key=lambda p: (p[0], p[1]))  # an end at t sorts before a start at t
    cur = best = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def test_admission_keeps_running_ceilings_within_the_budget(env: Env) -> None:
    times = env.root / "times.txt"
    jobs = [job("huge", "write_pdf", memory_mb=5000)]
    jobs += [job(f"a{i}", "record_times", memory_mb=400, params={"file": str(times), "s": 0.5})
             for i in range(6)]
    m = env.manifest(jobs)
    r = env.run(str(m), "--workers", "3", "--memory-budget", "1000")
    assert r.wait_exit(timeout=60) == 1, r.diag()

    spans = {}
    for line in times.read_text().splitlines():
        jid, start, end = line.split()
        spans[jid] = (float(start), float(end))
    assert sorted(spans) == [f"a{i}" for i in range(6)]
    overlap = max_overlap(list(spans.values()))
    print(f"\n[admission] max concurrent 400 MB jobs under a 1000 MB budget: {overlap}")
    assert overlap <= 2
    assert overlap == 2, "the budget has room for two: they should overlap"
    assert all(env.state_of(f"a{i}") == ["done"] for i in range(6))

    huge = env.show("huge")
    assert huge["state"] == "dead", huge
    assert huge["attempts"] == []
    assert "1000 MB" in huge["reason"] and "budget" in huge["reason"], huge["reason"]
    assert huge["lease"] is None
    dead_ev = r.find("dead", "huge")
    assert dead_ev and "1000 MB" in dead_ev[0].get("reason", "")
    # At once: before any admitted job had even started
    assert env.record("dead", "huge")["changed_at"] < min(s for s, _ in spans.values())
    assert not (env.out / "huge.pdf").exists()


# -- bugs: scheduling and cancel of a claimed job, a tree that leaves its group -----------------


def test_idle_worker_is_not_left_idle_while_a_job_waits(env: Env) -> None:
    # Given two workers, one 4 s job and two 0.2 s jobs claimed after it (priority makes
    # the order certain: see test_claim_order_follows_acceptance_order_at_runner_start)
    times = env.root / "times.txt"
    m = env.manifest([job("long", "record_times", priority=1,
                          params={"file": str(times), "s": 4}),
                      job("s1", "record_times", params={"file": str(times), "s": 0.2}),
                      job("s2", "record_times", params={"file": str(times), "s": 0.2})])
    r = env.run(str(m), "--workers", "2")
    assert r.wait_exit(timeout=30) == 0, r.diag()
    spans = {ln.split()[0]: (float(ln.split()[1]), float(ln.split()[2]))
             for ln in times.read_text().splitlines()}
    workers = {e["job"]: e["worker"] for e in r.find("started")}
    print(f"\n[dispatch] workers {workers}; short jobs started "
          f"{[round(spans[j][0] - spans['long'][0], 2) for j in ('s1', 's2')]}s after long")
    # Then both short jobs run on the other worker while the long one runs
    for j in ("s1", "s2"):
        assert spans[j][0] < spans["long"][1], f"{j} waited behind the long job"


def test_cancel_of_a_claimed_job_queued_behind_a_long_one_is_prompt(env: Env) -> None:
    # Given one worker running a 6 s job, with the next job claimed (running/) behind it
    # (prefetch 2: as the runner does by itself for short jobs)
    m = env.manifest([job("long", "sleep_then_write", params={"s": 6}),
                      job("next", "sleep_then_write", params={"s": 0.1})])
    r = env.run(str(m), "--workers", "1", "--prefetch", "2")
    r.wait_event("started", "long", timeout=20)
    assert env.state_of("next") == ["running"], env.state_of("next")
    status = json.loads(env.cli("status", "--json").stdout)
    assert "next" in {j["id"] for j in status["running_jobs"]}
    # When it is cancelled
    res = env.cli("cancel", "next")
    t_returned = time.monotonic()
    assert res.stdout.strip() == "next: cancel requested"
    # Then the cancel is recorded within 1 s, as for any running job
    wait_until((env.queue / "cancelled" / "next.json").exists, timeout_s=1.0,
               what="cancelled/next.json")
    print(f"\n[cancel queued] recorded after {(time.monotonic() - t_returned) * 1000:.0f} ms")
    assert r.wait_exit(timeout=15) == 1
    assert env.state_of("next") == ["cancelled"] and env.state_of("long") == ["done"]


TREE_GUARDS = [
    pytest.param("cgroup-v1", id="cgroup-v1",
                 marks=pytest.mark.skipif(not cgroup_v1_writable(),
                                          reason="cgroup v1 memory controller not writable")),
    pytest.param("sampling", id="sampling"),
]


@pytest.mark.parametrize("guard", TREE_GUARDS)
def test_timeout_leaves_no_survivor_that_left_the_process_group(env: Env, guard: str) -> None:
    pidfile = env.root / "grandchildren.txt"
    m = env.manifest([job("daemonizer", "ignore_term_with_grandchild", timeout_s=1,
                          max_attempts=1,
                          params={"pidfile": str(pidfile), "new_session": True})])
    r = env.run(str(m), "--workers", "1", "--kill-grace", "0.5", "--memory-guard", guard)

    def pids() -> list[int]:
        return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []

    try:
        r.wait_event("started", "daemonizer", timeout=20)
        gc = wait_until(lambda: pids() and pids()[0], timeout_s=10, what="the grandchild's pid")
        assert not pid_gone(gc) and os.getpgid(gc) == gc  # alive, in a session of its own
        ev = r.wait_event("dead", "daemonizer", timeout=10)[0]
        assert ev["outcome"] == "timeout", ev
        assert r.wait_exit(timeout=10) == 1
        # The job's whole tree is gone within 2 s of the attempt being recorded
        wait_until(lambda: pid_gone(gc) and not proctree.group_alive(gc),
                   timeout_s=max(0.0, ev["_seen"] + 2 - time.monotonic()),
                   what=f"grandchild {gc} (setsid) to be gone")
    finally:
        kill_leftovers(pids())


def test_claim_order_follows_acceptance_order_at_runner_start(env: Env) -> None:
    ids = [f"j{i}" for i in range(8)]
    m = env.manifest([job(j, "write_pdf") for j in ids])
    r = env.run(str(m), "--workers", "1")
    assert r.wait_exit(timeout=30) == 0, r.diag()
    order = [e["job"] for e in r.find("started")]
    print(f"\n[order] accepted {ids}, started {order}")
    assert order == ids


@pytest.mark.parametrize("guard", GUARDS_CHILD)
def test_a_ceiling_below_a_workers_own_footprint_dead_letters_and_the_run_goes_on(
        env: Env, guard: str) -> None:
    # Given a job whose 1 MB ceiling no Python process fits under (it lasts long enough
    # for the sampling guard to look), then an ordinary job
    # (One attempt: a second may run in the worker that ran `after`, whose own pages are
    # then held in its slot, not charged to the job: it fitted, and the test failed under
    # load; seen twice in CI on 2026-12-05)
    m = env.manifest([job("tiny", "sleep_then_write", memory_mb=1, max_attempts=1,
                          params={"s": 0.5}),
                      job("after", "write_pdf")])

    # When one worker runs both (a fork server's: a worker forked from the runner itself
    # shares nearly all its pages with it, charged to the runner, and does fit)
    r = env.run(str(m), "--workers", "1", "--memory-guard", guard, "--backoff-base", "0.05",
                "--start-method", "forkserver")

    # Then the tiny one is dead, its attempt a `memory` outcome, and the next job completes
    # (the slot it poisoned was not reused: no worker died before ready)
    assert r.wait_exit(timeout=60) == 1, r.diag()
    tiny = env.show("tiny")
    assert tiny["state"] == "dead", tiny
    assert [a["outcome"] for a in tiny["attempts"]] == ["memory"], tiny["attempts"]
    assert env.state_of("after") == ["done"]
    assert pdf_ok(env.out / "after.pdf")
