"""The machine's bandwidth, measured once: the calibration, its per-machine file outside the package, the command,
and the report's refusal of an uncalibrated or impossible roofline (committed records included)."""

import dataclasses
import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

from optbench.__main__ import main
from optbench.probes import CACHE_ENV, bandwidth, measure, stream
from optbench.records.environment import machine_key
from optbench.records.record import Record, read_records
from optbench.report import metrics
from optbench.trial import describe

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


@pytest.fixture
def small_buffers(monkeypatch):
    monkeypatch.setattr(stream, "last_level_cache_bytes", lambda: 2 * 2**20)  # 4 MiB operands: quick


def test_a_calibration_is_many_passes_with_its_ceiling_a_high_quantile(small_buffers):
    found = bandwidth.calibrate(CPU, "test-machine", "test cpu", {"git_commit": "abc"}, rounds=3, passes=4)
    q = found.quantiles_bytes_per_s
    assert found.passes == 12 and found.machine == "test-machine" and found.threads == torch.get_num_threads()
    assert q["0.05"] <= q["0.25"] <= q["0.5"] <= q["0.75"] <= q["0.95"]
    assert q["0.5"] <= found.ceiling_bytes_per_s <= q["0.95"] * (1 + 1e-9)  # the 95 % quantile
    assert found.spread_bytes_per_s == q["0.95"] - q["0.05"] and found.env == {"git_commit": "abc"}


def test_a_calibration_measures_every_working_set_from_the_probes_down():
    assert bandwidth.level_operand_bytes(2**30, 4) == [2**30, 2**29, 2**28, 2**27]


def test_calibrated_levels_are_four_operands_each_largest_first(small_buffers):
    found = bandwidth.calibrate(CPU, "m", "cpu", {}, rounds=1, passes=2, levels=3)
    # Two passes of a small level may read unsteady on a busy machine and be left out (kept in unsteady_levels):
    # every level is measured, the kept ones largest first.
    kept = [level.working_set_bytes for level in found.levels]
    measured = kept + [level.working_set_bytes for level in found.unsteady_levels]
    assert sorted(measured, reverse=True) == [8 * 2**20, 4 * 2**20, 2 * 2**20] and kept == sorted(kept, reverse=True)
    assert found.levels[0].ceiling_bytes_per_s == found.ceiling_bytes_per_s and found.buffer_bytes == 2 * 2**20
    assert found.kernel == stream.KERNEL and found.operands == 4 and found.memory_level.working_set_bytes == 8 * 2**20


def _levelled(machine: str = "m") -> bandwidth.BandwidthCalibration:
    """Memory 30 GB/s over 1 GiB; a cache level 90 GB/s over 256 MiB; 150 GB/s over 64 MiB."""
    def level(size_mib: int, rate: float) -> bandwidth.BandwidthLevel:
        quantiles = {"0.05": 0.9 * rate, "0.25": 0.93 * rate, "0.5": 0.95 * rate, "0.75": 0.97 * rate, "0.95": rate}
        return bandwidth.BandwidthLevel(size_mib * 2**20, rate, quantiles, 200)

    levels = (level(1024, 3e10), level(256, 9e10), level(64, 1.5e11))
    return dataclasses.replace(_calibration(machine, low=0.9 * 3e10, high=3e10), buffer_bytes=512 * 2**20,
                               levels=levels)


@pytest.mark.parametrize("working_set_mib, level_mib", [(2048, 1024), (1024, 1024), (364, 256), (100, 64), (8, 64)])
def test_a_step_divides_by_the_largest_working_set_calibrated_no_larger_than_its_own(working_set_mib, level_mib):
    """A step whose weights, grads and state fit a cache of its own streams at that cache's speed: divided by the
    memory's bandwidth it would read above 100 %."""
    assert _levelled().level_for(working_set_mib * 2**20).working_set_bytes == level_mib * 2**20
    assert _levelled().level_for(None).working_set_bytes == 1024 * 2**20


