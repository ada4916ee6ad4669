"""Property tests: whatever a manifest holds, loading it fails only with ManifestError."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from renderctl.errors import ManifestError
from renderctl.lifecycle import State
from renderctl.manifest import FIELDS, load_manifests
from renderctl.store import Queue

FAST = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

KEYS = [f.name for f in FIELDS] + ["memroy_mb", "jobs", "defaults", "job", "title", "text"]
VALID_JOB = {"id": "ok", "kind": "python", "callable": "m:f", "output": "ok.pdf"}


def load_or_manifest_error(path: Path, out_root: Path) -> list[Any] | None:
    """The jobs, or None after a ManifestError; any other exception fails the test."""
    try:
        return load_manifests([path], out_root=out_root)
    except ManifestError as exc:
        assert exc.problems and all(p.file == str(path) for p in exc.problems)
        return None


# -- strategies ----------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
                | st.sampled_from(["m:f", "python", "invoice", "report", "a.pdf", "../x",
                                   "2026-12-01T09:00:00Z", "2026-12-01T09:00:00", "",
                                   "x\ud800.pdf", "\udcff", "{input}", "{inputs}"]))
json_values = st.recursive(
    json_scalars,
    lambda children: (st.lists(children, max_size=4)
                      | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children,
                                        max_size=5)),
    max_leaves=25,
)
KINDS = ["python", "invoice", "report", "merge", "stamp", "split", "command", "nope"]
# Jobs that are often nearly valid, so that generation reaches the per-kind checks.
job_dicts = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries({}, optional={
        "id": st.sampled_from(["a", "b", ".x", "ok"]), "kind": st.sampled_from(KINDS),
        "output": st.sampled_from(["a.pdf", "b/c.pdf", "../x", ""]), "callable": st.just("m:f"),
        "argv": st.just(["echo", "{output}"]), "params": st.just({"title": "t", "text": "x"}),
        "inputs": json_values, "input": json_values, "deadline": json_values,
    }),
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
)
documents = json_values | st.fixed_dictionaries(
    {"jobs": st.lists(job_dicts | json_values, max_size=4)},
    optional={"defaults": st.dictionaries(st.sampled_from(KEYS), json_values, max_size=5)},
)

toml_scalars = st.one_of(
    st.text(max_size=15).map(json.dumps),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "true", "false", "2026-12-01", "09:00:00",
                     "2026-12-01T09:00:00", "2026-12-01T09:00:00Z", "1979-05-27T00:32:00-07:00",
                     '"m:f"', '"python"', '"invoice"', '"x.pdf"', "'lit'", '"""multi"""']),
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: (st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]")
                      | st.lists(st.tuples(st.sampled_from(KEYS), children), max_size=3)
                      .map(lambda kv: "{" + ", ".join(f"{k} = {v}" for k, v in kv) + "}")),
    max_leaves=10,
)
toml_kv = st.one_of(
    st.sampled_from(KINDS).map(lambda k: f'kind = "{k}"'),
    st.sampled_from(['id = "a"', 'output = "a.pdf"', 'callable = "m:f"', 'argv = ["x"]']),
    st.tuples(st.sampled_from(KEYS) | st.text(max_size=6), toml_values)
    .map(lambda kv: f"{kv[0]} = {kv[1]}"),
    st.text(max_size=20),
)
toml_sections = st.tuples(
    st.sampled_from(["[defaults]", "[[jobs]]", "[[jobs]]", "[jobs]", "[[defaults]]",
                     "[jobs.params]", "[defaults.params]", "[[jobs.inputs]]", "", "# c"]),
    st.lists(toml_kv, max_size=6),
).map(lambda sec: "\n".join([sec[0], *sec[1]]))
toml_texts = st.lists(toml_sections, max_size=5).map("\n".join)


# -- properties ----------------------------------------------------------------------------


@FAST
@given(raw=st.binary(max_size=2000), suffix=st.sampled_from([".toml", ".json"]))
def test_arbitrary_bytes(tmp_path: Path, raw: bytes, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_bytes(raw)
    load_or_manifest_error(path, tmp_path / "out")


@FAST
@given(text=toml_texts)
def test_arbitrary_toml_ish_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    load_or_manifest_error(path, tmp_path / "out")


@FAST
@given(doc=documents)
def test_arbitrary_json_values(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    load_or_manifest_error(path, tmp_path / "out")


@FAST
@given(jobs=st.lists(job_dicts, min_size=1, max_size=4))
def test_api_submit_is_all_or_nothing(tmp_path: Path, jobs: list[dict[str, Any]]) -> None:
    # Given a queue, and a batch that mixes arbitrary jobs with one valid job
    q = Queue(tmp_path / "queue")
    before = q.count(State.PENDING)
    batch = [*jobs, VALID_JOB]
    # When the batch is submitted through the Python API
    try:
        res = q.submit(batch, base=tmp_path, out_root=tmp_path / "out")
    except ManifestError:
        # Then a rejected batch enqueued nothing, not even its valid job
        assert q.count(State.PENDING) == before
    else:
        assert q.count(State.PENDING) == before + len(res.accepted)
    assert list(q.dir("tmp").iterdir()) == []


# -- the CLI on generated bad manifests ----------------------------------------------------

bad_jobs = st.builds(
    lambda field, value: {**VALID_JOB, field: value},
    st.sampled_from(KEYS), json_values,
)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(job=bad_jobs, fmt=st.sampled_from(["toml", "json"]))
@pytest.mark.parametrize("command", ["submit", "validate"])
def test_cli_rejects_bad_manifests_cleanly(
    tmp_path: Path, renderctl_argv: list[str], command: str, job: dict[str, Any], fmt: str
) -> None:
    path = tmp_path / f"bad.{fmt}"
    if fmt == "json":
        path.write_text(json.dumps({"jobs": [job]}))
    else:
        path.write_text(_toml_job(job))
    # Given a manifest the library rejects
    assume(load_or_manifest_error(path, tmp_path / "out") is None)
    queue = tmp_path / "queue"
    # When the CLI is given it
    proc = subprocess.run([*renderctl_argv, command, "--queue", str(queue), str(path)]
                          if command == "submit" else [*renderctl_argv, command, str(path)],
                          capture_output=True, text=True, timeout=60)
    # Then it exits 2 with a message, no traceback, and nothing enqueued
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ("nothing was enqueued" if command == "submit" else "; invalid") in proc.stderr
    assert not (queue / "pending").exists() or not list((queue / "pending").iterdir())


def _toml_job(job: dict[str, Any]) -> str:
    """A TOML ``[[jobs]]`` table; values TOML cannot hold (null) become a JSON string."""

    def value(v: Any) -> str:
        if v is None:
            return '"null"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and v != v:
            return "nan"
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"

    return "[[jobs]]\n" + "".join(f"{json.dumps(k)} = {value(v)}\n" for k, v in job.items())
