"""`renderctl top`: attached to a live runner in a pseudo-terminal, and without a runner."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from pathlib import Path

from clihelp import RENDERCTL, cli, env, job, poll, write_jobs


def read_pty_until(fd: int, needle: bytes, *, timeout_s: float = 20) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout_s
    while needle not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never appeared; got {buf[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the other side closed
                break
            buf += chunk
    return buf


def test_top_shows_the_running_job_and_leaves_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    # Given a runner busy with a long job
    manifest = write_jobs(tmp_path / "m", [job("long-sleeper", "sleep", params={"s": "60"})])
    q, out = tmp_path / "q", tmp_path / "out"
    runner = subprocess.Popen([*RENDERCTL, "run", str(manifest), "--queue", str(q), "--out",
                               str(out), "-j", "1", "--grace", "0"], cwd=tmp_path, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        def sleeper_in_snapshot() -> bool:
            try:
                state = json.loads((q / "runner.state.json").read_text())
            except (OSError, ValueError):
                return False
            return any(j["id"] == "long-sleeper" for j in state["running"])

        poll(sleeper_in_snapshot, what="the runner's snapshot to show the job running")
        # When `top` runs on a terminal
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
        top_env = {**env(), "TERM": "xterm-256color"}
        top_env.pop("NO_COLOR")
        top = subprocess.Popen([*RENDERCTL, "top", "--queue", str(q)], cwd=tmp_path,
                               env=top_env, stdin=slave, stdout=slave,
                               stderr=subprocess.PIPE, close_fds=True)
        os.close(slave)
        try:
            # Then it shows the running job, its runner and workers
            screen = read_pty_until(master, b"long-sleeper")
            screen += read_pty_until(master, b"alive")
            assert b"\x1b[" in screen  # a live, styled view
            # And Ctrl-C leaves it quietly with exit 0
            top.send_signal(signal.SIGINT)
            assert top.wait(timeout=10) == 0
            assert top.stderr is not None and b"Traceback" not in top.stderr.read()
        finally:
            if top.poll() is None:
                top.kill()
            os.close(master)
    finally:
        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)
    # With no runner left, `top --once` says so and still shows the counts
    once = cli("top", "--queue", q, "--once", cwd=tmp_path)
    assert once.returncode == 0, once.stderr
    assert "no runner is alive" in once.stdout
    assert "pending 1" in once.stdout  # released on SIGTERM, not lost
    assert "\x1b[" not in once.stdout  # plain text on a pipe
