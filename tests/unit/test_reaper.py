"""The reaper on real processes: a "worker" deaf to every catchable signal, with a child
that left its session, is killed with that child once the runner's end of the pipe closes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from renderctl.proctree import pid_alive, set_child_subreaper
from renderctl.reaper import Reaper

DEAF_WORKER = """
import os, signal, subprocess, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
daemon = subprocess.Popen(["sleep", "60"], start_new_session=True)
# A child with a child of its own: killed first, it would hand the grandchild to us (a
# subreaper), so the reaper cannot go by who the grandchild's parent is when it kills it.
shell = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                         text=True)
print(daemon.pid, shell.pid, int(shell.stdout.readline()), flush=True)
time.sleep(60)
"""


def wait_gone(pids: list[int], timeout_s: float = 2.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if pid_alive(p)]
        if not left:
            return []
        time.sleep(0.01)
    return [p for p in pids if pid_alive(p)]


def test_the_reaper_kills_a_watched_workers_tree_when_the_pipe_closes() -> None:
    # Given a reaper watching a worker that blocks every signal and has a setsid child (the
    # worker is a subreaper, as real workers are, so the child stays in its tree)
    reaper = Reaper.start()
    worker = subprocess.Popen([sys.executable, "-c", DEAF_WORKER], stdout=subprocess.PIPE,
                              text=True, preexec_fn=set_child_subreaper)
    try:
        assert worker.stdout is not None
        tree = [int(pid) for pid in worker.stdout.readline().split()]
        reaper.watch(worker.pid)

        # When the runner's end closes (as the kernel does when the runner dies)
        reaper.close()

        # Then the worker and all of its tree are gone (not left stopped), and the reaper
        # has exited
        assert wait_gone(tree) == []
        assert worker.wait(timeout=2) == -signal.SIGKILL
        assert reaper.proc.returncode == 0
    finally:
        for pid in (worker.pid,):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        worker.wait()
        for pid in locals().get("tree", []):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_reaper_whose_workers_all_exited_leaves_when_the_runner_closes_it() -> None:
    # Given a reaper told of a worker that has since exited normally
    reaper = Reaper.start()
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    reaper.watch(done.pid)
    assert done.wait(timeout=10) == 0

    # When the runner closes it, then it exits at once (close() waits at most 5 s, then
    # kills it: a return code of 0 says it left by itself)
    t0 = time.monotonic()
    reaper.close()
    assert reaper.proc.returncode == 0
    assert time.monotonic() - t0 < 2
