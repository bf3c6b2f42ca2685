"""A short fine-tune through the harness itself (optbench.trial.run.run_trial): accuracy next to the costs.

The benchmark's time is the whole trial (build, train, evaluate); the steady-state step medians the
harness measured, the accuracy, state bytes and peaks are in extra_info under their Record names.
"""

from __future__ import annotations

import math

from bench_support import extra_info, trial_spec

from optbench.trial.run import run_trial


def test_finetune(benchmark, optimizer_spec, bench_size, device):
    spec = trial_spec(bench_size, optimizer_spec.name, device)
    benchmark.group = f"fine-tune: {spec.workload}, {spec.steps} steps x batch {spec.batch_size} on {device}"
    record = benchmark.pedantic(run_trial, args=(spec,), rounds=1, iterations=1)
    benchmark.extra_info.update(extra_info("finetune", record))
    assert record.status == "ok", record.error
    assert math.isfinite(record.eval_metrics[record.target_metric])  # the workload names its metric
    assert record.state_bytes == record.analytic_state_bytes
    assert len(record.step_time_samples_s) == spec.steps - max(1, spec.warmup_steps)  # the steps after warm-up
