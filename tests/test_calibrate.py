"""Calibrating the peak predictor (memory/calibrate.py) and measuring it on held-out trials (memory/validation.py):
known figures recovered from records built to match them, the error band of known errors, records the band cannot
use left out loudly, where calibrations are read from and written to (the user's file first, the package's
read-only), and `python -m optbench.memory.calibrate` end to end on tiny constructed records."""

import dataclasses
import json
import math
import statistics

import pytest

from optbench.job.spec import TrialSpec
from optbench.memory import calibrate as cal
from optbench.memory import calibration as store
from optbench.memory import predict
from optbench.memory.calibration import Calibration, CalibrationSet, ErrorBand
from optbench.memory.validation import LeftOutWarning
from optbench.optimizers import resolve
from optbench.records.record import MIB, Record, append_record

TINY = TrialSpec(optimizer="adamw", workload="tiny", device="cpu", batch_size=8, seq_len=32)
CAL = Calibration(device_kind="cpu", model="made-up-bert", precision="fp32", bytes_per_token_layer=40_000,
                  bytes_per_s2_layer=12.0, retained_fraction=0.5, overhead_bytes=50 * MIB, trial_ids=("a", "b"))
TRUTH = Calibration(device_kind="cpu", model="tiny-bert-h64", precision="fp32", bytes_per_token_layer=30_000,
                    bytes_per_s2_layer=20.0, retained_fraction=0.8, overhead_bytes=40 * MIB)
SHAPES = [("adamw", 4, 32), ("adafactor", 16, 64), ("adamw8bit", 64, 32), ("adamw", 8, 256),
          ("adafactor", 32, 128), ("adamw8bit", 2, 128), ("adamw", 128, 64), ("adamw", 16, 16),
          ("sgd_momentum", 48, 96)]


def synthetic(shapes, truth=TRUTH, errors=None):
    """Records whose measured peak is what `truth` predicts, times (1 + error)."""
    facts = predict.facts_for_spec(TINY)
    records = []
    for index, (name, batch, seq) in enumerate(shapes):
        peak = predict.predict_peak(facts, resolve(name), batch_size=batch, seq_len=seq, calibration=truth).total_bytes
        peak = round(peak * (1 + (errors[index] if errors else 0.0)))
        weights = 4 * sum(p.numel for p in facts.params)
        records.append(Record(trial_id=f"t{index}", status="ok", optimizer=name, workload="tiny",
                              model="tiny-bert-h64", device="cpu", batch_size=batch, seq_len=seq,
                              weights_bytes=weights, peak_rss_growth_bytes=peak - weights))
    return records


def test_calibrate_recovers_known_figures_and_says_which_trials():
    truth = dataclasses.replace(TRUTH, library_overhead_bytes={"bitsandbytes": 100 * MIB, "transformers": -20 * MIB})
    found = cal.calibrate(synthetic(SHAPES, truth), sources=["made-up.jsonl"])
    assert found.trial_ids == tuple(f"t{i}" for i in range(len(SHAPES))) and found.sources == ("made-up.jsonl",)
    assert found.model == "tiny-bert-h64" and found.device_kind == "cpu" and found.precision == "fp32"
    assert found.fit_worst_abs_error < 1e-3
    assert found.bytes_per_token_layer == pytest.approx(30_000, rel=0.02)
    assert found.bytes_per_s2_layer == pytest.approx(20.0, rel=0.05)
    assert found.overhead_bytes == pytest.approx(40 * MIB, rel=0.05)
    assert found.library_overhead_bytes == pytest.approx({"bitsandbytes": 100 * MIB, "transformers": -20 * MIB},
                                                         rel=0.05)  # torch, the most tried, is the base


def test_libraries_tried_once_get_no_overhead_of_their_own():
    records = synthetic(SHAPES[:7] + [("lion8bit", 8, 32)])
    assert cal.calibrate(records).library_overhead_bytes.keys() == {"bitsandbytes", "transformers"}
    five = cal.calibrate(records[:5])  # torch and transformers twice each, bitsandbytes once
    assert five.library_overhead_bytes.keys() == {"transformers"} and five.s2_scale == 1.0  # β fixed: too few
    assert cal.calibrate(records[:4]).library_overhead_bytes == {}


def test_calibrate_refuses_mixed_models_and_skips_failed_trials():
    records = synthetic(SHAPES[:3])
    records[0] = dataclasses.replace(records[0], model="tiny-bert-h128", workload_options={"hidden_size": 128})
    with pytest.raises(cal.CalibrationError, match="one model"):
        cal.calibrate(records)
    failed = dataclasses.replace(records[1], status="oom", trial_id="failed")
    with pytest.warns(LeftOutWarning, match=r"calibration: left out 1 of 3 records: 1 status oom$"):
        assert "failed" not in cal.calibrate([failed, *records[1:]]).trial_ids