def test_the_roofline_divides_by_the_level_of_the_steps_working_set_and_says_which():
    record = Record(optimizer_step_traffic_bytes=636 * 10**6, weights_bytes=91 * 10**6, grads_bytes=91 * 10**6,
                    state_bytes=182 * 10**6)
    measure.describe_speed(record, [0.5] * 3, [0.017] * 3)
    describe.describe_bandwidth(record, [8.5e10] * 3, _levelled(), "file.json")
    assert record.device_bandwidth_working_set_bytes == 256 * 2**20  # 364 MB: the 256 MiB level
    assert record.roofline_fraction == pytest.approx(636e6 / 0.017 / 9e10)  # 41 %, not 125 % of the memory's
    values = metrics.record_values(record)
    assert values["bandwidth_gb_s"] == pytest.approx(90) and values["bw_working_set_mib"] == pytest.approx(256)
    assert record.device_bandwidth_probe_disagrees is False  # checked against the level it streamed, 81-90 GB/s
    describe.describe_bandwidth(record, [3e10] * 3, _levelled(), "file.json")
    assert record.device_bandwidth_probe_disagrees is True  # the memory's speed: not the machine calibrated


def test_a_calibration_file_from_before_levels_reads_as_its_memory_level(tmp_path):
    path = bandwidth.save(_calibration("m"), tmp_path / "old.json")
    data = json.loads(path.read_text())
    del data["levels"]
    path.write_text(json.dumps(data))
    found = bandwidth.read(path)
    assert found.levels == () and found.level_for(10**6).ceiling_bytes_per_s == 6e10
    assert bandwidth.read(bandwidth.save(_levelled(), tmp_path / "new.json")) == _levelled()


def _calibration(machine: str, low: float = 4.4e10, high: float = 6e10) -> bandwidth.BandwidthCalibration:
    return bandwidth.BandwidthCalibration(machine=machine, device_name="cpu", threads=2, ceiling_bytes_per_s=high,
                                          quantiles_bytes_per_s={"0.05": low, "0.25": 4.5e10, "0.5": 5e10,
                                                                 "0.75": 5.5e10, "0.95": high},
                                          passes=200, buffer_bytes=2**27, kernel=stream.KERNEL)


def test_the_file_is_per_machine_in_the_users_cache_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    machine = machine_key(CPU)
    assert bandwidth.default_path(machine) == tmp_path / "bandwidth" / f"{machine}.json"
    assert str(torch.get_num_threads()) + "-threads" in machine  # a CPU's bandwidth depends on its threads
    path = bandwidth.save(_calibration(machine), bandwidth.default_path(machine))
    found, source = bandwidth.load_for(machine)
    assert found == _calibration(machine) and source == str(path)


