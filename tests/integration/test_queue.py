"""The directory queue through its Python API: submit, status, claim/finish, cancel, dead."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import renderctl
from renderctl.clock import FakeClock
from renderctl.errors import ExitCode, JobNotFound, ManifestError, Saturated
from renderctl.lifecycle import State
from renderctl.manifest import jobs_from_dicts, load_manifests
from renderctl.policy import ClaimIndex
from renderctl.store import (
    FREE_PREFIX,
    LEASE_XATTR,
    UNKNOWN_HOLDER,
    Holder,
    JobRecord,
    Queue,
    Transition,
    read_lease,
)

HOLDER = Holder("test-host", "boot-1", os.getpid(), None)


def pyjob(jid: str, **extra: Any) -> dict[str, Any]:
    return {"id": jid, "kind": "python", "callable": "m:f", "output": f"o/{jid}.pdf", **extra}


def files(q: Queue, folder: str | State) -> list[str]:
    return sorted(os.listdir(q.dir(folder)))


def events(q: Queue) -> list[dict[str, Any]]:
    return list(q.events)


def claim_all(q: Queue, *, limit: int = 1000) -> tuple[list[Any], list[JobRecord]]:
    index = ClaimIndex()
    q.load_index(index)
    return q.claim(index, holder=HOLDER, lease_s=60, limit=limit, token_prefix="t")


@pytest.fixture
def q(queue_dir: Path) -> Queue:
    return Queue(queue_dir)


def submit(q: Queue, jobs: list[dict[str, Any]], tmp_path: Path, **kw: Any) -> Any:
    return q.submit(jobs, base=tmp_path, out_root=tmp_path / "out", **kw)


# -- submit --------------------------------------------------------------------------------


def test_submit_writes_one_file_per_job_into_pending(q: Queue, tmp_path: Path) -> None:
    # When two jobs are submitted through the public API
    res = renderctl.Queue(q.path).submit([pyjob("a"), pyjob("b", priority=2)], base=tmp_path,
                                         out_root=tmp_path / "out")
    # Then each is one readable record in pending/, and acceptance is in the log
    assert res.accepted == ("a", "b") and res.already == ()
    assert files(q, State.PENDING) == ["a.json", "b.json"]
    rec = q.read_record(q.record_path(State.PENDING, "b"))
    assert (rec.spec.id, rec.spec.priority, rec.spec.out_root) == ("b", 2, str(tmp_path / "out"))
    assert rec.attempts == () and rec.lease is None
    assert [e["job"] for e in events(q) if e["event"] == "accepted"] == ["a", "b"]
    # And nothing is left in tmp/, and the journal holds only the runner's doorbell
    assert files(q, "tmp") == []
    assert all(n.endswith(".new") for n in files(q, "journal"))


@pytest.mark.parametrize("n", [1, 5])
def test_a_doorbell_names_the_new_jobs_without_their_records(q: Queue, tmp_path: Path,
                                                             n: int) -> None:
    # Given jobs with big params (one alone, or a batch through the journal)
    big = {f"part{k}": "x" * 10_000 for k in range(20)}
    submit(q, [pyjob(f"j{i}", params=big, priority=i) for i in range(n)], tmp_path)
    # Then the runner's doorbell is small: the records are in pending/ only (the whole batch
    # kept as the doorbell until a runner came doubled the queue on disk; audit CF)
    bells = files(q, "journal")
    assert len(bells) == 1 and bells[0].endswith(".new")
    assert (q.dir("journal") / bells[0]).stat().st_size < 200 * n
    # And a runner indexes from it every job, ordered as their records say
    index = ClaimIndex()
    assert q.poll_new(index) == n
    claims, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=n, token_prefix="t")
    assert [c.job_id for c in claims] == [f"j{i}" for i in reversed(range(n))]
    assert claims[0].record.spec.params == big


def test_queue_folders_are_private(q: Queue) -> None:
    assert stat.S_IMODE(q.path.stat().st_mode) == 0o700
    for name in [s.value for s in State] + ["corrupt", "tmp"]:
        assert stat.S_IMODE(q.dir(name).stat().st_mode) == 0o700, name


def test_same_spec_again_is_a_no_op(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    before = q.read_record(q.record_path(State.PENDING, "a"))
    res = submit(q, [pyjob("a"), pyjob("b")], tmp_path)
    assert res.accepted == ("b",) and res.already == ("a",)
    assert q.read_record(q.record_path(State.PENDING, "a")) == before


def test_different_spec_is_an_error_naming_the_id(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    with pytest.raises(ManifestError) as info:
        submit(q, [pyjob("a", priority=9), pyjob("new")], tmp_path)
    [p] = info.value.problems
    assert p.job == "a" and "different spec" in p.message and "--replace" in p.message
    # all or nothing: the good job of the same call was not enqueued either
    assert files(q, State.PENDING) == ["a.json"]


def test_replace_replaces(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    res = submit(q, [pyjob("a", priority=9)], tmp_path, replace=True)
    assert res.replaced == ("a",) and res.accepted == ()
    assert q.get("a").record.spec.priority == 9
    assert files(q, State.PENDING) == ["a.json"]


@pytest.mark.parametrize("before, after", [(1, True), (0, False), (1, 1.0), ([0], [False])])
def test_params_that_differ_only_in_json_type_are_a_different_spec(
        q: Queue, tmp_path: Path, before: Any, after: Any) -> None:
    # Given a python job accepted with params {x = <before>}
    submit(q, [pyjob("a", params={"x": before})], tmp_path)

    # When it is submitted with {x = <after>}, equal in Python (true == 1 == 1.0), not in
    # JSON, and what its callable sees
    with pytest.raises(ManifestError) as info:
        submit(q, [pyjob("a", params={"x": after})], tmp_path)

    # Then it is a different spec (it was "already accepted", the change dropped), and
    # --replace replaces it
    assert "different spec (differs in params)" in info.value.problems[0].message
    res = submit(q, [pyjob("a", params={"x": after})], tmp_path, replace=True)
    assert res.replaced == ("a",)
    assert repr(q.get("a").record.spec.params["x"]) == repr(after)
    assert submit(q, [pyjob("a", params={"x": after})], tmp_path).already == ("a",)


def test_replace_of_a_finished_job_moves_it_back_to_pending(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    [c], _ = claim_all(q)
    q.finish([Transition(c.record, State.DONE)])
    submit(q, [pyjob("a", priority=1)], tmp_path, replace=True)
    assert q.get("a").state is State.PENDING
    assert files(q, State.DONE) == []


def test_a_running_job_cannot_be_replaced(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    claim_all(q)
    with pytest.raises(ManifestError, match="is running; cancel it before replacing it"):
        submit(q, [pyjob("a", priority=1)], tmp_path, replace=True)


def test_max_pending_rejects_the_whole_submit(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob(f"old{i}") for i in range(3)], tmp_path)
    with pytest.raises(Saturated) as info:
        submit(q, [pyjob(f"new{i}") for i in range(3)], tmp_path, max_pending=5)
    exc = info.value
    assert exc.exit_code == ExitCode.TEMPFAIL == 75
    assert (exc.requested, exc.pending, exc.max_pending, exc.would_fit) == (3, 3, 5, 2)
    assert "2 would fit" in str(exc) and "nothing was enqueued" in str(exc)
    assert q.count(State.PENDING) == 3 and files(q, "tmp") == []
    # exactly at the limit is fine; jobs already accepted do not count again
    res = submit(q, [pyjob("old0"), pyjob("new0"), pyjob("new1")], tmp_path, max_pending=5)
    assert res.accepted == ("new0", "new1") and q.count(State.PENDING) == 5
    # a resubmit adding nothing is a no-op even with pending above a lowered limit
    res = submit(q, [pyjob("old0"), pyjob("new0")], tmp_path, max_pending=4)
    assert res.accepted == () and res.already == ("old0", "new0")


def test_a_job_returned_unrun_logs_released_without_its_last_attempts_outcome(
        q: Queue, tmp_path: Path) -> None:
    # Given a job whose first attempt failed, claimed again
    submit(q, [pyjob("a")], tmp_path)
    [c], _ = claim_all(q)
    q.finish([Transition(replace(c.record, attempts=({"n": 1, "outcome": "failed"},),
                                 lease=None, not_before=0.0), State.PENDING)])
    [c], _ = claim_all(q)

    # When the runner hands it back before it started (a drain, a halt)
    q.finish([Transition(replace(c.record, lease=None, reason="released before it started"),
                         State.PENDING, unrun=True)])

    # Then the log says "released", and does not repeat the failed attempt as news (the
    # metrics fold each event's outcome into attempts_total: it was counted twice)
    last = events(q)[-1]
    assert last["event"] == "released" and last["job"] == "a", last
    assert "outcome" not in last and "attempt" not in last and "retry_at" not in last


def test_status_counts_every_state(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob(f"j{i}") for i in range(6)], tmp_path)
    index = ClaimIndex()
    q.load_index(index)
    claims, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=3, token_prefix="t")
    q.finish([Transition(claims[0].record, State.DONE),
              Transition(claims[1].record, State.DEAD)])
    assert q.cancel_pending(index.pop(now=q.clock.wall()).job_id)
    st = q.status()
    assert dict(st.counts) == {"pending": 2, "running": 1, "done": 1, "dead": 1,
                               "cancelled": 1, "expired": 0}
    assert [r.spec.id for r in st.running] == [claims[2].job_id]
    assert st.corrupt == 0 and st.runner is None
    assert st.oldest_pending_age_s is not None and st.oldest_pending_age_s >= 0


def test_get_unknown_id(q: Queue) -> None:
    assert q.find("nope") is None
    with pytest.raises(JobNotFound, match="no job 'nope'"):
        q.get("nope")


def test_toml_nan_is_rejected_like_json_nan(q: Queue, tmp_path: Path) -> None:
    # nan != nan would also make every resubmit look like a different spec.
    path = tmp_path / "nan.toml"
    path.write_text('[[jobs]]\nid = "a"\nkind = "python"\ncallable = "m:f"\noutput = "a.pdf"\n'
                    "params = { x = nan }\n")
    with pytest.raises(ManifestError, match=r"job a: params\.x: nan and inf"):
        load_manifests([path], out_root=tmp_path / "out")
    assert q.count(State.PENDING) == 0


# -- corrupt files are quarantined, never deleted --------------------------------------------

def _record_with(**fields: Any) -> bytes:
    """A record of job x, well-formed JSON of the right version, with ``fields`` replaced."""
    [spec] = jobs_from_dicts([pyjob("x")], base=".", out_root="out")
    rec = JobRecord(spec=spec, seq="1", accepted_at=0.0).to_json()
    return json.dumps({**rec, **fields}).encode()


CORRUPT = {
    "empty": b"",
    "truncated": b'{"v": 1, "spec": {"id": "x"',
    "not-utf8": b"\xff\xfe\x00garbage",
    "wrong-shape": b"[1, 2, 3]",
    "wrong-version": b'{"v": 99}',
    "missing-spec-fields": b'{"v": 1, "spec": {"id": "x"}, "seq": "1", "accepted_at": 0}',
    # Valid JSON whose fields have the wrong types: read back, each crashed a later step
    # (`run`, `show`, `cancel`, `dead list`) with a traceback instead of being quarantined.
    "attempts-not-objects": _record_with(attempts=["x", 3]),
    "result-not-object": _record_with(result="path"),
}


def assert_quarantined(q: Queue, folder: str, job_id: str, content: bytes) -> None:
    assert f"{job_id}.json" not in files(q, folder)
    [moved] = files(q, "corrupt")
    assert moved.startswith(f"{folder}.{job_id}.json.")
    assert (q.dir("corrupt") / moved).read_bytes() == content
    [ev] = [e for e in events(q) if e["event"] == "corrupt"]
    assert ev["file"] == f"{folder}/{job_id}.json" and ev["moved_to"] == moved
    assert ev["reason"].startswith("unparseable")


@pytest.mark.parametrize("content", CORRUPT.values(), ids=CORRUPT.keys())
def test_find_quarantines_a_corrupt_pending_file(q: Queue, content: bytes) -> None:
    (q.dir(State.PENDING) / "x.json").write_bytes(content)
    assert q.find("x") is None
    assert_quarantined(q, "pending", "x", content)
    assert q.status().corrupt == 1


@pytest.mark.parametrize("content", CORRUPT.values(), ids=CORRUPT.keys())
def test_status_quarantines_a_corrupt_running_file(q: Queue, content: bytes) -> None:
    (q.dir(State.RUNNING) / "x.json").write_bytes(content)
    st = q.status()
    assert st.running == ()
    assert_quarantined(q, "running", "x", content)


def test_a_torn_read_of_a_recycled_record_file_never_moves_the_jobs_next_record(
        q: Queue, tmp_path: Path) -> None:
    # Given x's live record in running/ (its next claim), and bytes a reader in another
    # process read from x's previous record file while the runner refilled it (torn)
    submit(q, [pyjob("x")], tmp_path)
    index = ClaimIndex()
    q.load_index(index)
    q.claim(index, holder=HOLDER, lease_s=60, limit=1, token_prefix="t")
    live = q.record_path(State.RUNNING, "x")
    old_inode = (os.stat(live).st_dev, os.stat(live).st_ino + 1)  # not the live file's

    # When that reader judges what it read unparseable
    q.quarantine(live, "unparseable: torn", inode=old_inode)

    # Then the live record stays where it is: only the file that was read may be moved
    assert live.exists() and files(q, "corrupt") == []
    assert q.find("x") is not None and q.find("x").state is State.RUNNING


def test_find_does_not_answer_with_another_jobs_record(q: Queue, tmp_path: Path) -> None:
    # Given pending/x.json holding y's record
    submit(q, [pyjob("y")], tmp_path)
    os.rename(q.record_path(State.PENDING, "y"), q.record_path(State.PENDING, "x"))

    # Then x is not found as y; the misfiled record is reported and kept (a recycled file,
    # whose path names another file by the time it is judged, would be left alone: see
    # the torn-read test above)
    assert q.find("x") is None
    [moved] = files(q, "corrupt")
    assert moved.startswith("pending.x.json.")


def test_load_index_quarantines_and_skips(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("good")], tmp_path)
    (q.dir(State.PENDING) / "bad.json").write_bytes(b"{")
    index = ClaimIndex()
    assert q.load_index(index) == 1 and "good" in index
    assert_quarantined(q, "pending", "bad", b"{")


def test_claim_quarantines_a_file_corrupted_after_indexing(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a"), pyjob("b")], tmp_path)
    index = ClaimIndex()
    q.load_index(index)
    q.record_path(State.PENDING, "a").write_bytes(b"\x00" * 64)  # e.g. a torn write
    claims, expired = q.claim(index, holder=HOLDER, lease_s=60, limit=5, token_prefix="t")
    assert [c.job_id for c in claims] == ["b"] and expired == []
    assert_quarantined(q, "pending", "a", b"\x00" * 64)


def test_a_deeply_nested_corrupt_record_is_quarantined(q: Queue) -> None:
    (q.dir(State.PENDING) / "x.json").write_bytes(b"[" * 100_000)
    assert q.find("x") is None
    assert files(q, "corrupt")


def test_two_corrupt_copies_of_one_name_are_both_kept(queue_dir: Path) -> None:
    q = Queue(queue_dir, clock=FakeClock())  # both quarantines in the same wall second
    for content in (b"first", b"second"):
        (q.dir(State.PENDING) / "x.json").write_bytes(content)
        assert q.find("x") is None
    kept = sorted((q.dir("corrupt") / n).read_bytes() for n in files(q, "corrupt"))
    assert kept == [b"first", b"second"]


# -- claim and finish ------------------------------------------------------------------------


def test_claim_finish_round_trip(queue_dir: Path, tmp_path: Path) -> None:
    clock = FakeClock()
    q = Queue(queue_dir, clock=clock)
    submit(q, [pyjob("low"), pyjob("high", priority=5), pyjob("mid", priority=1)], tmp_path)
    # Given an index loaded from pending/
    index = ClaimIndex()
    assert q.load_index(index) == 3
    assert not any(n.endswith(".new") for n in files(q, "journal"))  # doorbells taken
    # When two jobs are claimed
    claims, expired = q.claim(index, holder=HOLDER, lease_s=60, limit=2, token_prefix="t")
    # Then the highest priorities come first, each moved to running/ with its lease
    assert [c.job_id for c in claims] == ["high", "mid"] and expired == []
    assert files(q, State.RUNNING) == ["high.json", "mid.json"]
    assert files(q, State.PENDING) == ["low.json"]
    lease = claims[0].lease
    ms = round(clock.wall() * 1000)
    assert (lease.holder, lease.token, lease.attempt) == (HOLDER, f"t:high:1:{ms}", 1)
    assert (lease.claimed_at, lease.expires_at) == (clock.wall(), clock.wall() + 60)
    assert q.read_record(q.record_path(State.RUNNING, "high")) == claims[0].record
    assert q.holds(claims[0])
    # When they finish, one done and one back to pending for a retry
    done = replace(claims[0].record, attempts=({"n": 1, "outcome": "completed"},),
                   result={"path": "x"}, lease=None)
    retry = replace(claims[1].record, attempts=({"n": 1, "outcome": "failed"},),
                    not_before=clock.wall() + 30, lease=None)
    q.finish([Transition(done, State.DONE), Transition(retry, State.PENDING)])
    # Then the folders and the log say so
    assert files(q, State.DONE) == ["high.json"]
    assert files(q, State.PENDING) == ["low.json", "mid.json"]
    assert files(q, State.RUNNING) == []
    # And the running copies were kept as spare inodes for later records, leases removed
    spare = files(q, "tmp")
    assert len(spare) == 2 and all(n.startswith(FREE_PREFIX) for n in spare)
    assert all(read_lease(q.dir("tmp") / n) is None for n in spare)
    assert not q.holds(claims[0])
    assert [(e["event"], e["job"]) for e in events(q)][-4:] == [
        ("claimed", "high"), ("claimed", "mid"), ("completed", "high"), ("retry", "mid")]
    # And the retried job waits for its not_before; its next claim is attempt 2
    index = ClaimIndex()
    q.load_index(index)
    claims, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=5, token_prefix="t")
    assert [c.job_id for c in claims] == ["low"]
    clock.advance(30)
    claims, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=5, token_prefix="t")
    ms = round(clock.wall() * 1000)
    assert [(c.job_id, c.lease.attempt, c.lease.token) for c in claims] == [
        ("mid", 2, f"t:mid:2:{ms}")]
    # And the next records are written into the spare inodes: no record file is created
    spare_inodes = {os.stat(q.dir("tmp") / n).st_ino for n in spare}
    q.finish([Transition(replace(c.record, result={"path": "x"}, lease=None), State.DONE)
              for c in claims])
    assert os.stat(q.record_path(State.DONE, "mid")).st_ino in spare_inodes


def test_a_retry_delayed_by_a_backwards_clock_jump_is_claimed_after_the_longest_delay(
        queue_dir: Path, tmp_path: Path) -> None:
    # Given a retry written while the clock was an hour ahead, then the clock stepped back
    clock = FakeClock()
    q = Queue(queue_dir, clock=clock)
    submit(q, [pyjob("skewed")], tmp_path)
    claims, _ = claim_all(q)
    q.finish([Transition(replace(claims[0].record, lease=None, not_before=clock.wall() + 3630,
                                 attempts=({"n": 1, "outcome": "failed"},)), State.PENDING)])
    # When a runner whose longest retry delay is 60 s indexes it
    index = ClaimIndex(max_delay_s=60.0)
    q.load_index(index)
    take = dict(holder=HOLDER, lease_s=60, limit=5, token_prefix="t")
    clock.advance(59)
    assert q.claim(index, **take)[0] == []
    # Then it is claimed 60 s on, not an hour on
    clock.advance(1)
    claims, _ = q.claim(index, **take)
    assert [(c.job_id, c.lease.attempt) for c in claims] == [("skewed", 2)]


def test_illegal_transition_is_refused(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    rec = q.get("a").record
    with pytest.raises(ValueError, match="illegal transition pending -> done"):
        q.finish([Transition(rec, State.DONE, State.PENDING)])
    assert files(q, State.PENDING) == ["a.json"] and files(q, State.DONE) == []


def test_a_job_whose_deadline_passed_is_expired_not_claimed(queue_dir: Path,
                                                            tmp_path: Path) -> None:
    clock = FakeClock(now_wall=1_800_000_000.0)
    q = Queue(queue_dir, clock=clock)
    submit(q, [pyjob("late", deadline="2026-01-01T00:00:00Z", priority=9),
               pyjob("on-time", deadline="2030-01-01T00:00:00Z")], tmp_path)
    claims, expired = claim_all(q)
    assert [c.job_id for c in claims] == ["on-time"]
    assert [r.spec.id for r in expired] == ["late"]
    assert q.get("late").state is State.EXPIRED
    assert q.get("late").record.reason == "deadline passed before it started"
    assert files(q, State.PENDING) == [] and files(q, State.RUNNING) == ["on-time.json"]
    assert "late" not in {e["job"] for e in events(q) if e["event"] == "claimed"}
    assert [e["job"] for e in events(q) if e["event"] == "expired"] == ["late"]


# -- cancel versus claim ---------------------------------------------------------------------

ROUNDS = 50
SPIN_MAX = 20_000


def _claimer(path: str, barrier: Any, results: Any) -> None:
    q = Queue(path)
    won = []
    for i in range(ROUNDS):
        view = q.get(f"r{i}")
        index = ClaimIndex()
        index.add(view.record.entry(), now=q.clock.wall())
        barrier.wait()
        claims, _ = q.claim(index, holder=Holder.current(), lease_s=60, limit=1,
                            token_prefix="race")
        won += [c.job_id for c in claims]
    results.put(("claimed", won))


def _canceller(path: str, barrier: Any, results: Any) -> None:
    q = Queue(path)
    rng = random.Random(ROUNDS)
    won = []
    for i in range(ROUNDS):
        spin = rng.randrange(SPIN_MAX)
        barrier.wait()
        # A cancel is one rename; a claim reads the record first. A seeded spin of 0 to ~0.2 ms
        # spreads the cancel across the claim's read-then-rename window, so both sides win.
        for _ in range(spin):
            pass
        if q.cancel_pending(f"r{i}"):
            won.append(f"r{i}")
    results.put(("cancelled", won))


def test_cancel_and_claim_race_has_exactly_one_winner(q: Queue, tmp_path: Path) -> None:
    # Given ROUNDS pending jobs, and two processes that meet at a barrier before each job
    submit(q, [pyjob(f"r{i}") for i in range(ROUNDS)], tmp_path)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2, timeout=60)
    results = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(str(q.path), barrier, results))
             for fn in (_claimer, _canceller)]
    # When one claims and the other cancels the same job at the same moment
    for p in procs:
        p.start()
    won = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    # Then every job has exactly one winner, and its one file is in that winner's folder
    claimed, cancelled = set(won["claimed"]), set(won["cancelled"])
    assert claimed.isdisjoint(cancelled)
    assert claimed | cancelled == {f"r{i}" for i in range(ROUNDS)}
    for i in range(ROUNDS):
        jid = f"r{i}"
        where = [s for s in State if q.record_path(s, jid).exists()]
        assert where == [State.RUNNING if jid in claimed else State.CANCELLED], jid
        assert q.get(jid).record.spec.id == jid  # the winner's record is intact
    assert files(q, "corrupt") == []


def test_cancel_pending_of_a_job_that_is_not_pending(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    claim_all(q)
    assert q.cancel_pending("a") is False
    assert q.cancel_pending("nope") is False
    assert q.get("a").state is State.RUNNING


# -- the dead-letter folder ----------------------------------------------------------------


def test_dead_retry(q: Queue, tmp_path: Path) -> None:
    # Given a job that failed its attempts and was dead-lettered
    submit(q, [pyjob("a", max_attempts=2), pyjob("b")], tmp_path)
    claims, _ = claim_all(q)
    [ca] = [c for c in claims if c.job_id == "a"]
    history = ({"n": 1, "outcome": "failed"}, {"n": 2, "outcome": "released"},
               {"n": 3, "outcome": "crashed"})
    dead = replace(ca.record, attempts=history, lease=None, reason="crashed on attempt 2 of 2")
    q.finish([Transition(dead, State.DEAD)])
    assert q.get("a").record.charged_attempts == 2
    # When it is retried (with an id that is not dead)
    assert q.dead_retry(["a", "b", "nope"]) == ["a"]
    # Then it is pending again with a fresh budget and its history kept
    view = q.get("a")
    assert view.state is State.PENDING and files(q, State.DEAD) == []
    assert view.record.attempts == history and view.record.charged_attempts == 0
    assert view.record.lease is None and view.record.reason == "retried from dead"
    assert [e["job"] for e in events(q) if e["event"] == "revived"] == ["a"]
    # And a running runner learns of it through the journal's doorbell
    index = ClaimIndex()
    assert q.poll_new(index) == 1 and "a" in index
    claims, _ = q.claim(index, holder=HOLDER, lease_s=60, limit=1, token_prefix="t")
    assert [(c.job_id, c.lease.attempt) for c in claims] == [("a", 4)]


def test_dead_purge(q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    [c], _ = claim_all(q)
    q.finish([Transition(c.record, State.DEAD)])
    assert q.dead_purge() == 1 and files(q, State.DEAD) == []


def test_prune_deletes_only_terminal_records_older_than_the_age(queue_dir: Path,
                                                                  tmp_path: Path) -> None:
    # Given records that reached done, cancelled and dead 3 h ago, one cancelled 30 min ago,
    # and a job still pending (each file written when its record was, as the queue does)
    clock = FakeClock()
    q = Queue(queue_dir, clock=clock)
    submit(q, [pyjob("done"), pyjob("dead")], tmp_path)
    claims, _ = claim_all(q)
    q.finish([Transition(c.record, State.DONE if c.job_id == "done" else State.DEAD)
              for c in claims])
    submit(q, [pyjob(j) for j in ("old-cancel", "new-cancel", "waiting")], tmp_path)
    assert q.cancel_pending("old-cancel")

    def age_files(*states: State) -> None:
        for state in states:
            for name in files(q, state):
                os.utime(q.dir(state) / name, (clock.wall(), clock.wall()))

    age_files(State.DONE, State.DEAD, State.CANCELLED)
    clock.advance(2.5 * 3600)
    assert q.cancel_pending("new-cancel")
    os.utime(q.record_path(State.CANCELLED, "new-cancel"), (clock.wall(), clock.wall()))
    clock.advance(0.5 * 3600)
    default = [State.DONE, State.CANCELLED, State.EXPIRED]

    # When pruning at 1 h, first as a dry run
    assert q.prune(default, 3600, dry_run=True) == {"done": 1, "cancelled": 1, "expired": 0}
    assert files(q, State.DONE) == ["done.json"]
    assert q.prune(default, 3600) == {"done": 1, "cancelled": 1, "expired": 0}

    # Then only the old finished ones are gone; dead letters stay unless named
    assert files(q, State.DONE) == [] and files(q, State.CANCELLED) == ["new-cancel.json"]
    assert files(q, State.DEAD) == ["dead.json"]
    assert q.prune([State.DEAD], 3600) == {"dead": 1} and files(q, State.DEAD) == []
    assert files(q, State.PENDING) == ["waiting.json"]
    with pytest.raises(ValueError):
        q.prune([State.PENDING], 0)


def old_records(q: Queue, tmp_path: Path, state: State, n: int) -> list[str]:
    """``n`` records in ``state``'s folder a day old: copies of a real one, as the runner
    writes them (a seed job, done, stays as it is); returns their ids."""
    from renderctl.fsutil import write_file

    submit(q, [pyjob("seed")], tmp_path)
    [c], _ = claim_all(q)
    q.finish([Transition(c.record, State.DONE)])
    rec = q.read_record(q.record_path(State.DONE, "seed"))
    old = q.clock.wall() - 86400
    ids = [f"j{i:04d}" for i in range(n)]
    for jid in ids:
        path = q.record_path(state, jid)
        write_file(path, replace(rec, spec=replace(rec.spec, id=jid), changed_at=old).dumps(),
                   fsync=False)
        os.utime(path, (old, old))
    return ids


def left_when_a_submit_gets_in(q: Queue, work: Any, folder: State) -> int:
    """Run ``work`` in a thread; once it holds submit's lock, wait for that lock as a submit
    does, and return how many records ``folder`` held when we got it."""
    import fcntl
    import threading

    from jobfns import wait_until

    worker = threading.Thread(target=work)
    worker.start()
    try:
        fd = os.open(q.path / ".submit.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:

            def work_holds_the_lock() -> bool:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return True
                fcntl.flock(fd, fcntl.LOCK_UN)
                return False

            wait_until(work_holds_the_lock, what="submit's lock taken", interval_s=0)
            fcntl.flock(fd, fcntl.LOCK_EX)
            return len(os.listdir(q.dir(folder)))
        finally:
            os.close(fd)
    finally:
        worker.join()


def test_prune_lets_a_submit_in_between_batches_of_a_big_folder(
        queue_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 400 done records a day old
    from renderctl import store

    monkeypatch.setattr(store, "PRUNE_BATCH", 8, raising=False)
    q = Queue(queue_dir)
    old_records(q, tmp_path, State.DONE, 400)
    # When `prune` deletes them, and a submit comes while it is at it
    left = left_when_a_submit_gets_in(q, lambda: q.prune([State.DONE], 3600), State.DONE)
    # Then the submit got in while most of the folder was still to be pruned (it waited
    # for the whole folder: 9 s at 300,000 records), and the prune still finished the job
    assert left > 200, left
    assert files(q, State.DONE) == ["seed.json"]


def test_dead_retry_of_many_lets_a_submit_in_between_batches(
        queue_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given 400 dead-lettered jobs
    from renderctl import store

    monkeypatch.setattr(store, "PRUNE_BATCH", 8, raising=False)
    q = Queue(queue_dir)
    ids = old_records(q, tmp_path, State.DEAD, 400)
    # When `dead retry --all` returns them to pending, and a submit comes meanwhile
    left = left_when_a_submit_gets_in(q, lambda: q.dead_retry(ids), State.DEAD)
    # Then the submit got in early (it waited for all of them: 115 s for 20,000, at a
    # fsync each), and every job was retried, once, with a fresh budget
    assert left > 200, left
    assert files(q, State.DEAD) == []
    assert files(q, State.PENDING) == sorted(f"{j}.json" for j in ids)
    rec = q.read_record(q.record_path(State.PENDING, "j0399"))
    assert (rec.reason, rec.attempt_base) == ("retried from dead", len(rec.attempts))
    assert sum(e["event"] == "revived" for e in events(q)) == 400


def test_submitted_records_are_plain_json(q: Queue, tmp_path: Path) -> None:
    # Scripts may read the queue: every record must be strict JSON.
    submit(q, [pyjob("a", params={"x": [1, 2.5, "s"]})], tmp_path)
    raw = q.record_path(State.PENDING, "a").read_text()
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_a_lease_fits_in_the_inode_and_names_its_holder_through_a_holder_file(
        q: Queue, tmp_path: Path) -> None:
    # Given a claimed job, as a runner with a realistic token prefix claims it
    submit(q, [pyjob("a"), pyjob("b")], tmp_path)
    index = ClaimIndex()
    q.load_index(index)
    holder = Holder("a-host-name.example.internal", "f7ba9e56-2e37-42ff-a5cf-592105e45b2c",
                    4_194_304, 1_234_567_890)
    (claim,), _ = q.claim(index, holder=holder, lease_s=60, limit=1,
                          token_prefix="4194304-1234567890")
    running = q.record_path(State.RUNNING, claim.job_id)
    # Then the xattr is small enough for ext4's in-inode space (no xattr block per claim)
    assert len(os.getxattr(running, LEASE_XATTR)) <= 56
    # And reading it back gives the whole lease, holder included (from control/)
    assert read_lease(running) == claim.lease
    assert (q.dir("control") / "holder.4194304-1234567890.json").exists()
    # And a lease in the older JSON form still reads
    os.setxattr(running, LEASE_XATTR, json.dumps(claim.lease.to_json()).encode())
    assert read_lease(running) == claim.lease
    # And holder files no lease names any more are removed; named ones stay
    (q.dir("control") / "holder.999-1.json").write_text(json.dumps(HOLDER.to_json()))
    q.forget_holders(keep={"4194304-1234567890"})
    assert sorted(n for n in os.listdir(q.dir("control")) if n.startswith("holder.")) == [
        "holder.4194304-1234567890.json"]


def test_a_lease_whose_holder_file_is_gone_is_judged_by_its_expiry_alone(
        q: Queue, tmp_path: Path) -> None:
    submit(q, [pyjob("a")], tmp_path)
    index = ClaimIndex()
    q.load_index(index)
    (claim,), _ = q.claim(index, holder=HOLDER, lease_s=60, limit=1, token_prefix="gone-1")
    q.forget_holders(keep=set())  # as if removed by hand
    lease = read_lease(q.record_path(State.RUNNING, "a"))
    assert lease is not None and lease.holder == UNKNOWN_HOLDER
    assert (lease.token, lease.expires_at) == (claim.lease.token, claim.lease.expires_at)


def test_a_record_filed_under_another_jobs_name_is_reported_not_lost(
        q: Queue, tmp_path: Path) -> None:
    # Given y's record renamed by hand to pending/x.json
    submit(q, [pyjob("y")], tmp_path)
    os.rename(q.record_path(State.PENDING, "y"), q.record_path(State.PENDING, "x"))

    # When a runner indexes pending/
    assert q.load_index(ClaimIndex()) == 0

    # Then it is quarantined with its reason (it could never have run as x or y)
    [moved] = files(q, "corrupt")
    assert moved.startswith("pending.x.json.")
    [ev] = [e for e in events(q) if e["event"] == "corrupt"]
    assert "the record of job 'y' filed as x.json" in ev["reason"]
