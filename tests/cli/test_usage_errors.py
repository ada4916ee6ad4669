"""Bad options, variables and ids: one line naming the culprit, exit 2, nothing changed."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import typer.main
from clihelp import RENDERCTL, cli, env, job, one_line_usage_error, write_jobs

from renderctl import guards
from renderctl.limits import MAX_WORKERS
from renderctl.settings import ConfigError, check_setting


def nothing_enqueued(queue: Path) -> bool:
    return not (queue / "pending").exists() or not any((queue / "pending").iterdir())


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_jobs(tmp_path / "m", [job("j1", "write")])


# -- C1: the memory guard ------------------------------------------------------------------


@pytest.mark.parametrize("how", ["option", "env"])
def test_an_unknown_memory_guard_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                  how: str) -> None:
    q = tmp_path / "q"
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]
    if how == "option":
        res = cli(*args, "--memory-guard", "bogus", cwd=tmp_path)
        label = "--memory-guard"
    else:
        res = cli(*args, cwd=tmp_path, extra_env={"RENDERCTL_MEMORY_GUARD": "bogus"})
        label = "RENDERCTL_MEMORY_GUARD"
    one_line_usage_error(res, label, "'bogus'", "auto, cgroup-v1, cgroup-v2 or sampling")
    assert nothing_enqueued(q)


def _missing_guard() -> str | None:
    for name in ("cgroup-v2", "cgroup-v1"):
        try:
            guards.require_memory_guard(name)
        except guards.GuardUnavailable:
            return name
    return None


def test_a_memory_guard_this_machine_lacks_is_a_usage_error(tmp_path: Path,
                                                            manifest: Path) -> None:
    missing = _missing_guard()
    if missing is None:
        pytest.skip("both cgroup guards work here")
    q = tmp_path / "q"
    res = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "--memory-guard",
              missing, cwd=tmp_path)
    one_line_usage_error(res, "--memory-guard", missing, "not usable here")
    assert nothing_enqueued(q)  # checked before the manifest was submitted


def test_a_v2_guard_where_the_memory_controller_is_v1s_says_so(tmp_path: Path,
                                                               manifest: Path) -> None:
    mount = guards._mount_point("cgroup2", None)
    if mount is None or "memory" in guards._controllers(mount[0]):
        pytest.skip("needs a cgroup v2 hierarchy without the memory controller (a hybrid host)")
    res = cli("run", manifest, "--queue", tmp_path / "q", "--out", tmp_path / "out",
              "--memory-guard", "cgroup-v2", cwd=tmp_path)
    # (It said "its memory controller is not writable", to root: audit FV)
    one_line_usage_error(res, "the cgroup v2 hierarchy has no memory controller here",
                         "--memory-guard cgroup-v1")


# -- C2: job limits from options, environment and configuration ----------------------------

# Each value is out of the manifest's range for that field (nan and inf included).
BAD_LIMITS = [
    ("--timeout", "nan", "finite"),
    ("--timeout", "inf", "finite"),
    ("--timeout", "1e9", "<= 604800"),
    ("--memory-mb", "99999999999999999999", "between 1 and 1048576"),
    ("--memory-mb", "0", "between 1 and 1048576"),
    ("--max-attempts", "100000", "between 1 and 100"),
]


@pytest.mark.parametrize("option, value, needle", BAD_LIMITS)
def test_job_limit_options_meet_the_manifest_ranges(tmp_path: Path, manifest: Path,
                                                    option: str, value: str,
                                                    needle: str) -> None:
    q = tmp_path / "q"
    for command in ("submit", "run"):
        res = cli(command, manifest, "--queue", q, "--out", tmp_path / "out", option, value,
                  cwd=tmp_path)
        one_line_usage_error(res, option, needle)
        assert nothing_enqueued(q)


@pytest.mark.parametrize("option, value, needle", BAD_LIMITS)
def test_job_limit_variables_meet_the_manifest_ranges(tmp_path: Path, manifest: Path,
                                                      option: str, value: str,
                                                      needle: str) -> None:
    var = "RENDERCTL_" + option[2:].replace("-", "_").upper()
    q = tmp_path / "q"
    res = cli("submit", manifest, "--queue", q, "--out", tmp_path / "out", cwd=tmp_path,
              extra_env={var: value})
    one_line_usage_error(res, var, needle)
    assert nothing_enqueued(q)


@pytest.mark.parametrize("line, needle", [
    ("timeout = inf", "finite"),
    ("timeout = nan", "finite"),
    ("timeout = 1e9", "<= 604800"),
    ("memory_mb = 99999999999", "between 1 and 1048576"),
    ("max_attempts = 100000", "between 1 and 100"),
])
def test_job_limit_config_keys_meet_the_manifest_ranges(tmp_path: Path, manifest: Path,
                                                        line: str, needle: str) -> None:
    (tmp_path / "renderctl.toml").write_text(line + "\n")
    q = tmp_path / "q"
    res = cli("submit", manifest, "--queue", q, "--out", tmp_path / "out", cwd=tmp_path)
    key = line.split(" ")[0]
    one_line_usage_error(res, str(tmp_path / "renderctl.toml"), f"key {key!r}", needle)
    assert nothing_enqueued(q)


@pytest.mark.parametrize("option", ["--out", "--queue"])
def test_an_output_root_or_queue_that_is_a_fifo_says_what_it_is(tmp_path: Path, manifest: Path,
                                                                option: str) -> None:
    # Given a named pipe where the output root or queue should be
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    paths = {"--out": tmp_path / "out", "--queue": tmp_path / "q", option: fifo}
    # When submit is given it
    res = cli("submit", manifest, "--out", paths["--out"], "--queue", paths["--queue"],
              cwd=tmp_path)
    # Then the one line says what it is (it said "is not a folder, not a folder")
    what = "a folder (the output root" if option == "--out" else "a queue folder"
    one_line_usage_error(res, f"{option}: {fifo} is a special file (a FIFO), not {what}")
    assert nothing_enqueued(tmp_path / "q")


HUGE = "1" + "0" * 400  # an integer TOML holds, beyond any float (1e308)


@pytest.mark.parametrize(("key", "needle"), [
    ("timeout", "must be a finite number of seconds"),
    ("poll_interval", "expected a finite number > 0"),
    ("max_jobs_per_worker", None),  # an integer key: any size is a count
])
def test_an_integer_past_any_float_in_the_configuration_is_no_traceback(
        tmp_path: Path, manifest: Path, key: str, needle: str | None) -> None:
    # Given a configuration file with an integer too big for a float
    (tmp_path / "renderctl.toml").write_text(f"{key} = {HUGE}\n")
    q = tmp_path / "q"
    # When a command reads it
    res = cli("submit", manifest, "--queue", q, "--out", tmp_path / "out", cwd=tmp_path)
    # Then a number key refuses it in one line naming the file and key, with nothing
    # enqueued, and an integer key takes it (both were an OverflowError traceback)
    assert "Traceback" not in res.stderr, res.stderr
    if needle is None:
        assert res.returncode == 0, res.stderr
        return
    one_line_usage_error(res, str(tmp_path / "renderctl.toml"), f"key {key!r}", needle)
    assert nothing_enqueued(q)


def test_limits_in_range_still_reach_the_jobs(tmp_path: Path, manifest: Path) -> None:
    q = tmp_path / "q"
    res = cli("submit", manifest, "--queue", q, "--out", tmp_path / "out", "--timeout", "7",
              "--memory-mb", "300", "--max-attempts", "4", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (record,) = (q / "pending").iterdir()
    spec = json.loads(record.read_text())["spec"]
    assert (spec["timeout_s"], spec["memory_mb"], spec["max_attempts"]) == (7.0, 300, 4)


# Infinity too: `--grace inf` printed `"grace_s": Infinity` in `run --json` (no JSON parser
# takes it), `--kill-grace inf` never SIGKILLed a job deaf to SIGTERM, and `--backoff-base inf`
# scheduled a retry for never.
@pytest.mark.parametrize("option, value", [("--workers", "0"), ("--backoff-base", "nan"),
                                           ("--grace", "-1"), ("--prefetch", "0"),
                                           ("--poll-interval", "0"), ("--poll-interval", "nan"),
                                           ("--grace", "inf"), ("--kill-grace", "inf"),
                                           ("--backoff-base", "inf"), ("--backoff-max", "inf"),
                                           ("--poll-interval", "inf")])
def test_runner_options_get_their_configuration_checks(tmp_path: Path, option: str,
                                                       value: str) -> None:
    res = cli("run", "--queue", tmp_path / "q", "--out", tmp_path / "out", option, value,
              cwd=tmp_path)
    one_line_usage_error(res, option, "expected", f"got {value}")


# Values no number parser takes, from the command line and from the environment.
NOT_NUMBERS = [("--workers", "four"), ("--memory-mb", "400MB"), ("--timeout", "1m"),
               ("--max-attempts", "3.5"), ("--max-pending", "lots"), ("--grace", "30s"),
               ("--memory-budget", "1.5"), ("--max-failures", ""), ("--poll-interval", "x"),
               ("--timeout", "1_0"), ("--workers", "1_0")]  # (int() and float() read 10)


@pytest.mark.parametrize("how", ["option", "env"])
@pytest.mark.parametrize("option, value", NOT_NUMBERS)
def test_a_value_that_is_not_a_number_is_one_line_naming_where_it_came_from(
        tmp_path: Path, manifest: Path, option: str, value: str, how: str) -> None:
    # Given a numeric option set to something that is not a number, on the command line or
    # in its variable (an empty variable is unset, so the empty value is the option's only)
    var = "RENDERCTL_" + option[2:].replace("-", "_").upper()
    if how == "env" and value == "":
        pytest.skip("an empty variable is unset")
    q = tmp_path / "q"
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]

    # When `run` is started so
    if how == "option":
        res = cli(*args, option, value, cwd=tmp_path)
    else:
        res = cli(*args, cwd=tmp_path, extra_env={var: value})

    # Then it is one line naming that option or that variable and the value, as an
    # out-of-range value is (it was click's usage block, which named the variable even for
    # a value typed on the command line), and nothing was enqueued
    label = option if how == "option" else var
    one_line_usage_error(res, f"{label}: expected", f"got {value!r}")
    assert (var in res.stderr) == (how == "env"), res.stderr
    assert nothing_enqueued(q)


# -- C3: usage, not I/O; all or nothing ----------------------------------------------------


@pytest.mark.parametrize("args", [["status"], ["show", "x"], ["cancel", "x"], ["wait", "x"],
                                  ["dead", "list"], ["dead", "retry", "x"], ["dead", "purge"],
                                  ["metrics"], ["top", "--once"]], ids=" ".join)
def test_a_queue_that_does_not_exist_is_a_usage_error(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "nonexistent"
    res = cli(*args, "--queue", missing, cwd=tmp_path)
    one_line_usage_error(res, str(missing), "does not exist: no queue there yet")
    assert not missing.exists()  # reading commands never create a queue


def test_dead_retry_with_an_unknown_id_retries_nothing(tmp_path: Path) -> None:
    manifest = write_jobs(tmp_path / "m", [job("op1", "fail", max_attempts=1),
                                           job("op2", "fail", max_attempts=1)])
    q = tmp_path / "q"
    run = cli("run", manifest, "--queue", q, "--out", tmp_path / "out", "-j", "1",
              cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    dead = sorted(p.name for p in (q / "dead").iterdir())
    assert dead == ["op1.json", "op2.json"]
    res = cli("dead", "retry", "op1", "nope", "op2", "--queue", q, cwd=tmp_path)
    assert sorted(p.name for p in (q / "dead").iterdir()) == dead
    assert not any((q / "pending").iterdir())
    one_line_usage_error(res, "not in dead/: nope", "nothing was retried")
    ok = cli("dead", "retry", "op1", "op2", "--queue", q, cwd=tmp_path)
    assert ok.returncode == 0 and "retried 2 job(s)" in ok.stdout, ok.stderr
    assert not any((q / "dead").iterdir())


# -- C4: wait's own timeout ----------------------------------------------------------------


def test_the_job_timeout_setting_does_not_limit_wait(tmp_path: Path, manifest: Path) -> None:
    # Given a configuration and an environment that set the JOBS' timeout to a fraction of
    # a second, and a queued job that nothing runs
    (tmp_path / "renderctl.toml").write_text("timeout = 0.2\n")
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, "--out", tmp_path / "out",
               cwd=tmp_path).returncode == 0
    # When wait is given no --timeout of its own, it waits on past them
    waiter = subprocess.Popen([*RENDERCTL, "wait", "j1", "--queue", str(q)], cwd=tmp_path,
                              env=env({"RENDERCTL_TIMEOUT": "0.2"}), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            waiter.wait(timeout=2)
        # and returns when the job is terminal
        assert cli("cancel", "j1", "--queue", q, cwd=tmp_path).returncode == 0
        stdout, stderr = waiter.communicate(timeout=20)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 1, stderr
    assert stdout.strip() == "j1: cancelled"
    # (its own --timeout, exit 75, is test_wait's; an answer already there beats it)
    assert cli("wait", "j1", "--queue", q, "--timeout", "0", cwd=tmp_path).returncode == 1
    help_text = cli("wait", "--help", cwd=tmp_path).stdout
    assert "not the jobs' timeout" in " ".join(help_text.split())


def test_every_configuration_key_still_sets_an_option() -> None:
    # Keys now reach only options whose RENDERCTL_<KEY> matches; none may be left orphaned.
    from renderctl.cli.app import app, config_default_map
    from renderctl.settings import KEYS

    command = typer.main.get_command(app)
    mapped = config_default_map(command, {k: k for k in KEYS})  # each value names its key
    reached = {v for own in mapped.values() for v in own.values() if isinstance(v, str)}
    reached |= {v for own in mapped.values() for sub in own.values() if isinstance(sub, dict)
                for v in sub.values()}
    assert reached == set(KEYS)
    assert "timeout" not in mapped["wait"]


@pytest.mark.parametrize("value", ["nan", "-1", "soon"])
def test_wait_refuses_a_timeout_that_is_not_seconds_in_one_line(tmp_path: Path,
                                                                value: str) -> None:
    # (-1 was click's own "Invalid value ... not in the range x>=0.0", and under --json
    # only "see stderr"; audit DB)
    res = cli("wait", "j1", "--timeout", value, "--queue", tmp_path / "q", "--json",
              cwd=tmp_path)
    one_line_usage_error(res, "--timeout: must be a number of seconds >= 0")
    assert json.loads(res.stdout)["message"].startswith("--timeout: must be"), res.stdout


# -- C5: a conflict with the queue names the manifest it came from -------------------------


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_changed_spec_names_its_manifest(tmp_path: Path, command: str) -> None:
    first = write_jobs(tmp_path / "a", [job("g1", "write")])
    changed = write_jobs(tmp_path / "b", [job("g0", "write"), job("g1", "write",
                                                                   output="g1-new.bin")])
    q, out = tmp_path / "q", tmp_path / "out"
    assert cli("submit", first, "--queue", q, "--out", out, cwd=tmp_path).returncode == 0
    res = cli(command, changed, "--queue", q, "--out", out, cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert (f"{changed}: job g1: already in the queue (pending) with a different spec"
            in res.stderr), res.stderr
    assert "<queue>" not in res.stderr
    assert sorted(p.name for p in (q / "pending").iterdir()) == ["g1.json"]  # not g0


# -- C6: run --json ------------------------------------------------------------------------


def test_every_run_json_line_has_ts_and_event(tmp_path: Path, manifest: Path) -> None:
    res = cli("run", manifest, "--queue", tmp_path / "q", "--out", tmp_path / "out",
              "--json", "-j", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert lines[-1]["event"] == "summary"
    for line in lines:
        assert isinstance(line.get("ts"), float) and isinstance(line.get("event"), str), line
    assert lines[-1]["ts"] >= lines[-2]["ts"]


@pytest.mark.parametrize("how", ["option", "env", "file"])
def test_workers_are_capped(tmp_path: Path, manifest: Path, how: str) -> None:
    # Given a worker count far above what one runner can supervise
    q = tmp_path / "q"
    args: list[object] = ["run", manifest, "--queue", q, "--out", tmp_path / "out"]
    extra: dict[str, str] = {}
    if how == "option":
        args += ["--workers", "100000"]
        label = "--workers"
    elif how == "env":
        extra = {"RENDERCTL_WORKERS": "100000"}
        label = "RENDERCTL_WORKERS"
    else:
        (tmp_path / "renderctl.toml").write_text("workers = 100000\n")
        label = "key 'workers'"

    # When `run` is asked for it
    res = cli(*args, cwd=tmp_path, extra_env=extra)

    # Then it is a usage error naming the source and the limit, before anything is enqueued
    one_line_usage_error(res, label, f"at most {MAX_WORKERS}", "got 100000")
    assert nothing_enqueued(q)


def test_the_most_workers_allowed_are_accepted() -> None:
    # (In process: a run with 256 workers would spawn them all.)
    assert check_setting("workers", MAX_WORKERS, label="--workers") == MAX_WORKERS
    with pytest.raises(ConfigError, match=f"--workers: must be at most {MAX_WORKERS}"):
        check_setting("workers", MAX_WORKERS + 1, label="--workers")


@pytest.mark.parametrize("command", ["submit", "run", "status", "cancel"])
def test_a_queue_path_that_is_a_file_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                      command: str) -> None:
    # Given --queue naming an existing regular file
    not_a_queue = tmp_path / "notes.txt"
    not_a_queue.write_text("mine\n")
    args: list[object] = {"submit": ["submit", manifest], "run": ["run", manifest],
                          "status": ["status"], "cancel": ["cancel", "j1"]}[command]

    # When a command is pointed at it
    res = cli(*args, "--queue", not_a_queue, "--out", tmp_path / "out", cwd=tmp_path) \
        if command in ("submit", "run") else cli(*args, "--queue", not_a_queue, cwd=tmp_path)

    # Then it is a usage error (exit 2, not 74's "the disk failed") naming the path, and
    # the file is left alone
    one_line_usage_error(res, f"--queue: {not_a_queue} is a file, not a queue folder")
    assert not_a_queue.read_text() == "mine\n"


# -- ids no job can have -------------------------------------------------------------------


@pytest.mark.parametrize("jid", ["a" * 300, "../pending/j1", "../../x"])
@pytest.mark.parametrize("command", [["show"], ["cancel"], ["wait", "--timeout", "1"],
                                     ["dead", "retry"]])
def test_an_id_no_job_can_have_is_not_found_and_changes_nothing(
        tmp_path: Path, manifest: Path, command: list[str], jid: str) -> None:
    # Given a queue with j1 pending
    q = tmp_path / "q"
    assert cli("submit", manifest, "--queue", q, cwd=tmp_path).returncode == 0
    # When a command is given an id no job can have: too long for a file name, or a path
    # to another folder's record of a real job
    res = cli(*command, jid, "--queue", q, cwd=tmp_path)
    # Then it is not found (never an I/O error, never j1 seen through the path), and j1
    # stays pending
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "I/O error" not in res.stderr, res.stderr
    assert sorted(p.name for p in (q / "pending").iterdir()) == ["j1.json"]
    assert not (q / "cancelled").exists() or not any((q / "cancelled").iterdir())


@pytest.mark.parametrize("command", ["submit", "run", "status"])
def test_a_queue_path_through_a_file_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                      command: str) -> None:
    # Given --queue naming a path below a regular file
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    args: list[object] = {"submit": ["submit", manifest], "run": ["run", manifest],
                          "status": ["status"]}[command]

    # When a command is pointed at it
    res = cli(*args, "--queue", afile / "sub", cwd=tmp_path)

    # Then it is a usage error naming the file in the way, not 74's "Not a directory"
    one_line_usage_error(res, f"--queue: {afile / 'sub'} is a path through a file ({afile}), "
                              "not a queue folder")
    assert afile.read_text() == "mine\n"


@pytest.mark.parametrize("how", ["option", "env", "file", "default"])
@pytest.mark.parametrize("command", ["validate", "submit", "run"])
def test_an_output_root_that_is_a_file_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                        command: str, how: str) -> None:
    # Given an output root that names a regular file (by each way of setting it)
    afile = tmp_path / ("out" if how == "default" else "afile")
    afile.write_text("mine\n")
    q = tmp_path / "q"
    args: list[object] = [command, manifest] + ([] if command == "validate" else ["--queue", q])
    extra_env = {"RENDERCTL_OUT": str(afile)} if how == "env" else None
    if how == "option":
        args += ["--out", afile]
    elif how == "file":
        (tmp_path / "renderctl.toml").write_text(f'out = "{afile}"\n')

    # When the command runs
    res = cli(*args, cwd=tmp_path, extra_env=extra_env)

    # Then it stops at once (not every job dead-lettered at run time), naming where the
    # value came from, and nothing was enqueued
    named = {"option": "--out", "env": "RENDERCTL_OUT", "default": "--out (default)",
             "file": f"{tmp_path / 'renderctl.toml'}: key 'out'"}[how]
    shown = "out" if how == "default" else afile
    one_line_usage_error(res, f"{named}: {shown} is a file, not a folder (the output root")
    assert not q.exists()
    assert afile.read_text() == "mine\n"


def test_an_output_root_through_a_file_is_a_usage_error(tmp_path: Path, manifest: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    res = cli("submit", manifest, "--queue", tmp_path / "q", "--out", afile / "sub",
              cwd=tmp_path)
    one_line_usage_error(res, f"--out: {afile / 'sub'} is a path through a file ({afile})")
    assert not (tmp_path / "q").exists()



@pytest.mark.parametrize("command", ["validate", "submit", "run"])
def test_an_output_root_that_is_a_symlink_loop_is_a_usage_error(tmp_path: Path, manifest: Path,
                                                                command: str) -> None:
    # Given an output root that is a symlink loop: it can never become a folder
    loop = tmp_path / "out"
    loop.symlink_to(tmp_path / "other")
    (tmp_path / "other").symlink_to(loop)
    q = tmp_path / "q"
    args: list[object] = [command, manifest] + ([] if command == "validate" else ["--queue", q])

    # When the command runs with it
    res = cli(*args, "--out", loop, cwd=tmp_path)

    # Then it stops at once naming the option and the loop (it was taken for a missing
    # folder: every job accepted, then `run` died in a traceback claiming the first), and
    # nothing was enqueued
    one_line_usage_error(res, f"--out: {loop} is a symlink loop, not a folder")
    assert not q.exists()

@pytest.mark.parametrize("through", ["itself", "a parent"])
@pytest.mark.parametrize("command", ["validate", "submit", "run"])
def test_an_output_root_through_a_symlink_to_nothing_is_a_usage_error(
        tmp_path: Path, manifest: Path, command: str, through: str) -> None:
    # Given an output root that is (or goes through) a symlink whose target is gone, as a
    # link to a file system that is not mounted
    link = tmp_path / "storage"
    link.symlink_to(tmp_path / "mnt" / "storage")
    root = link if through == "itself" else link / "renders" / "out"
    q = tmp_path / "q"
    args: list[object] = [command, manifest] + ([] if command == "validate" else ["--queue", q])

    # When the command runs with it
    res = cli(*args, "--out", root, cwd=tmp_path)

    # Then it stops at once naming the option, the link and its target (it was taken for a
    # missing folder: every job accepted, then each dead-lettered by the run with
    # "File exists"), and nothing was enqueued or created where the target should be
    gone = f"a symlink to {tmp_path / 'mnt' / 'storage'}, which does not exist"
    one_line_usage_error(res, f"--out: {root} is "
                         + (gone if through == "itself" else f"a path through {link}, {gone}"))
    assert not q.exists() and not (tmp_path / "mnt").exists()


@pytest.mark.parametrize("args", [["status"], ["run"], ["submit", "jobs.toml"]], ids=" ".join)
def test_a_current_folder_deleted_under_the_command_is_a_usage_error(
        tmp_path: Path, args: list[str]) -> None:
    # Given a shell (or cron job) left in a folder since deleted (a redeploy)
    gone = tmp_path / "gone"
    gone.mkdir()
    # When a command starts there, even one naming its queue in full
    res = subprocess.run(["sh", "-c", 'cd "$0" && rmdir "$0" && exec "$@"', str(gone),
                          *RENDERCTL, *args, "--queue", str(tmp_path / "q")],
                         capture_output=True, text=True, timeout=60, env=env())
    # Then it says so in one line, exit 2 (it ended in os.getcwd()'s traceback), and
    # creates nothing
    one_line_usage_error(res, "the current folder is gone", "cd to one that exists")
    assert not (tmp_path / "q").exists()


# -- outputs among the queue's own files (found by an audit) --------------------------------


@pytest.mark.parametrize("command", ["submit", "run"])
@pytest.mark.parametrize("where", ["out-is-queue", "output-under-queue"])
def test_an_output_in_the_queue_folder_is_refused(tmp_path: Path, command: str,
                                                  where: str) -> None:
    # Given an output root that is the queue folder itself, or a queue inside the output
    # root and a job whose output path leads into it
    if where == "out-is-queue":
        queue = out = tmp_path / "q"
        jobs = [job("j1", "write", output="pending/zz.json")]
    else:
        out, queue = tmp_path / "out", tmp_path / "out" / ".q"
        jobs = [job("j1", "write", output=".q/pending/zz.json"), job("j2", "write")]
    manifest = write_jobs(tmp_path / "m", jobs)

    # When it is submitted (or run)
    res = cli(command, manifest, "--queue", queue, "--out", out, cwd=tmp_path)

    # Then it is a manifest error naming what lands in the queue, and nothing is enqueued
    # (the published file was moved to corrupt/ as a damaged record, the job counted done)
    assert res.returncode == 2, res.stdout + res.stderr
    needle = "--out: the output root" if where == "out-is-queue" else "job j1: output:"
    assert needle in res.stderr and "inside the queue folder" in res.stderr, res.stderr
    assert nothing_enqueued(queue)
