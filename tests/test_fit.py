"""`optbench fit`: the growth search against a fake predictor and a fake trial runner, its decisions on
constructed records, the table and the figure, and one real search through the command line (the tiny job, a
grid of three sizes: one confirming trial in a fresh process)."""

import dataclasses

import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from optbench.__main__ import main
from optbench.job.spec import TrialSpec
from optbench.memory import fit
from optbench.records.record import MIB, Record, read_records

BUDGET = 1000 * MIB
SIZES = fit.candidate_sizes("batch", 256)  # 1, 2, 4, 8, 16, ..., 256


def linear(per_sample_mib: float, fixed_mib: float = 200):
    return lambda size: (fixed_mib + per_sample_mib * size) * MIB


def measuring(truth, status_at=None):
    """A fake trial runner measuring `truth` (and logging the sizes it was asked for)."""
    asked = []

    def measure(size):
        asked.append(size)
        status = (status_at or {}).get(size, "ok")
        return fit.Probe(size, status, round(truth(size)) if status == "ok" else None, samples_per_s=size / 2.0)

    return measure, asked


def test_an_exact_prediction_is_confirmed_by_two_trials():
    truth = linear(10)  # 200 + 10 b MiB: b = 80 is exactly 1000 MiB, 88 is over
    measure, asked = measuring(truth)
    found = fit.grow(SIZES, truth, measure, BUDGET)
    assert asked == [80, 88] and found.size == 80 and found.predicted_size == 80 and found.confirmed
    assert found.reason == "the next size measured over" and found.probe_at(80).samples_per_s == 40.0


def test_an_optimistic_prediction_steps_down_rescaled_by_what_was_measured():
    measure, asked = measuring(linear(12.5))  # really 200 + 12.5 b: b = 64 fits (1000), 72 is over
    found = fit.grow(SIZES, linear(10), measure, BUDGET)
    assert found.predicted_size == 80 and found.size == 64 and found.confirmed
    assert asked[0] == 80 and asked[-2:] in ([64, 72], [72, 64]) and len(asked) <= 4


def test_a_pessimistic_prediction_steps_up():
    measure, asked = measuring(linear(8))  # really 200 + 8 b: b = 96 fits (968), 104 is over (1032)
    found = fit.grow(SIZES, linear(10), measure, BUDGET)
    assert found.predicted_size == 80 and found.size == 96 and found.confirmed and asked[0] == 80


def test_an_oom_above_confirms_and_an_error_counts_as_not_fitting():
    measure, asked = measuring(linear(10), status_at={88: "oom"})
    found = fit.grow(SIZES, linear(10), measure, BUDGET)
    assert found.size == 80 and found.confirmed and found.probe_at(88).status == "oom"
    assert "88: oom" in found.probe_at(88).describe(BUDGET)


def test_nothing_fits_and_everything_fits():
    measure, _ = measuring(linear(10, fixed_mib=2000))
    nothing = fit.grow(SIZES, linear(10, fixed_mib=2000), measure, BUDGET)
    assert nothing.size is None and nothing.predicted_size is None and nothing.confirmed
    assert nothing.reason.startswith("nothing fits")
    measure, asked = measuring(linear(1))
    everything = fit.grow(SIZES, linear(1), measure, BUDGET)
    assert everything.size == 256 and not everything.confirmed and asked == [256]
    assert "grid's largest size (256)" in everything.reason


def test_the_search_stops_after_its_trial_budget():
    wobbly = iter([1200, 900, 1200, 900, 1200, 900, 1200])  # a measurement that never settles

    def measure(size):
        return fit.Probe(size, "ok", next(wobbly) * MIB * size / 80)

    found = fit.grow(SIZES, linear(10), measure, BUDGET, max_probes=3)
    assert len(found.probes) == 3 and not found.confirmed and found.reason == "not bracketed after 3 sizes"


