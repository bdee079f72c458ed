"""The instance record and its JSONL files: round trip, the two encodings of the test lists, extras,
and one-line errors naming file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.setupagent.schema import Instance, read_jsonl, write_jsonl


def _inst(i: int = 1, **kw) -> Instance:
    base = dict(repo="acme/calc", instance_id=f"acme__calc-{i}", base_commit="a" * 40,
                patch="diff --git a/src/x.py b/src/x.py\n", test_patch="diff --git a/tests/t.py b/tests/t.py\n",
                problem_statement="Division by zero\nCrashes.\n", created_at="2023-03-01T08:00:00Z")
    base.update(kw)
    return Instance(**base)


def _record(**kw) -> dict:
    rec = {"repo": "acme/calc", "instance_id": "acme__calc-7", "base_commit": "b" * 40, "patch": "p",
           "test_patch": "t", "problem_statement": "s", "created_at": "2023-03-01T08:00:00Z",
           "FAIL_TO_PASS": ["t1"], "PASS_TO_PASS": []}
    rec.update(kw)
    return rec


def _write_lines(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def test_round_trip_writes_lists(tmp_path):
    a = _inst(1, FAIL_TO_PASS=["tests/t.py::test_div"], PASS_TO_PASS=["tests/t.py::test_add"],
              install=["pip install -e ."], test_framework="pytest", test_commands=["pytest -rA tests/t.py"],
              extra={"merged_at": "2023-03-02T00:00:00Z"})
    b = _inst(2, PASS_TO_FAIL=["x"], FAIL_TO_FAIL=["y"], problem_statement="ünïcode ✓")
    out = write_jsonl(tmp_path / "sub" / "inst.jsonl", [a, b])
    assert read_jsonl(out) == [a, b]
    lines = out.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert first["FAIL_TO_PASS"] == ["tests/t.py::test_div"]  # a list, not a JSON string
    assert first["install"] == ["pip install -e ."] and first["merged_at"] == "2023-03-02T00:00:00Z"
    assert list(first)[:3] == ["repo", "instance_id", "base_commit"] and list(first)[-1] == "merged_at"
    assert "ünïcode ✓" in lines[1]
    assert sorted(p.name for p in out.parent.iterdir()) == ["inst.jsonl"]  # no temporary left behind


def test_reads_json_encoded_lists_and_swebench_records(tmp_path):
    # a SWEE/HF-style record: the test lists and commands JSON-encoded in strings, version a number
    swee = _record(instance_id="a-1", FAIL_TO_PASS='["t1", "t2"]', PASS_TO_PASS="[]", PASS_TO_FAIL='["t3"]',
                   FAIL_TO_FAIL="[]", install="pip install -e .[test]", test_commands='["pytest -rA"]',
                   test_framework="pytest", version=3.0, environment_setup_commit=None, hints_text=None,
                   docker_image_root="logicstar/x")
    # a SWE-bench record: lists, no SetUpAgent keys
    swe = _record(instance_id="b-2", FAIL_TO_PASS=["t1"], PASS_TO_PASS=["t0"], version="4.2",
                  environment_setup_commit="c" * 40, hints_text="see #3")
    a, b = read_jsonl(_write_lines(tmp_path / "x.jsonl", [swee, "", swe]))
    assert (a.FAIL_TO_PASS, a.PASS_TO_PASS, a.PASS_TO_FAIL, a.FAIL_TO_FAIL) == (["t1", "t2"], [], ["t3"], [])
    assert a.install == ["pip install -e .[test]"] and a.test_commands == ["pytest -rA"]
    assert a.version == "3.0" and a.hints_text == "" and a.extra == {"docker_image_root": "logicstar/x"}
    assert (b.PASS_TO_PASS, b.install, b.test_framework, b.PASS_TO_FAIL) == (["t0"], [], "", [])
    assert b.environment_setup_commit == "c" * 40 and b.hints_text == "see #3"


@pytest.mark.parametrize(("record", "message"), [
    ("{not json", r"x\.jsonl:2: not valid JSON"),
    ("[1, 2]", r"x\.jsonl:2: a record must be a JSON object"),
    ({k: v for k, v in _record().items() if k != "patch"}, r"x\.jsonl:2: field 'patch' is missing"),
    (_record(FAIL_TO_PASS="t1, t2"), r"x\.jsonl:2: field 'FAIL_TO_PASS' is a string that is not a JSON list"),
    (_record(PASS_TO_PASS=[1, 2]), r"x\.jsonl:2: field 'PASS_TO_PASS' must be a list of strings"),
    (_record(PASS_TO_FAIL='{"a": 1}'), r"x\.jsonl:2: field 'PASS_TO_FAIL' must be a list of strings"),
    (_record(created_at="last tuesday"), r"x\.jsonl:2: field 'created_at' is not an ISO 8601 time"),
    (_record(base_commit=12), r"x\.jsonl:2: field 'base_commit' must be a string, got int"),
    (_record(instance_id="  "), r"x\.jsonl:2: field 'instance_id' is empty"),
    (_record(instance_id="acme__calc-0"), r"x\.jsonl:2: field 'instance_id': 'acme__calc-0' already appears on line 1"),
])
def test_bad_records_are_one_line_user_errors(tmp_path, record, message):
    path = _write_lines(tmp_path / "x.jsonl", [_record(instance_id="acme__calc-0"), record])
    with pytest.raises(UserError, match=message) as info:
        read_jsonl(path)
    assert "\n" not in str(info.value)


def test_missing_file_and_duplicate_on_write(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_jsonl(tmp_path / "none.jsonl")
    with pytest.raises(ValueError, match="'acme__calc-1' appears twice"):
        write_jsonl(tmp_path / "dup.jsonl", [_inst(1), _inst(1)])
    assert not (tmp_path / "dup.jsonl").exists()


def test_created_at_without_a_time_zone_is_refused():
    # a naive time would be capped differently by pip (local time) and uv (end of the local day)
    with pytest.raises(ValueError, match="no time zone"):
        Instance.from_dict(_record(created_at="2023-01-01T00:00:00"))
    assert Instance.from_dict(_record(created_at="2023-01-01T02:00:00+02:00")).created_at == "2023-01-01T02:00:00+02:00"
