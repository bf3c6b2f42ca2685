"""A results file rewritten in the current schema: the raw lines change names, the reader reads the same records,
nothing that was stored is lost, and the committed files hold no older line (so no raw roofline above 1.0)."""

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from optbench.records import rewrite
from optbench.records.record import SCHEMA_VERSION, Record, read_records
from optbench.records.rewrite import RewriteError, rewrite_file, upgraded_line

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import upgrade_records  # noqa: E402

OUTRAN = {"schema_version": 4, "trial_id": "t1", "optimizer": "adamw_fused", "status": "ok",
          "roofline_fraction": 1.17, "device_bandwidth_kernel": "fused-adamw", "a_field_from_elsewhere": [1, 2]}
TRIAD = {"schema_version": 3, "trial_id": "t2", "optimizer": "sgd", "status": "ok", "roofline_fraction": 0.8}
CURRENT = Record(trial_id="t3", optimizer="adamw", status="ok", roofline_fraction=0.9,
                 device_bandwidth_kernel="fused-adamw").to_dict()


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(OUTRAN), json.dumps(TRIAD), "", "{not json", json.dumps(CURRENT),
                               '{"schema_version": 2, "trial_id": "t4", "optim']) + "\n")
    return path


def test_older_lines_take_the_current_names_and_keep_every_other_key_in_place():
    outran = json.loads(upgraded_line(json.dumps(OUTRAN)))
    assert list(outran)[:2] == ["schema_version", "upgraded_from_schema"]
    assert (outran["schema_version"], outran["upgraded_from_schema"]) == (SCHEMA_VERSION, 4)
    assert "roofline_fraction" not in outran and outran["ceiling_outrun_fraction"] == 1.17
    assert outran["a_field_from_elsewhere"] == [1, 2]  # a field this version does not know is kept
    assert [k for k in outran if k in OUTRAN] == [k for k in OUTRAN if k in outran]  # the rest keeps its order
    triad = json.loads(upgraded_line(json.dumps(TRIAD)))
    assert "roofline_fraction" not in triad and triad["triad_roofline_fraction"] == 0.8
    assert triad["upgraded_from_schema"] == 3


def test_the_rewritten_file_reads_back_as_the_same_records_and_loses_no_line(tmp_path):
    path = _file(tmp_path)
    with pytest.warns(UserWarning):
        before = read_records(path)
    lines_before = path.read_text().splitlines()
    assert rewrite_file(path) == 2
    lines_after = path.read_text().splitlines()
    # the blank, corrupt, current and torn lines stay byte for byte
    assert len(lines_after) == len(lines_before) and lines_after[2:] == lines_before[2:]
    with pytest.warns(UserWarning):
        after = read_records(path)
    assert [r.upgraded_from_schema for r in after] == [4, 3, None]
    for old, new in zip(before, after, strict=True):
        assert dataclasses.replace(new, schema_version=old.schema_version, upgraded_from_schema=None) == old
    assert rewrite_file(path) == 0  # a second rewrite has nothing left to do


def test_a_rewrite_that_would_read_back_differently_is_refused_and_the_file_kept(tmp_path, monkeypatch):
    path = _file(tmp_path)
    text = path.read_text()
    monkeypatch.setattr(rewrite, "upgrade", lambda data: {**data, "optimizer": "something else"})
    with pytest.raises(RewriteError, match="t1"):
        rewrite_file(path)
    assert path.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]


def test_the_script_checks_then_rewrites_and_refuses_bad_input(tmp_path, capsys):
    path = _file(tmp_path)
    assert upgrade_records.main(["--check", str(path)]) == 1
    assert "2 line(s) in an older schema" in capsys.readouterr().out
    assert upgrade_records.main([str(path)]) == 0
    assert upgrade_records.main(["--check", str(path)]) == 0
    assert upgrade_records.main([str(tmp_path / "none.jsonl")]) == 2
    assert upgrade_records.main(["--all"]) == 2
    assert capsys.readouterr().err.count("upgrade_records: ") == 2


def test_no_committed_line_is_in_an_older_schema_and_none_stores_a_roofline_above_one():
    """The raw lines, not what the reader makes of them: no `roofline_fraction` above 1.0 in any committed file."""
    assert upgrade_records.main(["--check"]) == 0
    above = []
    for path in sorted((ROOT / "results").rglob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            data = json.loads(line) if line.startswith("{") and line.endswith("}") else {}
            if (data.get("roofline_fraction") or 0) > 1:
                above.append(f"{path.relative_to(ROOT)}:{number}")
    assert not above
