"""`renderctl schema` knows each renderer's params, and agrees with validation about them.

An editor that checks a manifest against the schema must not flag what `validate` accepts,
and should flag what `validate` refuses for a reason a schema can say (a type, a choice, a
range, an unknown param). Checked with a real JSON Schema validator over generated params.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from renderctl.errors import ManifestError
from renderctl.manifest import jobs_from_dicts, json_schema
from renderctl.render.registry import all_specs

KINDS = [k for k, s in all_specs().items() if s.params and not s.open_params]
VALIDATOR = jsonschema.Draft202012Validator(json_schema())

values = st.one_of(
    st.text(max_size=20), st.integers(-10**6, 10**6), st.booleans(), st.none(),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.lists(st.text(max_size=5), max_size=3), st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["center", "top-left", "diagonal", "Q3"]),
    st.sampled_from([0, 1, 0.5, -1, 1.5, 500, 501, -360, 361, 100_000, 100_001]),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("m")
    (d / "in.pdf").write_bytes(b"%PDF-1.4\n")
    return d


def _params_problems(folder: Path, job: dict[str, Any]) -> list[str]:
    try:
        jobs_from_dicts([job], base=folder, out_root=folder / "out")
    except ManifestError as exc:
        return [p.field or "" for p in exc.problems if (p.field or "").startswith("params")]
    return []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_schema_and_validation_agree_on_params(folder: Path, kind: str,
                                               data: st.DataObject) -> None:
    spec = all_specs()[kind]
    names = [p.name for p in spec.params] + ["titel", "extra"]
    params = data.draw(st.dictionaries(st.sampled_from(names), values, max_size=4))
    # Every required param given (their absence is validation's to say: see params_schema),
    # unless the draw gave one already.
    for p in spec.params:
        if p.required and p.name not in params:
            params[p.name] = {"str": "Q3", "int": 1, "float": 1.0, "number": 1,
                              "bool": True, "list[str]": [], "table": {}}[p.type]
    job = {"id": "j1", "kind": kind, "input": "in.pdf",
           "output": "o" if spec.output == "dir" else "o.pdf", "params": params}
    schema_errors = list(VALIDATOR.iter_errors({"jobs": [job]}))
    refused = _params_problems(folder, job)
    if schema_errors:
        # Never stricter than renderctl: what an editor flags, validate refuses too.
        assert refused, f"schema refuses what validation accepts: {schema_errors[0].message}"
    by_name = {p.name: p for p in spec.params}
    for field in refused:
        name = field.removeprefix("params.").split("[")[0].split(".")[0]
        p = by_name.get(name)
        if p is not None and p.check is not None:
            continue  # (the renderer's own rule: a schema cannot say it)
        if p is not None and p.type == "int" and isinstance(params[name], float) \
                and params[name].is_integer():
            continue  # (2.0: JSON Schema counts it an integer; see base._PARAM_TYPES)
        assert schema_errors, f"validation refuses {field}={params.get(name)!r}, the schema " \
                              "accepts it"


def test_params_are_judged_only_where_a_job_names_its_kind(folder: Path) -> None:
    # A job without its own kind matches no kind's condition: its params are validation's.
    job = {"id": "j1", "input": "in.pdf", "output": "o.pdf", "params": {"anything": 1}}
    assert VALIDATOR.is_valid({"defaults": {"kind": "stamp"}, "jobs": [job]})
    assert not VALIDATOR.is_valid({"jobs": [{**job, "kind": "stamp"}]})
    # Nor are [defaults]' params judged by its kind: each job may name another, and
    # validation judges them only as a job merges them (review CY: refused by the schema,
    # accepted by validate)
    doc = {"defaults": {"kind": "stamp", "params": {"text": "DRAFT", "title": "Q3"}},
           "jobs": [{"id": "j1", "kind": "python", "callable": "json:f", "output": "o.pdf"}]}
    assert VALIDATOR.is_valid(doc)
    jobs_from_dicts(doc["jobs"], base=folder, out_root=folder / "out",
                    defaults=doc["defaults"])


def test_open_kinds_take_any_params() -> None:
    job = {"id": "j1", "kind": "python", "callable": "m:f", "output": "o.pdf",
           "params": {"anything": [1, {"x": None}]}}
    assert VALIDATOR.is_valid({"jobs": [job]})


def test_every_param_has_its_schema_in_kinds_json() -> None:
    for spec in all_specs().values():
        for p in spec.params:
            s = p.json_schema()
            assert s["type"] in ("string", "integer", "number", "boolean", "array", "object")
            if p.choices:
                assert s["enum"] == list(p.choices)
            if p.low is not None or p.high is not None:
                assert (s.get("minimum"), s.get("maximum")) == (p.low, p.high)
