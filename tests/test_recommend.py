"""recommend: what fits a budget (estimate.py's counts + measured activations), Pareto front first, quality in
the results' own target metric and direction, differences to adamw in the verdict words."""

import dataclasses
import statistics
from pathlib import Path

import pytest

from optbench.__main__ import main
from optbench.memory import estimate as est
from optbench.memory.recommend import finals_of, quality_of, recommend, render
from optbench.records.record import Record, read_records
from optbench.report.cells import untrained_row
from optbench.report.frame import summarize, trials_frame

MIB = 2**20
SIZE = est.size_from_count(10_000_000)
REFERENCE_RESULTS = Path(__file__).resolve().parents[1] / "results" / "cpu-2core" / "default.jsonl"
STUDY_RESULTS = REFERENCE_RESULTS.with_name("study.jsonl")


def _records(rows):
    return [Record(trial_id=f"{name}-{seed}", optimizer=name, seed=seed, status="ok", eval_accuracy=accuracy,
                   other_peak_bytes=activation, state_bytes_per_param=per_param, num_params=SIZE.num_params)
            for name, accuracy, activation, per_param in rows for seed in (0, 1)]


RECORDS = _records([("adamw", 0.93, 100 * MIB, 8.0), ("adafactor", 0.90, 50 * MIB, 0.02),
                    ("adamw8bit", 0.92, 300 * MIB, 2.04)])


def test_state_comes_from_estimate_and_activations_from_the_results():
    rows = {r.estimate.optimizer: r for r in recommend(SIZE, 10 * 2**30, RECORDS)}
    expected = {e.optimizer: e for e in est.estimate(SIZE, est.measured_bytes_per_param(RECORDS))}
    assert rows["adamw"].estimate == expected["adamw"]
    assert rows["adamw"].activation_bytes == 100 * MIB
    assert rows["adamw"].total_bytes == expected["adamw"].per_gpu_bytes() + 100 * MIB
    # an optimizer the results lack is charged the largest measured overhead
    unmeasured = [r for name, r in rows.items() if name not in ("adamw", "adafactor", "adamw8bit")]
    assert all(r.activation_bytes == 300 * MIB and r.quality is None for r in unmeasured)


def test_pareto_front_of_what_fits_comes_first():
    rows = recommend(SIZE, 10 * 2**30, RECORDS)
    names = [r.estimate.optimizer for r in rows]
    assert names[:2] == ["adafactor", "adamw"]  # less memory / higher accuracy: neither dominates
    assert rows[0].pareto and rows[1].pareto
    dominated = next(r for r in rows if r.estimate.optimizer == "adamw8bit")
    assert dominated.fits and not dominated.pareto  # more memory than adamw and lower accuracy
    text = render(rows, SIZE, 10 * 2**30, "fp32", "r.jsonl")
    assert "start with adafactor, adamw" in text
    assert "adamw needs no more memory and scores at least as well" in text
    assert "accuracy 0.9 (worse by at least 1 pt vs adamw)" in text  # adafactor: 3 points below on each seed
    assert next(r for r in rows if r.estimate.optimizer == "adamw").verdict is None  # the reference itself


def test_a_budget_between_the_options_keeps_only_what_fits():
    adamw = next(r for r in recommend(SIZE, 10 * 2**30, RECORDS) if r.estimate.optimizer == "adamw")
    rows = recommend(SIZE, adamw.total_bytes - 1, RECORDS)
    by_name = {r.estimate.optimizer: r for r in rows}
    assert not by_name["adamw"].fits and by_name["adafactor"].fits and by_name["adafactor"].pareto
    assert [r.fits for r in rows] == sorted([r.fits for r in rows], reverse=True)  # misfits last
    assert "does not fit" in render(rows, SIZE, adamw.total_bytes - 1, "fp32", None)


def test_bf16_halves_weights_grads_and_full_precision_state_only():
    fp32 = {r.estimate.optimizer: r.estimate for r in recommend(SIZE, 2**30)}
    bf16 = {r.estimate.optimizer: r.estimate for r in recommend(SIZE, 2**30, precision="bf16")}
    assert bf16["adamw"].weights_bytes * 2 == fp32["adamw"].weights_bytes
    # bf16 moments; each tensor's fp32 `step` stays 4 bytes, so the halving is not exact
    assert bf16["adamw"].state_bytes * 2 == pytest.approx(fp32["adamw"].state_bytes, rel=1e-5)
    assert bf16["adamw8bit"].state_bytes == fp32["adamw8bit"].state_bytes