def test_candidate_grids():
    assert fit.candidate_sizes("batch", 40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert fit.candidate_sizes("seq", 64) == [16, 32, 48, 64]


TINY_JOB = TrialSpec(optimizer="adamw", workload="tiny", device="cpu", batch_size=8, seq_len=32, eval_size=64)


def fake_run(truth_mib_per_sample, jitter_mib=0.0, kept=None):
    """A trial runner that builds a record instead of training: peak = 20 MiB + k x batch, plus `jitter_mib` on
    seed 1 (a rerun's RSS moving by pages); `kept` collects the records, as the results file would."""
    clock = iter(range(10**6))

    def run(spec, out_path, progress):
        peak = (20 + truth_mib_per_sample[spec.optimizer] * spec.batch_size + jitter_mib * (spec.seed == 1)) * MIB
        record = Record(trial_id=spec.trial_id, status="ok", optimizer=spec.optimizer, device="cpu", seed=spec.seed,
                        workload=spec.workload, model=spec.workload, batch_size=spec.batch_size, seq_len=spec.seq_len,
                        weights_bytes=8 * MIB, peak_rss_growth_bytes=round(peak) - 8 * MIB,
                        peak_rss_bytes=round(peak) + 500 * MIB, predicted_peak_bytes=round(peak),
                        samples_per_s=1000.0 / spec.batch_size + spec.batch_size,
                        started_at=f"2026-01-01T00:00:{next(clock):06d}")
        if kept is not None:
            kept.append(record)
        return record
    return run


def test_fit_table_render_and_figure(tmp_path, monkeypatch):
    run = fake_run({"adamw": 1.0, "adafactor": 0.5})
    result = fit.fit(100 * MIB, ["adamw", "adafactor"], tmp_path / "fit.jsonl", job=TINY_JOB, max_size=512,
                     progress=None, run=run)
    table = fit.fit_table(result)
    assert list(table["optimizer"]) == ["adamw", "adafactor"]
    assert list(table["largest batch"]) == [80, 160] and all(table["confirmed"])
    assert table["peak MiB"].tolist() == [100.0, 100.0] and table["jitter MiB"].tolist() == [0.0, 0.0]
    assert table["process peak MiB"].tolist() == [600.0, 600.0]
    assert table["samples/s"].tolist() == [1000 / 80 + 80, 1000 / 160 + 160]
    assert table["trials"][0].endswith("80: 0.10 GiB ±0 MiB fits; 88: 0.11 GiB ±0 MiB over")
    text = fit.render(result)
    assert "largest batch within 100.00 MiB per optimizer: tiny, seq 32, fp32, cpu" in text
    assert "budget covers weights + peak RSS growth" in text and "not budgeted" in text
    tiny = fit.fit(MIB, ["adamw"], tmp_path / "tiny.jsonl", job=TINY_JOB, max_size=512, progress=None, run=run)
    assert "largest batch within 1.00 MiB per optimizer" in fit.render(tiny)  # it read "0.00 GiB"
    drawn, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (drawn.append(fig), save(fig, path, **kw))[1])
    table_path, figure_path = fit.save(result, tmp_path / "fit.jsonl")
    assert table_path.read_text() == text and imread(figure_path).shape[:2] == (round(4.4 * 130), round(11 * 130))
    largest, speed = drawn[0].axes
    assert [round(bar.get_height()) for bar in largest.patches] == [80, 160]  # the largest batch per optimizer
    assert [bar.get_height() for bar in speed.patches] == pytest.approx(table["samples/s"].tolist())
    assert [t.get_text() for t in largest.get_xticklabels()] == ["adamw", "adafactor"]
    assert {bar.get_hatch() or "" for bar in largest.patches} == {""}  # both confirmed: no hatching


def test_a_size_within_its_own_jitter_of_the_budget_is_too_close_to_call(tmp_path):
    """20 + b MiB, seed 1 16 MiB higher, against 110 MiB: b = 80 reads 100 and 116 MiB (neither fits nor over), and
    a size fits only when its largest peak is 16 MiB under the budget: 20 + b + 16 + 16 <= 110, so b = 56."""
    run = fake_run({"adamw": 1.0}, jitter_mib=16)
    result = fit.fit(110 * MIB, ["adamw"], tmp_path / "fit.jsonl", job=TINY_JOB, max_size=512, progress=None,
                     run=run)
    growth = result.growths["adamw"]
    assert growth.size == 56 and growth.confirmed and growth.reason == "the next size measured too close to call"
    assert growth.probe_at(80).describe(110 * MIB) == "80: 0.11 GiB ±16 MiB too close to call"
    assert growth.probe_at(56).jitter_bytes == 16 * MIB and growth.probe_at(56).repeats == fit.REPEATS


def test_one_failed_repeat_makes_the_size_fail():
    ok = Record(status="ok", weights_bytes=MIB, peak_rss_growth_bytes=MIB, device="cpu")
    probe = fit.probe_from_records(8, [ok, Record(status="oom", device="cpu")])
    assert probe.status == "oom" and not probe.fits(10**12) and probe.verdict(10**12) == "over"


def test_the_table_rebuilt_from_the_records_is_the_table_the_search_printed(tmp_path):
    kept: list[Record] = []
    run = fake_run({"adamw": 1.0, "adafactor": 0.5}, jitter_mib=2, kept=kept)
    live = fit.fit(100 * MIB, ["adamw", "adafactor"], tmp_path / "fit.jsonl", job=TINY_JOB, max_size=512,
                   progress=None, run=run)
    rebuilt = fit.result_from_records(kept, 100 * MIB)
    # the search predicts with the real predictor, the fake records carry the truth as their prediction
    assert fit.fit_table(rebuilt).drop(columns="predicted batch").equals(
        fit.fit_table(live).drop(columns="predicted batch"))
    first = rebuilt.growths["adamw"].probes[0]
    assert rebuilt.growths["adamw"].predicted_size == (first.size if first.predicted_bytes <= 100 * MIB else None)


