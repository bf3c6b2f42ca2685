"""Scaling sweep: state bytes against parameter count over tiny-BERT widths, fitted per optimizer."""

import pytest

from optbench import optimizers, scaling
from optbench.__main__ import main
from optbench.plan import TrialSpec, build_grid
from optbench.results import Record, append_record
from optbench.trial import run_trial

# Two steps are enough: the state is complete after the first. 1.0 M to 9.6 M parameters.
WIDTHS = (32, 64, 128, 256)
QUICK = dict(device="cpu", steps=2, warmup_steps=1, batch_size=2, seq_len=8, eval_size=4)
NAMES = [n for n in ("adamw", "adamw8bit", "adafactor") if optimizers.resolve(n).available]


@pytest.fixture(scope="module")
def sweep():
    specs = scaling.across_widths(build_grid(NAMES, [0], **QUICK), WIDTHS)
    return [run_trial(spec) for spec in specs]


@pytest.fixture(scope="module")
def fits(sweep):
    assert all(r.status == "ok" for r in sweep), [r.error for r in sweep if r.status != "ok"]
    return scaling.fit_scaling(sweep).set_index("optimizer")


@pytest.mark.parametrize(("name", "bytes_per_param"), [("adamw", 8.0), ("adamw8bit", 2.0)])
def test_dense_state_is_linear_in_parameters(fits, name, bytes_per_param):
    if name not in fits.index:
        pytest.skip(f"{name} is not available here")
    fit = fits.loc[name]
    assert fit["x"] == "num_params" and fit["points"] == len(WIDTHS)
    assert fit["r2"] >= 0.999
    # 8-bit: 2 B of moments + 8 B of absmax per 256-element block = 2.03 B/param, a hair more where
    # tensors under 4096 elements stay fp32.
    assert fit["slope_bytes"] == pytest.approx(bytes_per_param, rel=0.03)
    assert fit["state_exponent"] == pytest.approx(1.0, abs=0.02)


def test_factored_state_is_linear_in_rows_plus_columns_and_sublinear_in_parameters(fits):
    fit = fits.loc["adafactor"]
    assert fit["x"] == "factored_numel"
    assert fit["r2"] >= 0.999
    assert fit["slope_bytes"] == pytest.approx(4.0, rel=0.01)  # one fp32 per row / column statistic
    # Measured 0.17 on tiny BERT: the 30522-row embedding dominates rows + columns and does not widen.
    assert fit["state_exponent"] < 0.5


def test_markdown_and_figure(sweep, tmp_path):
    markdown = scaling.render_scaling_markdown(sweep)
    assert "R²" in markdown and all(name in markdown for name in NAMES)
    path = scaling.plot_scaling(sweep, tmp_path / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_skips_failed_trials_and_takes_the_median_over_seeds():
    def record(n, state, status="ok", seed=0):
        return Record(optimizer="adamw", state_precision="fp32", num_params=n, state_bytes=state,
                      step_time_median_s=n * 1e-8, status=status, seed=seed)

    records = [record(1000, 8000), record(2000, 16000), record(2000, 16010, seed=1), record(2000, 15990, seed=2),
               record(4000, 32000), record(8000, None, status="oom")]
    fit = scaling.fit_scaling(records).iloc[0]
    assert fit["points"] == 3 and fit["slope_bytes"] == pytest.approx(8.0) and fit["r2"] == pytest.approx(1.0)
    assert fit["state_exponent"] == pytest.approx(1.0) and fit["step_time_exponent"] == pytest.approx(1.0)
    assert scaling.fit_scaling([]).empty


def test_across_widths_orders_small_first_and_rejects_bad_widths():
    specs = scaling.across_widths([TrialSpec(optimizer="adamw"), TrialSpec(optimizer="adafactor")], (128, 32))
    assert [(s.workload, s.optimizer) for s in specs] == [
        ("tiny-w32", "adamw"), ("tiny-w32", "adafactor"), ("tiny-w128", "adamw"), ("tiny-w128", "adafactor")]
    with pytest.raises(ValueError, match="multiple of 32"):
        scaling.across_widths([TrialSpec(optimizer="adamw")], (32, 100))


def test_cli_scale_runs_the_widths_and_writes_the_fit(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_sweep(specs, out, on_record=None, **options):
        # Stand-in for the subprocess trials: AdamW's 8 B/param at each width's parameter count.
        for spec in specs:
            seen.append(spec)
            n = scaling_params[spec.workload]
            append_record(out, Record(trial_id=spec.trial_id, optimizer=spec.optimizer, status="ok",
                                      state_precision="fp32", num_params=n, state_bytes=8 * n,
                                      step_time_median_s=1e-8 * n, workload=spec.workload))
        return []

    scaling_params = {"tiny-w32": 1_000_000, "tiny-w64": 2_000_000, "tiny-w128": 4_000_000, "tiny-w256": 9_000_000}
    monkeypatch.setattr("optbench.runner.run_sweep", fake_sweep)
    out = tmp_path / "scaling.jsonl"
    code = main(["run", "--scale", "--optimizers", "adamw", "--widths", "32,64,128,256", "--out", str(out)])
    assert code == 0
    assert [s.workload for s in seen] == list(scaling_params)
    assert all(s.steps == scaling.SCALE_PRESET.steps for s in seen)
    printed = capsys.readouterr().out
    assert "| adamw" in printed and "8.0000" in printed
    assert (tmp_path / "scaling.png").is_file()


def test_cli_widths_without_scale_is_a_usage_error(capsys):
    assert main(["run", "--widths", "32,64"]) == 2
    assert "--scale" in capsys.readouterr().err