def test_nothing_fits_is_a_clear_answer_and_exit_1(capsys):
    assert main(["recommend", "--params", "7B", "--gpu-memory", "1GiB"]) == 1
    out = capsys.readouterr().out
    assert "nothing fits in 1.00 GiB: the smallest, sgd, " in out  # HF Trainer's plain sgd keeps no state
    assert "try --precision bf16" in out


@pytest.mark.skipif(not REFERENCE_RESULTS.is_file(), reason="reference results not in this checkout")
@pytest.mark.parametrize("budget", ["1GiB", "24GiB"])
def test_recommend_on_the_reference_results(capsys, budget):
    assert main(["recommend", "--params", "22714371", "--gpu-memory", budget, "--results",
                 str(REFERENCE_RESULTS)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].startswith("fits: ")
    assert sum("Pareto front" in line for line in lines) >= 1


def test_a_lower_is_better_metric_turns_the_front_around():
    """Perplexity: the cheaper optimizer with the *lower* perplexity dominates; with accuracy it would not."""
    records = [Record(trial_id=f"{name}-{seed}", optimizer=name, seed=seed, status="ok", target_metric="perplexity",
                      target_mode="min", eval_metrics={"perplexity": ppl + 0.01 * seed}, other_peak_bytes=100 * MIB,
                      state_bytes_per_param=per_param, num_params=SIZE.num_params)
               for name, ppl, per_param in (("adamw", 20.0, 8.0), ("adamw8bit", 18.0, 2.04)) for seed in (0, 1, 2)]
    rows = {r.estimate.optimizer: r for r in recommend(SIZE, 10 * 2**30, records)}
    assert rows["adamw8bit"].pareto and not rows["adamw"].pareto  # less memory and lower perplexity
    assert rows["adamw8bit"].quality == pytest.approx(18.01)
    assert rows["adamw8bit"].verdict == "better by at least 2 %"  # 10 % lower on every seed
    text = render(list(rows.values()), SIZE, 10 * 2**30, "fp32", "lm.jsonl")
    assert "activations and perplexity measured in lm.jsonl" in text
    assert "perplexity 18.01 (better by at least 2 % vs adamw)" in text
    assert "fits, but adamw8bit needs no more memory and scores at least as well" in text


@pytest.mark.parametrize("num_params, precision", [(22_714_371, "fp32"), (SIZE.num_params, "bf16")])
def test_memory_measured_on_another_model_or_precision_is_not_used(num_params, precision):
    """`recommend --params 7B --results` of MiniLM's 22.7M-parameter job charged a 7B model MiniLM's measured
    activations (0.80 GiB) and scaled Adafactor's 0.019 B/param to it, though factored state grows with rows +
    columns; fp32 results gave bf16 weights fp32 moments. Memory comes from the analytic count instead; the
    accuracy measured there still stands, labelled with its job."""
    records = [dataclasses.replace(r, num_params=num_params) for r in RECORDS]
    rows = {r.estimate.optimizer: r for r in recommend(SIZE, 10 * 2**30, records, precision=precision)}
    assert all(r.activation_bytes is None and r.estimate.basis != "measured" for r in rows.values())
    assert rows["adafactor"].quality == pytest.approx(0.90)
    text = render(list(rows.values()), SIZE, 10 * 2**30, precision, "r.jsonl")
    assert "accuracy measured in r.jsonl" in text and "activations and accuracy" not in text
    _, note = est.measured_here(records, SIZE, precision)
    assert note and "not this model (10,000,000 parameters" in note
    close = [dataclasses.replace(r, num_params=SIZE.num_params + 3) for r in RECORDS]  # a 3-weight head: one model
    assert est.measured_here(close, SIZE, "fp32") == (close, None)


def _adafactor_finals(records):
    """Adafactor's final record per seed, found by hand: the final stage ran at the lr the walk chose; seed 0's
    final is its tune trial at that lr (the walk's other lrs were rejected)."""
    chosen = {r.lr for r in records if r.optimizer == "adafactor" and r.stage == "final"}
    assert len(chosen) == 1
    return {r.seed: r for r in records if r.optimizer == "adafactor" and r.lr in chosen and r.status == "ok"}


@pytest.mark.skipif(not STUDY_RESULTS.is_file(), reason="the committed study is not in this checkout")
def test_recommend_on_a_study_reads_only_each_seeds_final_record(capsys):
    records = read_records(STUDY_RESULTS)
    finals = _adafactor_finals(records)
    assert len([r for r in records if r.optimizer == "adafactor" and r.seed == 0]) > 1  # the walk tried other lrs
    assert quality_of(finals_of(records)).by_seed["adafactor"] == {seed: r.eval_accuracy for seed, r in finals.items()}
    assert main(["recommend", "--params", "22714371", "--gpu-memory", "24GiB", "--results", str(STUDY_RESULTS)]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("adafactor "))
    assert f"accuracy {statistics.fmean(r.eval_accuracy for r in finals.values()):.4g} " in line


def test_only_the_finals_of_a_study_count_and_a_second_job_is_named_not_mixed():
    """Constructed: a walk's rejected lr on seed 0 (tune, 0.30) beside the chosen one (tune, 0.90) and a final
    seed; a second job (another batch size) in the same file is left out, and the header says so."""
    def study(trial, stage, lr, seed, accuracy, batch_size=16):
        return Record(trial_id=trial, optimizer="adamw", seed=seed, status="ok", stage=stage, lr=lr, steps=10,
                      batch_size=batch_size, eval_accuracy=accuracy, val_accuracy=accuracy, val_metric=accuracy,
                      eval_metrics={"accuracy": accuracy}, other_peak_bytes=100 * MIB, state_bytes_per_param=8.0)

    records = [study("t1", "tune", 1e-2, 0, 0.30), study("t2", "tune", 1e-3, 0, 0.90),
               study("f1", "final", 1e-3, 1, 0.80), study("other", None, 1e-3, 0, 0.10, batch_size=64)]
    assert quality_of(finals_of(records)).by_seed == {"adamw": {0: 0.90, 1: 0.80}}
    rows = recommend(SIZE, 10 * 2**30, records)
    assert next(r for r in rows if r.estimate.optimizer == "adamw").quality == pytest.approx(0.85)
    header = render(rows, SIZE, 10 * 2**30, "fp32", "r.jsonl").splitlines()[1]
    assert "batch 16" in header and "1 other job in r.jsonl left out" in header


def test_an_optimizer_that_stayed_at_chance_gets_no_quality_figure_and_is_not_ranked():
    """adafactor's every seed ended within two points of chance (0.5): no figure, off the front, said in words;
    adamw8bit trained and is ranked against adamw as before."""
    records = _records([("adamw", 0.93, 100 * MIB, 8.0), ("adafactor", 0.51, 50 * MIB, 0.02),
                        ("adamw8bit", 0.92, 300 * MIB, 2.04)])
    for record in records:
        record.metric_chance = 0.5
    rows = {r.estimate.optimizer: r for r in recommend(SIZE, 10 * 2**30, records)}
    assert rows["adafactor"].quality is None and rows["adafactor"].untrained and not rows["adafactor"].pareto
    assert rows["adamw8bit"].quality == pytest.approx(0.92) and not rows["adamw8bit"].untrained
    text = render(list(rows.values()), SIZE, 10 * 2**30, "fp32", "r.jsonl")
    line = next(line for line in text.splitlines() if line.startswith("adafactor "))
    assert "accuracy untrained (every seed at chance: no figure)" in line and "0.51" not in line


def test_recommend_calls_untrained_exactly_the_rows_the_report_shows_as_untrained():
    """One rule in one place. adafactor at chance on both seeds: `untrained` in both. adamw8bit at chance on seed 0,
    its seed 1 unscored: the report shows `untrained` (every score it has is at chance), and recommend, which
    counted the unscored seed as trained, gave it 0.505 as its quality. lion at chance on one seed only trained on
    the other: a figure in both."""
    records = _records([("adamw", 0.93, 100 * MIB, 8.0), ("adafactor", 0.51, 50 * MIB, 0.02),
                        ("adamw8bit", 0.505, 300 * MIB, 2.04), ("lion", 0.90, 100 * MIB, 4.0)])
    for record in records:
        record.metric_chance = 0.5
        if (record.optimizer, record.seed) == ("adamw8bit", 1):
            record.eval_accuracy = None
        if (record.optimizer, record.seed) == ("lion", 0):
            record.eval_accuracy = 0.505
    summary = summarize(trials_frame(records))
    shown = {row["optimizer"] for _, row in summary.iterrows() if untrained_row(row)}
    quality = quality_of(finals_of(records))
    assert shown == set(quality.untrained) == {"adafactor", "adamw8bit"}
    assert quality.mean("adamw8bit") is None and quality.mean("lion") == pytest.approx((0.505 + 0.90) / 2)


def test_results_whose_finals_all_failed_are_said_to_measure_nothing():
    """A results file of one oom trial was described as "accuracy measured in ...: (their memory figures are another
    model's or precision's, not used)": same model and precision, and nothing measured at all."""
    failed = [dataclasses.replace(RECORDS[0], status="oom", eval_accuracy=None, other_peak_bytes=None)]
    rows = recommend(SIZE, 10 * 2**30, failed)
    text = render(rows, SIZE, 10 * 2**30, "fp32", "oom.jsonl")
    assert "ended ok: activations and accuracy not measured" in text
    assert "another model's" not in text and "accuracy measured in" not in text


def test_an_empty_results_file_is_refused_by_recommend_and_estimate(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for command in (["estimate", "--params", "7B"], ["recommend", "--params", "7B", "--gpu-memory", "80GiB"]):
        assert main([*command, "--results", str(empty)]) == 2
        assert capsys.readouterr().err.strip() == f"optbench: error: no records in {empty}"


def test_the_optimizers_named_are_the_ones_compared_and_an_alias_is_its_entry(capsys):
    """estimate printed all 63 entries and recommend ranked all of them: --optimizers names the ones a user chooses
    between (the front is theirs), and AdamW stays the reference of estimate's % column when it is not shown."""
    assert main(["estimate", "--params", "65783042", "--optimizers", "adamw_bnb_8bit,adafactor"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["adafactor", "adamw8bit_hf"]  # registry order
    assert "25.4" in rows[2]  # % of AdamW's state, AdamW not shown
    budget = ["--params", "65783042", "--gpu-memory", "24GiB", "--optimizers", "adamw,adafactor"]
    assert main(["recommend", *budget]) == 0
    out = capsys.readouterr().out
    assert "fits: 2 of 2 optimizers" in out and "adamw8bit" not in out


def test_recommend_counts_the_head_num_labels_adds(capsys):
    from optbench.workloads import minilm_path

    assert main(["recommend", "--model", minilm_path(), "--num-labels", "3", "--gpu-memory", "1GiB",
                 "--optimizers", "adamw"]) == 0
    assert capsys.readouterr().out.startswith("22,714,371 trainable parameters")  # 22,713,216 + 384 x 3 + 3


def test_the_verdict_is_the_reports_own():
    """recommend ran its own paired test: with AdamW trained (~0.90) and Adafactor at chance on every seed, the
    report said *worse by at least 1 pt* and recommend said nothing. It now reads the report's verdict."""
    from optbench.report.frame import summarize, trials_frame

    records = [Record(trial_id=f"{name}-{seed}", optimizer=name, seed=seed, status="ok", eval_accuracy=accuracy,
                      eval_metrics={"accuracy": accuracy}, metric_chance=0.34, eval_rows=4000,
                      other_peak_bytes=100 * MIB, state_bytes_per_param=8.0, num_params=SIZE.num_params)
               for name, base in (("adamw", 0.90), ("adafactor", 0.34)) for seed, accuracy in
               enumerate((base, base + 0.01, base - 0.005))]
    summary = summarize(trials_frame(records))
    said = summary.set_index("optimizer")["verdict_vs_adamw"]["adafactor"]
    assert said.startswith("worse")
    rows = {r.estimate.optimizer: r for r in recommend(SIZE, 10 * 2**30, records)}
    assert rows["adafactor"].untrained and rows["adafactor"].verdict == said