def test_validation_table_and_error_band_of_known_errors():
    errors = [0.10, -0.05, 0.02, -0.20, 0.04]
    records = synthetic(SHAPES[:5], errors=errors)
    fitted = CalibrationSet("cpu", {"tiny-bert-h64": dataclasses.replace(TRUTH, trial_ids=("t0",))})
    table = cal.validation_table(records, fitted)
    assert list(table["held_out"]) == [False, True, True, True, True]
    # measured = predicted x (1 + e), so (predicted - measured) / measured = -e / (1 + e)
    assert table["error_pct"].tolist() == pytest.approx([-100 * e / (1 + e) for e in errors], abs=1e-3)
    band = cal.error_band(table, "cpu", "somewhere.md")
    held = [-e / (1 + e) for e in errors[1:]]
    assert band.trials == 4 and band.table == "somewhere.md"
    assert band.median_abs_error == pytest.approx(statistics.median(abs(e) for e in held))
    assert band.worst_abs_error == pytest.approx(0.2 / 0.8) and band.share_under == pytest.approx(0.5)
    assert band.worst_under == pytest.approx(0.04, abs=1e-6) and band.safety_margin == band.worst_under
    assert "4 held-out cpu trials" in band.describe() and "50 % under-predicted" in band.describe()


def test_the_shipped_cpu_calibration_names_its_trials():
    shipped = predict.load_calibrations("cpu")
    for name, calibration in shipped.models.items():
        assert calibration.model == name and len(calibration.trial_ids) >= 4 and calibration.sources
        assert math.isfinite(calibration.bytes_per_token_layer) and calibration.bytes_per_token_layer > 1000


def test_the_uncalibrated_band_comes_from_its_own_column():
    records = synthetic(SHAPES[:3], errors=[0.1, -0.1, 0.0])
    table = cal.validation_table(records, CalibrationSet("cpu", {"tiny-bert-h64": TRUTH}))
    assert table["error_pct"].abs().max() == pytest.approx(100 * 0.1 / 0.9, abs=1e-3)
    table["uncalibrated_error_pct"] = [-30.0, 10.0, 20.0]
    band = cal.error_band(table, "cpu", calibrated=False)
    assert not band.calibrated and band.worst_under == pytest.approx(0.3 / 0.7) and band.share_under == pytest.approx(
        1 / 3)
    assert band.describe().startswith("uncalibrated predictor error")


def test_records_the_band_cannot_use_are_left_out_with_one_warning_counting_each_reason():
    good = synthetic(SHAPES[:3])
    bad = [dataclasses.replace(good[0], trial_id="oom", status="oom"),
           dataclasses.replace(good[1], trial_id="curve", eval_curve=[[2, 0.1, 0.5]]),
           dataclasses.replace(good[1], trial_id="resumed", resume_check=True),
           dataclasses.replace(good[2], trial_id="unknown", optimizer="no-such-optimizer")]
    with pytest.warns(LeftOutWarning) as caught:
        table = cal.validation_table(good + bad, CalibrationSet("cpu", {"tiny-bert-h64": TRUTH}))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith("predictor validation: left out 4 of 7 records: ")
    for reason in ("1 status oom", "1 --eval-every (evaluations inside the memory window)",
                   "1 --resume-check (a checkpoint in the peak)",
                   "1 the predictor cannot model (UnknownOptimizerError)"):
        assert reason in message
    assert list(table["trial_id"]) == ["t0", "t1", "t2"] and sum(table.attrs["left_out"].values()) == 4


def test_the_users_calibration_takes_precedence_and_the_shipped_one_is_read_only(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "cache"))
    shipped = store.load_calibrations("cpu")
    assert store.calibration_path("cpu") == store.shipped_calibration_path("cpu") and shipped.models
    band = ErrorBand(device_kind="cpu", trials=3, median_abs_error=0.1, worst_abs_error=0.2, worst_under=0.15,
                     share_under=0.25)  # bands are stored to 4 decimals
    written = CalibrationSet("cpu", {"made-up-bert": dataclasses.replace(CAL, library_overhead_bytes={"x": 1.0})},
                             band, dataclasses.replace(band, calibrated=False))
    path = store.save_calibrations(written)
    assert path == tmp_path / "cache" / "calibrations" / "cpu.json" == store.calibration_path("cpu")
    assert store.load_calibrations("cpu") == written  # read back, in place of the shipped one
    assert store.load_calibrations("cuda") == CalibrationSet("cuda")  # neither file: nothing calibrated
    before = store.shipped_calibration_path("cpu").read_bytes()
    with pytest.raises(store.CalibrationError, match="read-only"):
        store.save_calibrations(written, store.shipped_calibration_path("cpu"))
    assert store.shipped_calibration_path("cpu").read_bytes() == before
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "elsewhere"))
    assert store.load_calibrations("cpu") == shipped  # no user file there: the shipped one again


def _write(path, records):
    for record in records:
        append_record(path, record)
    return path


