"""Whether a job queued in a worker still starts there: the worker's decision or the
runner's, never both (see Runner._rebalance).

The runner queues short jobs in a worker behind the running one (prefetch). When that one
turns out long, the runner takes the queued jobs back for an idle worker; but the worker
reads its pipe only between jobs, so a message cannot stop it. Instead, each worker has a
16-byte file, read and written under flock: the highest job number it has started, and the
highest number the runner has revoked. The worker checks and records a start in one locked
step (four syscalls, ~5 us per job); the runner revokes everything not yet started in one
locked step, and learns exactly which jobs did start. So a job taken back never executes
in the first worker, and a started one is never taken back: no attempt runs twice.
A worker killed while holding the lock releases it with its descriptor. One stopped while
holding it (a SIGSTOP, a debugger attaching) keeps it: the runner therefore never waits for
the lock, it tries again later (a blocking revoke froze its whole loop for good)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct

from renderctl.fsutil import unlink_quiet, with_name

_LAYOUT = struct.Struct("<qq")  # started, revoked


class StartGate:
    def __init__(self, path: str, *, create: bool = False) -> None:
        self.path = path
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
        self.fd = os.open(path, flags, 0o600)
        if create:
            try:
                os.pwrite(self.fd, _LAYOUT.pack(0, 0), 0)
            except OSError as exc:
                os.close(self.fd)
                unlink_quiet(path)
                raise with_name(exc, path) from None

    def start(self, seq: int) -> bool:
        """Worker side: record that job ``seq`` starts now; False if it was revoked."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            _, revoked = _LAYOUT.unpack(os.pread(self.fd, _LAYOUT.size, 0))
            if seq <= revoked:
                return False
            os.pwrite(self.fd, _LAYOUT.pack(seq, revoked), 0)
            return True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def revoke(self, upto: int) -> int | None:
        """Runner side: revoke every job numbered up to ``upto`` that has not started;
        returns the highest number that had (those stay with the worker), or None, having
        revoked nothing, while the worker holds the lock (it is starting a job: ~5 us, or
        for good if it was stopped right then)."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            started, revoked = _LAYOUT.unpack(os.pread(self.fd, _LAYOUT.size, 0))
            os.pwrite(self.fd, _LAYOUT.pack(started, max(revoked, upto)), 0)
            return int(started)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