def test_without_a_file_or_with_another_machines_the_roofline_is_uncalibrated(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    found, source = bandwidth.load_for("this-machine")
    assert found is None and source.startswith("uncalibrated: no ") and "calibrate-bandwidth" in source
    other = bandwidth.save(_calibration("other-machine"), tmp_path / "given.json")
    monkeypatch.setenv(bandwidth.FILE_ENV, str(other))
    found, source = bandwidth.load_for("this-machine")
    assert found is None and source == f"uncalibrated: {other} is for other-machine, this is this-machine"
    other.write_text("{not json")
    assert bandwidth.load_for("this-machine")[1].startswith(f"uncalibrated: {other}: not a bandwidth calibration")


def test_a_file_measured_with_the_triad_is_not_this_probes_ceiling(tmp_path, monkeypatch):
    """A triad (`a += s * b`, two operands) was beaten by the fused AdamW step it was the ceiling of: a file from
    before the stream kernel names no kernel, reads as the triad's, and is not used until calibrated again."""
    path = bandwidth.save(_calibration("this-machine"), tmp_path / "old.json")
    data = json.loads(path.read_text())
    del data["kernel"]
    path.write_text(json.dumps(data))
    old = bandwidth.read(path)
    assert old.kernel == bandwidth.TRIAD and old.operands == 2 and old.memory_level.working_set_bytes == 2 * 2**27
    monkeypatch.setenv(bandwidth.FILE_ENV, str(path))
    found, source = bandwidth.load_for("this-machine")
    assert found is None and source == (f"uncalibrated: {path} was measured with the triad kernel, the probe now runs "
                                        "fused-adamw (run `python -m optbench calibrate-bandwidth` again)")


def test_a_record_stamps_the_kernel_of_its_calibration():
    record = Record(optimizer_step_traffic_bytes=10**9)
    measure.describe_speed(record, [0.1] * 3, [0.05] * 3)
    describe.describe_bandwidth(record, [5e10] * 3, _calibration("m"), "file.json")
    assert record.device_bandwidth_kernel == stream.KERNEL


@pytest.mark.parametrize("probe,disagrees", [(5e10, False), (4.4e10, False), (4.3e10, True), (6.1e10, True)])
def test_a_trial_probe_outside_the_calibrations_range_is_flagged(probe, disagrees):
    record = Record(optimizer_step_traffic_bytes=10**9, optimizer_step_median_s=0.05)
    measure.describe_speed(record, [0.1] * 3, [0.05] * 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", measure.MeasurementWarning)  # 61 GB/s beats the ceiling: the test below
        describe.describe_bandwidth(record, [probe] * 3, _calibration("m"), "file.json")
    assert record.device_bandwidth_probe_disagrees is disagrees and record.device_bandwidth_bytes_per_s == probe
    assert record.roofline_fraction == pytest.approx(10**9 / 0.05 / 6e10)  # the ceiling, never the probe
    assert metrics.record_values(record)["bw_ceiling"] == ("calibrated; probe disagrees" if disagrees else "calibrated")


def test_a_probe_faster_than_the_ceiling_says_the_calibration_is_stale():
    """A calibration from a slower day: a trial here read its probe at 50.9 GB/s against a 42.1 GB/s ceiling and its
    stored roofline at 1.026. The trial says to calibrate again; a probe inside the range says nothing."""
    record = Record(optimizer_step_traffic_bytes=10**9)
    measure.describe_speed(record, [0.1] * 3, [0.05] * 3)
    with pytest.warns(measure.MeasurementWarning, match=r"streamed 61.0 GB/s, above the calibrated ceiling of 60.0 "
                                                         r"GB/s \(file.json\).*calibrate-bandwidth` again"):
        describe.describe_bandwidth(record, [6.1e10] * 3, _calibration("m"), "file.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        describe.describe_bandwidth(record, [5e10] * 3, _calibration("m"), "file.json")


def test_an_unsteady_calibration_says_so_and_no_roofline_is_shown_against_it():
    """Slowest passes at 48 % of the fastest: the machine changed speed while it was measured (a slowed host read
    7.6-15.5 GB/s here; at rest 24.2-29.4). The record keeps what was measured; the report shows no roofline."""
    unsteady = _calibration("m", low=2.9e10)
    assert _calibration("m").steady and not unsteady.steady
    assert "; unsteady: its slowest passes ran at 48% of its fastest (a steady machine's >= 70%)" in unsteady.describe()
    record = Record(optimizer_step_traffic_bytes=10**9)
    measure.describe_speed(record, [0.1] * 3, [0.02] * 3)
    describe.describe_bandwidth(record, [5e10] * 3, unsteady, "file.json")
    values = metrics.record_values(record)
    assert record.roofline_fraction == pytest.approx(10**9 / 0.02 / 6e10)  # 0.83, kept as measured
    assert values["roofline_pct"] is None and values["bw_ceiling"] == "unsteady calibration"


def test_the_command_writes_no_unsteady_calibration(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(bandwidth, "calibrate", lambda *args, **kwargs: _calibration(machine_key(CPU), low=2.9e10))
    assert main(["calibrate-bandwidth", "--device", "cpu"]) == 2
    out, err = capfd.readouterr()
    assert "unsteady: its slowest passes ran at 48%" in out and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("optbench: error: calibrate-bandwidth not written: the machine changed "
                                            "speed while it was measured (a busy host or neighbour); calibrate again "
                                            "when it is idle")
    assert not (tmp_path / "bandwidth").exists()


def test_asked_to_keep_it_the_command_writes_an_unsteady_calibration_and_says_so(tmp_path, monkeypatch, capsys):
    """reference-results' bracketing calibration after a set of trials: whether the machine held its speed is what
    it is for, so an unsteady one is the finding and is kept; a trial's roofline against it still shows none."""
    monkeypatch.setattr(bandwidth, "calibrate", lambda *args, **kwargs: _calibration(machine_key(CPU), low=2.9e10))
    out = tmp_path / "after.json"
    assert main(["calibrate-bandwidth", "--device", "cpu", "--keep-unsteady", "--out", str(out)]) == 0
    assert "as asked, though unsteady" in capsys.readouterr().out
    assert not bandwidth.read(out).steady


def test_an_uncalibrated_record_has_no_roofline_and_says_why():
    record = Record(optimizer_step_traffic_bytes=10**9)
    measure.describe_speed(record, [0.1], [0.01])
    describe.describe_bandwidth(record, [5e10], None, "uncalibrated: no file")
    values = metrics.record_values(record)
    assert record.roofline_fraction is None and values["roofline_pct"] is None
    assert values["bw_ceiling"] == "uncalibrated"
    old = Record(optimizer_step_traffic_bytes=10**9, roofline_fraction=1.09, device_bandwidth_bytes_per_s=4e10)
    assert metrics.record_values(old)["roofline_pct"] is None  # divided by its own per-trial probe: not shown


def test_the_command_writes_into_the_cache_and_never_into_the_package(tmp_path, monkeypatch, capsys, small_buffers):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    # 20 passes over 4 MiB buffers spread too widely to be steady; steadiness has its own tests above
    monkeypatch.setattr(bandwidth, "steady_calibration", lambda ceiling, spread: True)
    package = sorted(p for p in (ROOT / "optbench").rglob("*") if "__pycache__" not in p.parts)
    assert main(["calibrate-bandwidth", "--device", "cpu", "--rounds", "2", "--passes", "10"]) == 0
    written = bandwidth.default_path(machine_key(CPU))
    data = json.loads(written.read_text())
    assert written.parent == tmp_path / "bandwidth" and data["passes"] == 20 and "git_dirty" in data["env"]
    assert f"wrote {written}" in capsys.readouterr().out
    assert sorted(p for p in (ROOT / "optbench").rglob("*") if "__pycache__" not in p.parts) == package


def test_too_few_passes_for_a_spread_are_refused_before_measuring(tmp_path, monkeypatch, capsys):
    """`--rounds 1 --passes 1` wrote a calibration whose "5-95 %" range came from one pass."""
    monkeypatch.setattr(bandwidth, "calibrate", lambda *args, **kwargs: pytest.fail("measured"))
    out = tmp_path / "b.json"
    assert main(["calibrate-bandwidth", "--device", "cpu", "--rounds", "1", "--passes", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        "optbench: error: --rounds 1 x --passes 1 is 1 timed passes; a calibration needs at least 20 for its 5-95 % "
        "range to be a spread, not the slowest and fastest pass")
    assert not out.exists()


@pytest.mark.parametrize("out, says", [("folder", "it is a folder"),
                                       ("file/bw.json", "is a file, not a folder")])
def test_an_out_that_cannot_be_written_is_refused_before_measuring(tmp_path, monkeypatch, capsys, out, says):
    """`--out` a folder, or a path through a file, failed only after every pass was measured (and said only
    "File exists" for the second)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(bandwidth, "calibrate", lambda *args, **kwargs: pytest.fail("measured"))
    assert main(["calibrate-bandwidth", "--device", "cpu", "--out", str(tmp_path / out)]) == 2
    assert says in capsys.readouterr().err


def test_more_threads_than_cores_is_said(tmp_path, monkeypatch, capsys):
    import os

    def stop(*args, **kwargs):
        raise bandwidth.BandwidthError("measuring is not this test's")

    monkeypatch.setattr(bandwidth, "calibrate", stop)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process keeps its threads
    threads = len(os.sched_getaffinity(0)) + 1
    assert main(["calibrate-bandwidth", "--device", "cpu", "--threads", str(threads), "--out",
                 str(tmp_path / "b.json")]) == 2
    assert f"--threads {threads} is more than the" in capsys.readouterr().err


def test_the_command_refuses_a_device_that_is_not_there(capfd):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["calibrate-bandwidth", "--device", "cuda"]) == 2
    assert "sees no CUDA device" in capfd.readouterr().err


def test_no_committed_record_has_a_roofline_above_one():
    """Every results file under results/, read through its schema: no roofline above 1.0. The ratios above 1.0 that
    were stored are kept as measured under the names that say what they are: over a triad (a kernel the fused AdamW
    step outstreams: 1.73 in unsteady/; schema 4 reads it back as `triad_roofline_fraction`), or over a stream-kernel
    ceiling the step outran (roofline-steady/, roofline-paired-2/, roofline-two-thread-control/; schema 5 reads it
    back as `ceiling_outrun_fraction`), and the tables show those as failed calibrations, never as figures."""
    from optbench.report.frame import aggregate

    roofline = next(m for m in metrics.METRICS if m.column == "roofline_pct")
    above, outran, triad = [], [], []
    for path in sorted((ROOT / "results").rglob("*.jsonl")):
        for record in read_records(path):
            if record.roofline_fraction is not None and record.roofline_fraction > 1:
                above.append(f"{path.relative_to(ROOT)}: {record.optimizer} {record.roofline_fraction:.3f}")
            if record.ceiling_outrun_fraction is not None:
                outran.append(record)
                assert record.ceiling_outrun_fraction > 1 and record.roofline_fraction is None
                shown = aggregate(roofline, pd.Series([metrics.record_values(record)["roofline_pct"]]))
                assert shown["roofline_pct"] is None, shown
            if record.triad_roofline_fraction is not None:
                triad.append(record)
                written_in = record.upgraded_from_schema or record.schema_version
                assert record.device_bandwidth_kernel is None and written_in < 4
                assert metrics.record_values(record)["roofline_pct"] is None
    assert not above
    assert outran and any(r.triad_roofline_fraction > 1 for r in triad)  # the history is kept, not dropped


def test_a_step_that_outruns_its_ceiling_keeps_the_ratio_and_has_no_roofline():
    """636 MB in 10 ms against a 60 GB/s ceiling: 1.06, a ceiling mis-measured for this trial. The record keeps the
    ratio as `ceiling_outrun_fraction`, never as `roofline_fraction`; the table says `calib. fail`."""
    from optbench.report.frame import aggregate

    record = Record(optimizer_step_traffic_bytes=636 * 10**6)
    measure.describe_speed(record, [0.1] * 3, [0.01] * 3)
    describe.describe_bandwidth(record, [5e10] * 3, _calibration("m"), "file.json")
    assert record.roofline_fraction is None
    assert record.ceiling_outrun_fraction == pytest.approx(636e6 / 0.01 / 6e10)
    roofline = next(m for m in metrics.METRICS if m.column == "roofline_pct")
    shown = aggregate(roofline, pd.Series([metrics.record_values(record)["roofline_pct"]]))
    assert shown["roofline_pct"] is None and shown["roofline_pct_invalid"] == 1
    again = Record.from_dict(record.to_dict())
    assert again.roofline_fraction is None and again.ceiling_outrun_fraction == record.ceiling_outrun_fraction


@pytest.mark.parametrize("stored, roofline, outran", [(1.171, None, 1.171), (0.84, 0.84, None), (1.0, 1.0, None)])
def test_a_schema_4_ratio_above_one_reads_back_as_a_ceiling_outrun(stored, roofline, outran):
    """Schema 4 -> 5: a stream-kernel ratio above 1.0 moves to `ceiling_outrun_fraction`; one at or below stays."""
    record = Record.from_dict({"schema_version": 4, "trial_id": "t", "roofline_fraction": stored,
                               "device_bandwidth_kernel": "fused-adamw"})
    assert record.roofline_fraction == roofline and record.ceiling_outrun_fraction == outran


def test_a_record_from_before_the_stream_kernel_reads_its_triad_ratio_back_as_no_roofline():
    """Schema 3 -> 4: a record without device_bandwidth_kernel divided by a triad; a stream-kernel record and a record
    written now keep their roofline."""
    triad = Record.from_dict({"schema_version": 3, "trial_id": "t", "roofline_fraction": 1.15,
                              "optimizer_step_traffic_bytes": 10**9, "device_bandwidth_calibrated_bytes_per_s": 3.3e10})
    assert triad.roofline_fraction is None and triad.triad_roofline_fraction == 1.15
    assert metrics.record_values(triad)["roofline_pct"] is None
    assert metrics.triad_roofline_pct(triad) == pytest.approx(115)
    assert metrics.record_values(triad)["bw_ceiling"] == "a triad's: no ceiling"
    stream_kernel = Record.from_dict({"schema_version": 3, "trial_id": "t", "roofline_fraction": 0.8,
                                      "device_bandwidth_kernel": "fused-adamw"})
    assert stream_kernel.roofline_fraction == 0.8 and stream_kernel.triad_roofline_fraction is None
    now = Record(roofline_fraction=0.8, device_bandwidth_kernel="fused-adamw")
    assert Record.from_dict(now.to_dict()).roofline_fraction == 0.8


def test_a_trials_probe_streams_its_steps_working_set_not_the_memory_level(monkeypatch):
    """Calibrated: the level the roofline divides by, one operand of four. Uncalibrated: a quarter of the step's
    working set per operand, between 1 MiB and the memory level's operands (on a host with a 480 MiB cache that
    level was 1.9 GB a call)."""
    monkeypatch.setattr(stream, "last_level_cache_bytes", lambda: 480 * 2**20)
    assert bandwidth.probe_operand_bytes(CPU, 364 * 2**20, _levelled()) == 64 * 2**20  # the 256 MiB level
    assert bandwidth.probe_operand_bytes(CPU, 364 * 2**20, None) == 91 * 2**20
    assert bandwidth.probe_operand_bytes(CPU, 10_000, None) == 2**20
    assert bandwidth.probe_operand_bytes(CPU, 10 * 2**30, None) == 480 * 2**20
    assert bandwidth.probe_operand_bytes(CPU, None, None) == 480 * 2**20


def test_a_trial_probes_its_working_set_and_records_it():
    from optbench.job.spec import TrialSpec
    from optbench.trial.run import run_trial

    spec = TrialSpec(optimizer="adamw", workload="tiny", device="cpu", steps=3, warmup_steps=1, batch_size=2,
                     seq_len=8, eval_size=4)
    record = run_trial(spec)
    assert record.status == "ok", record.error
    working_set = record.weights_bytes + record.grads_bytes + record.state_bytes
    assert record.device_bandwidth_probe_working_set_bytes == 2 * max(2**20, working_set // 2)
    assert record.device_bandwidth_bytes_per_s > 0


def test_an_unsteady_smaller_level_is_left_out_and_its_steps_divide_by_the_next_larger(monkeypatch, small_buffers):
    """Measured here: 240 MiB and up steady at 38-41 GB/s, 120 and 60 MiB at 59 % and 66 % of their fastest (a
    shared cache's speed moves with its neighbours). The calibration is written with the steady levels; the others
    are kept in the file, said to be left out, and a step of their size divides by the next larger level."""
    def level(size_mib: int, rate: float, low: float) -> bandwidth.BandwidthLevel:
        quantiles = {"0.05": low * rate, "0.25": 0.95 * rate, "0.5": 0.97 * rate, "0.75": 0.98 * rate, "0.95": rate}
        return bandwidth.BandwidthLevel(size_mib * 2**20, rate, quantiles, 200)

    measured = iter([level(8, 3.8e10, 0.9), level(4, 4.1e10, 0.85), level(2, 6.5e10, 0.59)])
    monkeypatch.setattr(bandwidth, "measure_level", lambda *args: next(measured))
    found = bandwidth.calibrate(CPU, "m", "cpu", {}, rounds=1, passes=1, levels=3)
    assert found.steady and [lv.working_set_bytes for lv in found.levels] == [8 * 2**20, 4 * 2**20]
    assert [lv.working_set_bytes for lv in found.unsteady_levels] == [2 * 2**20]
    assert found.level_for(3 * 2**20).working_set_bytes == 4 * 2**20  # the smallest steady level
    said = found.describe()
    assert "unsteady: its slowest passes ran at 59% of its fastest" in said and "left out" in said
    assert bandwidth.read(bandwidth.save(found, Path(bandwidth.cache_dir()) / "x.json")) == found