def test_calibrate_main_end_to_end_writes_the_users_file_and_never_the_package(tmp_path, monkeypatch, capsys):
    """Fit on nine constructed trials, validate on five others (one failed: left out, and said so), and the
    predictor of this machine then uses the fit; the shipped calibration folder is left byte for byte."""
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "cache"))
    shipped_dir = store.SHIPPED_DIR
    shipped_before = {p.name: p.read_bytes() for p in shipped_dir.iterdir()}
    fit_on = _write(tmp_path / "fit.jsonl", synthetic(SHAPES))
    held = [dataclasses.replace(r, trial_id=f"h{i}") for i, r in enumerate(synthetic(
        [("adamw", 12, 48), ("adafactor", 6, 96), ("adamw8bit", 24, 64), ("sgd_momentum", 3, 200)],
        errors=[0.05, -0.1, 0.0, 0.02]))]
    held.append(dataclasses.replace(held[0], trial_id="failed", status="oom"))
    held_out = _write(tmp_path / "held.jsonl", held)
    argv = ["--calibrate-on", str(fit_on), "--held-out", str(held_out), "--out-dir", str(tmp_path / "out")]
    assert cal.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"optbench.memory.calibrate: warning: held-out band ({held_out}): left out 1 "
                                         "of 5 records: 1 status oom"]  # one line, said once
    out = captured.out.splitlines()
    assert out[0].startswith("predictor error on 4 held-out cpu trials")
    user_file = tmp_path / "cache" / "calibrations" / "cpu.json"
    assert out[1] == f"wrote {user_file}; predictions on this machine read it from now on"
    saved = json.loads(user_file.read_text())
    assert set(saved["models"]) >= {"tiny-bert-h64", *store.read_calibrations(shipped_dir / "cpu.json", "cpu").models}
    assert saved["models"]["tiny-bert-h64"]["bytes_per_token_layer"] == pytest.approx(30_000, rel=0.02)
    assert saved["validation"]["trials"] == 4
    assert "left out of the band: 1 status oom" in (tmp_path / "out" / "held-out.md").read_text()
    assert (tmp_path / "out" / "calibration.md").is_file() and (tmp_path / "out" / "held-out.csv").is_file()
    used = predict.predict_peak(predict.facts_for_spec(TINY), resolve("adamw"), batch_size=8, seq_len=32)
    assert used.calibrated and "9 cpu trials of tiny-bert-h64" in used.basis
    assert {p.name: p.read_bytes() for p in shipped_dir.iterdir()} == shipped_before


def test_calibrate_main_refuses_the_package_folder_and_writes_where_it_is_told(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "cache"))
    held_out = _write(tmp_path / "held.jsonl", synthetic(SHAPES[:3]))
    shipped = store.shipped_calibration_path("cpu")
    before = shipped.read_bytes()
    base = ["--held-out", str(held_out), "--out-dir", str(tmp_path / "out")]
    assert cal.main([*base, "--calibration-file", str(shipped)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "read-only" in err[0] and shipped.read_bytes() == before
    assert cal.main([*base, "--calibration-file", str(tmp_path / "mine.json")]) == 0
    assert "copy it there to use it" in capsys.readouterr().out
    assert json.loads((tmp_path / "mine.json").read_text())["validation"]["trials"] == 3
    assert not (tmp_path / "cache").exists()  # the user's file was not touched


@pytest.mark.parametrize("make,message", [
    (lambda d: (d / "bad.jsonl").write_text("not json\n"), "bad.jsonl:1: not a JSON line"),
    (lambda d: (d / "bad.jsonl").mkdir(), "no such results file (or a folder)"),
    (lambda d: (d / "bad.jsonl").write_bytes(b"\xff\xfe\x00"), "bad.jsonl: not UTF-8 text"),
])
def test_calibrate_main_says_a_bad_results_file_in_one_line(tmp_path, monkeypatch, capfd, make, message):
    """A file that is no results file, a folder named as one, and binary bytes ended in tracebacks (the folder's
    with 'no such results file', which it is not: it exists)."""
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "cache"))
    make(tmp_path)
    assert cal.main(["--calibrate-on", str(tmp_path / "bad.jsonl"), "--out-dir", str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0], err


def test_calibrate_main_says_an_out_dir_that_is_a_file_in_one_line(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("OPTBENCH_CACHE", str(tmp_path / "cache"))
    fit_on = _write(tmp_path / "fit.jsonl", synthetic(SHAPES))
    (tmp_path / "out").write_text("a file")
    assert cal.main(["--calibrate-on", str(fit_on), "--out-dir", str(tmp_path / "out")]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"optbench.memory.calibrate: cannot write {tmp_path / 'out'}"), err


def test_the_bandwidth_and_the_memory_calibration_share_one_cache_folder(tmp_path, monkeypatch):
    """Each resolved $OPTBENCH_CACHE on its own, and only the memory calibration expanded a leading ~: with
    OPTBENCH_CACHE='~/oc' the bandwidth file went to a folder literally named '~' under the working directory."""
    from optbench.probes import bandwidth

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("OPTBENCH_CACHE", "~/oc")
    monkeypatch.delenv(bandwidth.FILE_ENV, raising=False)
    assert store.user_calibration_path("cpu") == tmp_path / "oc" / "calibrations" / "cpu.json"
    assert bandwidth.default_path("m") == tmp_path / "oc" / "bandwidth" / "m.json"
