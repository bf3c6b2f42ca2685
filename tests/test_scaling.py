"""Scaling sweep: state bytes against parameter count over tiny-BERT widths, fitted per optimizer."""

import pytest

from optbench import optimizers
from optbench.__main__ import main
from optbench.job.spec import TrialSpec
from optbench.records.record import Record, read_records
from optbench.report import scaling
from optbench.workflows.scaling import across_widths

# Two steps are enough: the state is complete after the first. 1.0 M to 4.3 M parameters.
WIDTHS = (32, 64, 128)
NAMES = [n for n in ("adamw", "adamw8bit", "adafactor") if optimizers.resolve(n).available]
SCALE = ["run", "--scale", "--optimizers", ",".join(NAMES), "--widths", ",".join(map(str, WIDTHS)), "--steps", "2",
         "--warmup-steps", "1", "--batch-size", "2", "--seq-len", "8", "--eval-size", "4", "--device", "cpu"]


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    """The real scaling sweep, through the command line: (its results file, its records)."""
    out = tmp_path_factory.mktemp("scale") / "scaling.jsonl"
    assert main([*SCALE, "--out", str(out)]) == 0
    return out, read_records(out)


@pytest.fixture(scope="module")
def sweep(scaled):
    return scaled[1]


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
    typed = scaling.plot_scaling(sweep, str(tmp_path / "typed.png"))  # docs/fidelity-scaling.md's call, a str path
    assert typed.read_bytes() == path.read_bytes()


def test_the_figure_keeps_its_panels_with_dozens_of_optimizers(tmp_path):
    """`report results/` read 52 optimizers' scaling points: their legend, inside a panel, squeezed both panels to
    nothing (matplotlib: "axes sizes collapsed to zero"). One legend below the panels holds them."""
    import warnings

    records = [Record(optimizer=f"optimizer_{i:02d}", state_precision="fp32", num_params=n, state_bytes=8 * n,
                      step_time_median_s=n * 1e-8, status="ok", seed=0) for i in range(52) for n in (10**6, 10**7)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collapsed layout is a UserWarning
        path = scaling.plot_scaling(records, tmp_path / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_registry_entry_has_its_own_look_in_the_figure(tmp_path, monkeypatch):
    """With 52 optimizers the figure's lines took matplotlib's ten default colours in turn, so five lines shared
    each look. Each entry keeps report/canvas.py's colour, line style and marker: no two lines look alike."""
    from optbench.optimizers import REGISTRY
    from optbench.report import png

    drawn = []
    monkeypatch.setattr(png, "save_figure", lambda figure, path, dpi=None: drawn.append(figure) or path)
    records = [Record(optimizer=name, state_precision="fp32", num_params=n, state_bytes=8 * n,
                      step_time_median_s=n * 1e-8, status="ok", seed=0) for name in REGISTRY for n in (10**6, 10**7)]
    scaling.plot_scaling(records, tmp_path / "scaling.png")
    lines = [line for line in drawn[0].axes[0].get_lines() if not line.get_label().startswith("_")]
    looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}
    assert len(lines) == len(REGISTRY) > 10 and len(looks) == len(lines)


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
    specs = across_widths([TrialSpec(optimizer="adamw"), TrialSpec(optimizer="adafactor")], (128, 32))
    assert [(s.workload_options["hidden_size"], s.optimizer) for s in specs] == [
        (32, "adamw"), (32, "adafactor"), (128, "adamw"), (128, "adafactor")]
    with pytest.raises(ValueError, match="multiple of 32"):
        across_widths([TrialSpec(optimizer="adamw")], (32, 100))


def test_cli_scale_sweeps_every_width_and_prints_the_fit(scaled, capsys):
    out, records = scaled
    assert sorted((r.optimizer, r.workload, r.workload_options["hidden_size"]) for r in records) == sorted(
        (name, "tiny", width) for name in NAMES for width in WIDTHS)
    assert main([*SCALE, "--out", str(out)]) == 0  # every trial already ok: resumed, and the fit printed again
    printed = capsys.readouterr().out
    assert "| adamw" in printed and "8.0000" in printed  # exactly 8 B/param: the fp32 step scalars do not grow
    assert (out.parent / "scaling.png").is_file()


def test_cli_widths_without_scale_is_a_usage_error(capsys):
    assert main(["run", "--widths", "32,64"]) == 2
    assert "--scale" in capsys.readouterr().err

