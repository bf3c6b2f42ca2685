"""The report's figures: the pure helpers on hand-made points, then the figures drawn from hand-made records, read
back from matplotlib's objects (axes, labels, the points, bars and lines plotted) and from the PNG files written.
(The Pareto front they draw is pareto.pareto_front, tested in test_stats.)"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.image import imread

from optbench.records.record import Record
from optbench.report import canvas, plots
from optbench.report.canvas import mean_band
from optbench.report.frame import summarize, trials_frame
from optbench.report.plots import label_offsets, write_plots

MIB = 2**20
JOB = dict(model="m", dataset="d", device="cpu", steps=4, warmup_steps=1, batch_size=4, seq_len=8, workload="w")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_mean_band_over_ragged_curves_with_gaps():
    mean, std = mean_band([[1.0, 2.0, 3.0, None], [3.0, 4.0]])
    np.testing.assert_allclose(mean[:3], [2.0, 3.0, 3.0])
    np.testing.assert_allclose(std[:3], [np.sqrt(2), np.sqrt(2), 0.0])
    assert np.isnan(mean[3])


def test_labels_of_coinciding_points_go_to_different_corners():
    offsets = label_offsets([0.0, 50.0, 50.2, 100.0], [0.3, 0.9, 0.9, 0.5])
    assert offsets[1] != offsets[2]
    assert offsets[0] == offsets[1] == offsets[3]


def _record(trial_id, optimizer, seed, state_mib, growth_mib, acc, fidelity=None, **extra):
    record = Record(trial_id=trial_id, optimizer=optimizer, seed=seed, status="ok", state_precision="fp32",
                    weights_bytes=10 * MIB, grads_bytes=10 * MIB, state_bytes=int(state_mib * MIB),
                    state_bytes_per_param=8.0, peak_rss_bytes=(900 + growth_mib) * MIB,
                    peak_rss_growth_bytes=growth_mib * MIB, step_time_median_s=0.1 + 0.1 * seed,
                    optimizer_step_median_s=0.05, samples_per_s=40.0, eval_accuracy=acc, eval_f1=acc,
                    loss_curve=[1.1, 1.0, 0.9 - 0.01 * seed, 0.8], **JOB, **extra)
    if fidelity is not None:
        record.update_cosine_curve = [None, fidelity, fidelity - 0.01, fidelity]
        record.update_rel_error_curve = [None, 1 - fidelity, 1.01 - fidelity, 1 - fidelity]
        record.update_cosine_median, record.update_rel_error_median = fidelity, 1 - fidelity
    return record


@pytest.fixture
def records():
    return [_record("a0", "adamw", 0, 20, 50, 0.90, fidelity=1.0),
            _record("a1", "adamw", 1, 20, 56, 0.86, fidelity=1.0),
            _record("b0", "adamw8bit", 0, 5, 40, 0.88, fidelity=0.99),
            # a CPU peak below weights + grads + state (allocator reuse): the rest comes out negative
            _record("c0", "adafactor", 0, 0.1, 5, 0.70, fidelity=0.5),
            Record(trial_id="d0", optimizer="adamw4bit_torchao", status="oom", error="out of memory", **JOB)]


def _frames(records):
    trials = trials_frame(records)
    return trials, summarize(trials)


@pytest.fixture
def drawn(monkeypatch):
    """file name -> the Figure written to it, as write_plots draws them."""
    figures = {}
    save = plots.save_titled

    def keep(fig, title, path):
        figures[path.name] = fig
        return save(fig, title, path)

    monkeypatch.setattr(plots, "save_titled", keep)
    return figures


def _points(ax):
    return sorted((round(float(x), 3), round(float(y), 3)) for c in ax.collections if isinstance(c, PathCollection)
                  for x, y in c.get_offsets())


def _bars(ax):
    return {c.get_label(): [round(r.get_height(), 3) for r in c] for c in ax.containers}


def test_every_figure_shows_what_the_records_hold(records, tmp_path, drawn):
    paths = write_plots(*_frames(records), tmp_path)
    assert [p.name for p in paths] == ["tradeoff.png", "curves.png", "memory.png", "fidelity.png"]
    for path in paths:  # each file is the figure drawn, at its size in inches x dpi
        width, height = drawn[path.name].get_size_inches() * canvas.DPI
        assert path.read_bytes().startswith(PNG_SIGNATURE) and imread(path).shape[:2] == (round(height), round(width))
    state, peak = drawn["tradeoff.png"].axes
    assert (state.get_xlabel(), state.get_ylabel()) == ("optimizer state (MiB)", "eval accuracy (higher is better)")
    # per optimizer (mean over seeds): state MiB and accuracy; peak = weights + mean RSS growth
    assert _points(state) == [(0.1, 0.7), (5.0, 0.88), (20.0, 0.88)]
    assert _points(peak) == [(15.0, 0.7), (50.0, 0.88), (63.0, 0.88)]
    assert "not shown: adamw4bit_torchao (oom)" in state.get_title(loc="left")
    assert [t.get_text().split("\n")[0] for t in state.texts] == ["adamw", "adamw8bit", "adafactor"]
    (curves,) = drawn["curves.png"].axes
    lines = {line.get_label(): line.get_ydata().tolist() for line in curves.get_lines()}
    assert lines["adamw (2 seeds)"] == pytest.approx([1.1, 1.0, 0.895, 0.8])  # the two seeds' mean
    assert lines["adafactor (1 seed)"] == pytest.approx([1.1, 1.0, 0.9, 0.8])
    (memory,) = drawn["memory.png"].axes
    assert _bars(memory) == {"weights": [10.0, 10.0, 10.0], "grads": [10.0, 10.0, 10.0],
                             "optimizer state": [20.0, 5.0, 0.1], "rest (activations, temporaries)": [23.0, 25.0, 0.0]}
    assert _points(memory) == [(2.0, 15.0)]  # adafactor's measured peak, below its counted parts: a diamond
    assert [t.get_text() for t in memory.texts] == ["63 MiB", "50 MiB", "15 MiB"]
    cosine, _ = drawn["fidelity.png"].axes
    assert sorted(line.get_label() for line in cosine.get_lines()) == [
        "adafactor (1 seed), median 0.5", "adamw (2 seeds), median 1", "adamw8bit (1 seed), median 0.99"]


def test_no_fidelity_figure_without_fidelity_data_and_a_stale_one_goes(records, tmp_path):
    (tmp_path / "fidelity.png").write_bytes(b"old")
    plain = [_record("a0", "adamw", 0, 20, 50, 0.9), _record("b0", "adamw8bit", 0, 5, 40, 0.88)]
    paths = write_plots(*_frames(plain), tmp_path)
    assert [p.name for p in paths] == ["tradeoff.png", "curves.png", "memory.png"]
    assert not (tmp_path / "fidelity.png").exists()


def test_the_trade_off_places_no_job_that_did_not_train_on_its_quality_axis(tmp_path, drawn):
    """adafactor ended within two points of chance (untrained): it has no quality figure, so no point; it is named
    instead. A second job (another batch) whose one trial diverged gets a panel that says so, not a crash."""
    at_chance = dict(metric_chance=0.5, target_metric="accuracy", target_mode="max")
    records = [_record("a0", "adamw", 0, 20, 50, 0.90, **at_chance), _record("c0", "adafactor", 0, 0.1, 5, 0.51,
                                                                              **at_chance),
               Record(trial_id="x", optimizer="adamw", status="diverged", error="nan", **{**JOB, "batch_size": 8})]
    write_plots(*_frames(records), tmp_path)
    state, _, other_state, _ = drawn["tradeoff.png"].axes
    assert _points(state) == [(20.0, 0.9)]
    assert "not shown: adafactor (untrained)" in state.get_title(loc="left")
    assert not _points(other_state) and [t.get_text() for t in other_state.texts] == [
        "no trial of this job ended ok and trained"]
    assert "not shown: adamw (diverged)" in other_state.get_title(loc="left")


def test_no_figures_when_nothing_finished(tmp_path):
    failed = [Record(trial_id="x", optimizer="adamw", status="error", error="boom", **JOB)]
    assert write_plots(*_frames(failed), tmp_path) == []


def test_study_figures_only_where_the_data_supports_them(tmp_path):
    from _study_fixture import study_records

    from optbench.report.render import write_report

    _, paths = write_report(study_records(), tmp_path)
    names = {p.name for p in paths}
    assert {"lr_sensitivity.png", "eval_vs_time.png", "profile.png", "tradeoff.png"} <= names
    plain = [r for r in study_records() if r.stage == "final" and r.model == "minilm"]
    for record in plain:
        record.eval_curve = []
    _, paths = write_report(plain, tmp_path)
    names = {p.name for p in paths}
    assert not {"lr_sensitivity.png", "eval_vs_time.png", "profile.png"} & names
    assert not (tmp_path / "profile.png").exists()  # a stale figure is removed


def test_where_the_state_bytes_go_only_when_records_carry_it(records, tmp_path, drawn):
    """Without the split no figure (test_every_figure_shows_what_the_records_hold lists them all); with it, one
    stacked bar per optimizer, a segment per module kind in the kinds' order, adding up to its state."""
    split = {"embeddings": 6 * MIB, "attention": 8 * MIB, "mlp": 5 * MIB, "norms/biases": MIB // 2, "head": MIB // 2}
    for record in records[:4]:
        record.state_bytes_by_module = {kind: size * record.state_bytes // (20 * MIB) for kind, size in split.items()}
    paths = write_plots(*_frames(records), tmp_path)
    figure = tmp_path / "state_modules.png"
    assert figure in paths and figure.read_bytes().startswith(PNG_SIGNATURE)
    (ax,) = drawn["state_modules.png"].axes
    bars = _bars(ax)
    assert list(bars) == ["embeddings", "attention", "mlp", "norms/biases", "head"]
    assert bars["embeddings"] == [6.0, 1.5, 0.03] and bars["attention"] == [8.0, 2.0, 0.04]  # MiB: adamw, 8bit, ...
    assert [round(sum(kind[i] for kind in bars.values()), 1) for i in range(3)] == [20.0, 5.0, 0.1]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["adamw", "adamw8bit", "adafactor"]
    records[0].state_bytes_by_module = {}
    assert figure in write_plots(*_frames(records[:2]), tmp_path)  # one of two seeds carries it: still drawn


def test_plots_import_neither_the_report_nor_torch():
    code = ("import sys, optbench.report.plots; "
            "print(sorted(m for m in ('optbench.report.render', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def _chart_png(tmp_path, name="chart.png"):
    """A small chart with text, a fill and anti-aliased lines, written the way matplotlib writes it (RGBA)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=100)
    ax = fig.subplots()
    ax.plot([0, 1, 2], [0, 1, 0.5], color="C0", lw=2.5)
    ax.fill_between([0, 1, 2], [0, 0.2, 0.1], color="C1", alpha=0.4)
    ax.set_title("state (MiB)")
    raw = tmp_path / name
    fig.savefig(raw)
    return fig, raw


def test_figures_are_written_as_palette_pngs_that_look_the_same(tmp_path):
    from PIL import Image

    from optbench.report.png import save_figure

    fig, raw = _chart_png(tmp_path)
    small = save_figure(fig, tmp_path / "sub" / "chart.png")
    with Image.open(raw) as original, Image.open(small) as palette:
        assert palette.mode == "P" and original.mode == "RGBA"
        before, after = (np.asarray(image.convert("RGB"), dtype=float) for image in (original, palette))
    diff = np.abs(before - after)
    assert diff.mean() < 1.0  # of 255: the same picture, not a smeared one
    assert small.stat().st_size < raw.stat().st_size


def test_shrinking_is_idempotent_and_reaches_figures_embedded_in_a_page(tmp_path):
    import base64
    import importlib.util

    from optbench.report.png import shrink_png

    script = Path(__file__).parents[1] / "scripts" / "shrink_figures.py"
    spec = importlib.util.spec_from_file_location("shrink_figures", script)
    shrink_figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shrink_figures)
    _, raw = _chart_png(tmp_path)
    once = shrink_png(raw.read_bytes())
    assert shrink_png(once) == once
    page = tmp_path / "report.html"
    page.write_text(f'<img src="data:image/png;base64,{base64.b64encode(raw.read_bytes()).decode()}">')
    before, after = shrink_figures.shrink_file(page)
    assert after < before
    assert base64.b64encode(once).decode() in page.read_text()
    assert shrink_figures.shrink_file(page) == (after, after)


def test_a_job_with_dozens_left_out_names_them_in_four_title_lines_and_keeps_its_panels(tmp_path, drawn):
    """A registry sweep too short to train left 40 optimizers out; their names on one line squeezed the panels to
    nothing (matplotlib: "axes sizes collapsed to zero"). The title keeps four lines and counts the rest."""
    import warnings

    at_chance = dict(metric_chance=0.5, target_metric="accuracy", target_mode="max")
    records = [_record("a0", "adamw", 0, 20, 50, 0.90, **at_chance)]
    records += [_record(f"u{i}", f"optimizer_{i:02d}", 0, 1, 5, 0.5, **at_chance) for i in range(40)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collapsed layout is a UserWarning
        write_plots(*_frames(records), tmp_path)
    title = drawn["tradeoff.png"].axes[0].get_title(loc="left").splitlines()
    assert len(title) == 1 + plots.NOT_SHOWN_LINES and title[1].startswith("not shown: optimizer_00 (untrained)")
    assert all(len(line) <= plots.NOT_SHOWN_CHARS for line in title[1:])
    shown = sum(line.count("(untrained)") for line in title[1:])
    assert title[-1].endswith(f"and {40 - shown} more (the tables list them)") and 0 < shown < 40
