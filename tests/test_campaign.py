"""The gate campaign's summary (optbench/report/campaign.py) on constructed records: same-commit pairs give the
false-alarm rate, injected slowdowns the detection rate, each with its counts and the measured change."""

import numpy as np

from optbench.records.record import Record, append_record
from optbench.report import campaign

JOB = dict(model="m", dataset="d", device="cpu", steps=40, batch_size=8, seq_len=32, workload="w",
           state_bytes=1, peak_rss_growth_bytes=1, eval_accuracy=0.9)


def _run(path, scale, seed):
    """One sweep: three processes (seeds) of adamw whose optimizer-step medians spread 2 % between processes."""
    rng = np.random.default_rng(seed)
    for s in range(3):
        level = 0.1 * scale * float(np.exp(0.02 * rng.standard_normal()))
        samples = list(level * np.exp(0.05 * rng.standard_normal(35)))
        append_record(path, Record(trial_id=f"t{s}", optimizer="adamw", seed=s, status="ok",
                                   optimizer_step_samples_s=samples, optimizer_step_median_s=float(np.median(samples)),
                                   step_time_median_s=0.3, **JOB))


def _campaign(root, pairs=3):
    for k in range(pairs):
        _run(root / "same" / f"run-{2 * k:02d}.jsonl", 1.0, seed=10 * k)
        _run(root / "same" / f"run-{2 * k + 1:02d}.jsonl", 1.0, seed=10 * k + 1)
        _run(root / "slow-0.3" / f"run-{k:02d}.jsonl", 1.3, seed=10 * k + 2)
        _run(root / "slow-0.05" / f"run-{k:02d}.jsonl", 1.05, seed=10 * k + 3)


def test_same_commit_runs_pair_two_by_two_and_slowdowns_meet_the_base_sides(tmp_path):
    _campaign(tmp_path)
    kinds = campaign.pairs(tmp_path)
    assert list(kinds) == ["same-commit", "+5 % injected", "+30 % injected"]
    assert [(a.name, b.name) for a, b, _ in kinds["same-commit"]] == [
        ("run-00.jsonl", "run-01.jsonl"), ("run-02.jsonl", "run-03.jsonl"), ("run-04.jsonl", "run-05.jsonl")]
    assert [(a.name, b.parent.name, b.name, pct) for a, b, pct in kinds["+30 % injected"]][1] == (
        "run-02.jsonl", "slow-0.3", "run-01.jsonl", 30.0)


def test_rates_come_with_their_counts_and_the_measured_change(tmp_path):
    _campaign(tmp_path)
    found = campaign.outcomes(tmp_path)
    same, five, thirty = (found[k]["adamw"] for k in ("same-commit", "+5 % injected", "+30 % injected"))
    assert (same.flagged, same.compared) == (0, 3) and (thirty.flagged, thirty.compared) == (3, 3)
    assert five.flagged == 0  # under the campaign's 10 % limit: never a regression, however sure
    assert all(25 < c < 35 for c in thirty.changes) and thirty.within_tolerance() == 3
    text = campaign.summary_markdown(tmp_path)
    assert "flagged 3/3; measured +3" in text and "within ±5 pts of +30 %: 3/3" in text
    assert "3 processes (seeds) per run and side" in text and "past +10 %" in text


def test_no_campaign_yet(tmp_path):
    assert campaign.summary_markdown(tmp_path) == "not measured yet"


def test_the_campaign_scripts_say_how_to_call_them():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for command in (["bash", "scripts/gate-campaign"], [sys.executable, "scripts/slowdown_probe.py"],
                    [sys.executable, "scripts/harness_factors.py", "out.json", "many"],
                    [sys.executable, "scripts/kernel_width_probe.py", "out.json", "many"],
                    [sys.executable, "scripts/step_drift_probe.py", "out.json", "many"],
                    [sys.executable, "scripts/steadiness_probe.py", "out.json", "many"]):
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and result.stderr.strip().startswith("usage:"), result.stderr


def test_the_step_drift_probe_writes_its_blocks(tmp_path):
    """scripts/step_drift_probe.py on the tiny model, three blocks: each block's step and forward/backward medians,
    their spread and the rank correlation between them."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "drift.json"
    result = subprocess.run([sys.executable, "scripts/step_drift_probe.py", str(out), "3", "tiny"], cwd=root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(out.read_text())
    assert len(found["blocks"]) == 3 and all(b["step_s"] > 0 and b["forward_backward_s"] > 0 for b in found["blocks"])
    assert found["step_stray"] >= 0 and -1 <= found["step_vs_forward_backward_spearman"] <= 1
    assert found["env"]["git_commit"]


def test_the_steadiness_probe_keeps_its_verdict_and_exits_by_it(tmp_path):
    """scripts/steadiness_probe.py, two processes of two passes: each process's median, their stray from the median
    of them, and a verdict by the tolerance that the exit status repeats (0 steady, 3 not), whichever it is here."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, "scripts/steadiness_probe.py", str(out), "2", "2"], cwd=root,
                            capture_output=True, text=True, timeout=300)
    found = json.loads(out.read_text())
    medians = found["median_bytes_per_s"]
    assert len(medians) == 2 and all(m > 0 for m in medians) and found["env"]["git_commit"]
    centre = (medians[0] + medians[1]) / 2
    assert abs(found["stray"] - abs(medians[0] / centre - 1)) < 1e-12
    assert found["steady"] == (found["stray"] <= found["tolerance"])
    assert result.returncode == (0 if found["steady"] else 3), result.stderr


def test_the_campaign_takes_turns_by_sweep_or_by_trial_and_nothing_else():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(["bash", "scripts/gate-campaign", "out", "1", "0.3", "adamw", "0", "shuffled"], cwd=root,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr == "gate-campaign: ORDER is sweeps or trials, not shuffled\n"


def test_the_campaign_takes_a_positive_thread_count_and_nothing_else():
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for threads in ("0", "two", "-1"):
        result = subprocess.run(["bash", "scripts/gate-campaign", "out", "1", "0.3", "adamw", "0", "trials", threads],
                                cwd=root, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"gate-campaign: THREADS is a positive count, not {threads}\n"