def test_fit_asks_for_at_least_two_trials_per_size(tmp_path):
    with pytest.raises(ValueError, match="at least two trials per size"):
        fit.fit(100 * MIB, ["adamw"], tmp_path / "fit.jsonl", job=TINY_JOB, progress=None, run=fake_run({}),
                repeats=1)


def test_probe_specs_are_short_and_capped():
    spec = fit.probe_spec(TINY_JOB, "adamw8bit", "seq", 128, 100 * MIB)
    assert (spec.optimizer, spec.seq_len, spec.batch_size) == ("adamw8bit", 128, 8)
    assert (spec.steps, spec.warmup_steps, spec.eval_every) == (fit.PROBE_STEPS, fit.PROBE_WARMUP_STEPS, 0)
    assert spec.max_memory_bytes == 200 * MIB + 2**30  # CPU: a runaway guard, twice the budget + 1 GiB
    cuda = fit.probe_spec(dataclasses.replace(TINY_JOB, device="cuda"), "adamw", "batch", 8, 100 * MIB)
    assert cuda.max_memory_bytes == 100 * MIB  # CUDA: the budget is the allocator's limit


def test_a_job_where_every_probe_fails_is_a_table_of_failures_and_an_empty_figure(tmp_path):
    """Constructed records: every confirming trial ended `error` (a broken optimizer, a bad device): nothing fits,
    which the table says per trial, and the figure still draws (empty bars) instead of failing on the missing size."""
    def broken(spec, out_path, progress):
        return Record(trial_id=spec.trial_id, status="error", error="boom", optimizer=spec.optimizer, device="cpu")

    result = fit.fit(100 * MIB, ["adamw"], tmp_path / "fit.jsonl", job=TINY_JOB, max_size=64, progress=None,
                     run=broken)
    growth = result.growths["adamw"]
    assert growth.size is None and not growth.confirmed and len(growth.probes) == fit.MAX_PROBES
    assert all(p.status == "error" and not p.fits(100 * MIB) for p in growth.probes)
    table = fit.fit_table(result)
    trials = table["trials"][0].split("; ")
    assert table["largest batch"].isna().all() and len(trials) == fit.MAX_PROBES
    assert all(trial.endswith(": error") for trial in trials)
    row = next(line for line in fit.render(result).splitlines() if line.startswith("| adamw"))
    assert row.startswith("| adamw       | none ") and "NA" not in row and "None" not in row  # says it, in words
    assert fit._summary(growth, 100 * MIB).startswith("largest none (predicted 56; not bracketed")
    _, figure = fit.save(result, tmp_path / "fit.jsonl")
    assert imread(figure).shape[:2] == (round(4.4 * 130), round(11 * 130))  # the figure's inches x dpi


def test_an_oom_record_counts_as_over_the_budget_and_stops_the_growth(tmp_path):
    """Constructed records: batch 48 and above end `oom` under the trial's memory cap, with no peak measured."""
    def capped(spec, out_path, progress):
        if spec.batch_size >= 48:
            return Record(trial_id=spec.trial_id, status="oom", optimizer=spec.optimizer, device="cpu")
        return fake_run({"adamw": 1.0})(spec, out_path, progress)

    growth = fit.fit(100 * MIB, ["adamw"], tmp_path / "fit.jsonl", job=TINY_JOB, max_size=512, progress=None,
                     run=capped).growths["adamw"]
    assert growth.size == 40 and growth.confirmed and growth.probe_at(48).status == "oom"


def test_fit_end_to_end_through_the_command_line(tmp_path, capsys):
    """A grid of 1, 2, 4 samples in a budget they all fit: the predictor proposes 4, one real trial confirms it
    fits, and the largest size of the grid needs no trial above it."""
    out = tmp_path / "fit.jsonl"
    argv = ["fit", "--memory", "16GiB", "--workload", "tiny", "--device", "cpu", "--seq-len", "16",
            "--optimizers", "adamw", "--max-size", "4", "--out", str(out)]
    assert main(argv) == 0
    records = read_records(out)
    assert len(records) == fit.REPEATS and {r.seed for r in records} == set(range(fit.REPEATS))  # fresh processes
    assert all(r.status == "ok" and r.batch_size == 4 and r.steps == fit.PROBE_STEPS for r in records)
    assert all(r.seq_len == 16 and r.workload == "tiny" and r.device == "cpu" for r in records)
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| adamw"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == ["4", "4", "False"]
    assert cells[-1] == "the grid's largest size (4) fits; larger sizes were not tried"
    assert abs(float(cells[4]) - max(fit.measured_peak(r) for r in records) / MIB) <= 0.05  # the largest, MiB
    assert out.with_suffix(".md").read_text() in printed and imread(out.with_suffix(".png")).shape[0] > 0


def test_a_refused_fit_leaves_no_results_folder(tmp_path, monkeypatch, capsys):
    """`fit --workload nope` said so in one line, after making its --out's folder (results/) for nothing."""
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "--memory", "1GiB", "--workload", "nope", "--device", "cpu"]) == 2
    assert "unknown workload 'nope'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
