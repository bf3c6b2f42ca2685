"""The JSON Lines store: round trip, torn last line, resume keys, JSON-safety (faults: test_faults.py)."""

import json
import math
import warnings

import pytest

from optbench.records.record import (
    Record,
    ResultsFileError,
    append_record,
    completed_trial_ids,
    read_records,
)
from optbench.records.writable import check_writable


def test_round_trip_keeps_every_field(tmp_path):
    path = tmp_path / "r.jsonl"
    record = Record(trial_id="a", optimizer="adamw", status="ok", state_bytes=8, loss_curve=[1.0, 0.5],
                    state_bytes_by_key={"exp_avg": 4, "exp_avg_sq": 4})
    append_record(path, record)
    append_record(path, Record(trial_id="b", optimizer="adafactor", status="error", error="boom"))
    back = read_records(path)
    assert back[0] == record and back[1].error == "boom"


def test_non_finite_numbers_are_written_as_null(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, Record(trial_id="a", optimizer="adamw", status="diverged",
                               loss_curve=[1.0, math.nan, math.inf], train_loss_final=math.nan))
    data = json.loads(path.read_text())
    assert data["loss_curve"] == [1.0, None, None] and data["train_loss_final"] is None


def test_torn_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, Record(trial_id="a", optimizer="adamw", status="ok"))
    with open(path, "a") as handle:
        handle.write('{"trial_id": "b", "optim')  # killed mid-write
    with pytest.warns(UserWarning, match="torn last line"):
        records = read_records(path)
    assert [r.trial_id for r in records] == ["a"]


def test_a_file_of_nothing_but_bad_lines_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("not json\n{also not\n")
    with pytest.raises(ResultsFileError, match=":1: not a JSON line"):
        read_records(path)


@pytest.mark.parametrize("field, value, says", [
    ("peak_memory_bytes", "lots", "field peak_memory_bytes is 'lots', not a whole number or null"),
    ("optimizer", None, "field optimizer is None, not a string"),
    ("seed", None, "field seed is None, not a whole number"),
    ("eval_metrics", None, "field eval_metrics is None, not an object"),
    ("step_time_samples_s", [0.1, "x"], "field step_time_samples_s is [0.1, 'x'], not a list"),
    ("pretrained", 1, "field pretrained is 1, not true or false"),
    ("status", "weird", "field status is 'weird', not one of ok, oom"),  # was tabulated as 'weird 1/1'
])
def test_a_field_of_the_wrong_type_is_an_unreadable_line(tmp_path, field, value, says):
    """`"peak_memory_bytes": "lots"` or `"seed": null` in a results file ended report, compare and recommend in a
    traceback from deep inside a table (a TypeError in arithmetic, a KeyError in a groupby). The line is skipped
    with the warning a torn line gets, naming the field; a file of nothing else is refused with that line."""
    path = tmp_path / "r.jsonl"
    append_record(path, Record(trial_id="a", optimizer="adamw", status="ok", peak_memory_bytes=3, seed=1))
    broken = {**Record(trial_id="b", optimizer="adamw", status="ok").to_dict(), field: value}
    with open(path, "a") as handle:
        handle.write(json.dumps(broken) + "\n")
    with pytest.warns(UserWarning, match="unreadable line") as caught:
        records = read_records(path)
    assert [r.trial_id for r in records] == ["a"] and says in str(caught[0].message)
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(broken) + "\n")
    with pytest.raises(ResultsFileError, match=":1: " + says.replace("[", r"\[").replace("]", r"\]")):
        read_records(alone)


def test_a_byte_order_mark_is_not_a_torn_line(tmp_path):
    """A file saved by an editor that starts it with a UTF-8 byte-order mark lost its first record as unreadable."""
    path = tmp_path / "r.jsonl"
    append_record(path, Record(trial_id="a", optimizer="adamw", status="ok"))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.trial_id for r in read_records(path)] == ["a"]


def test_every_committed_record_has_its_fields_types():
    """The check above must not drop real records: every line under results/ reads back whole."""
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[1].glob("results/**/*.jsonl"))
    assert files
    for path in files:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(read_records(path)) == len(lines), path


def test_check_writable_creates_the_folder_and_leaves_no_file(tmp_path):
    path = tmp_path / "a" / "b" / "r.jsonl"
    check_writable(path)
    assert path.parent.is_dir() and not path.exists()
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        check_writable(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="file is a file, not a folder"):
        check_writable(tmp_path / "file" / "r.jsonl")


def test_a_json_file_that_is_not_records_is_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"hello": 1}\n[1, 2]\n')
    with pytest.raises(ResultsFileError, match=":1: not an optbench record"):
        read_records(path)


@pytest.mark.parametrize("pasted", ['{"foo": 1}', "[1, 2, 3]", '"text"'])
def test_a_json_line_that_is_no_record_is_skipped_not_the_whole_file(tmp_path, pasted):
    """One valid-JSON line that is not a record, pasted between records, made report, compare, recommend and a
    resumed run refuse the whole file, where a line that is not JSON at all was skipped with a warning."""
    path = tmp_path / "r.jsonl"
    append_record(path, Record(trial_id="a", optimizer="adamw", status="ok"))
    with open(path, "a") as handle:
        handle.write(pasted + "\n")
    append_record(path, Record(trial_id="b", optimizer="adamw", status="ok"))
    with pytest.warns(UserWarning, match="line 2: not an optbench record"):
        assert [r.trial_id for r in read_records(path)] == ["a", "b"]


def test_a_file_whose_only_line_is_a_torn_record_reads_as_empty(tmp_path):
    """A sweep killed while writing its first record left a file no rerun could resume ("not a results file")."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(Record(trial_id="a", optimizer="adamw", status="ok").to_dict())[:100])
    with pytest.warns(UserWarning, match="torn last line"):
        assert read_records(path) == []
    path.write_text('{"trial_id": "a", "optim')  # torn text of no record's beginning: still no results file
    with pytest.raises(ResultsFileError, match=":1: not a JSON line"):
        read_records(path)


def test_only_ok_trials_count_as_completed(tmp_path):
    path = tmp_path / "r.jsonl"
    for trial_id, status in [("a", "ok"), ("b", "error"), ("c", "timeout"), ("d", "ok")]:
        append_record(path, Record(trial_id=trial_id, optimizer="adamw", status=status))
    assert completed_trial_ids(path) == {"a", "d"}
    assert completed_trial_ids(tmp_path / "missing.jsonl") == set()


def test_older_and_newer_records_still_read():
    old = Record.from_dict({"trial_id": "a", "optimizer": "adamw", "some_future_field": 3})
    assert old.trial_id == "a" and old.state_bytes is None
