"""Hand-made study records shared by the report, plot and browser tests, shaped as `study` writes them now: two
jobs; a tune stage at the finals' own job (seed 0 over the lr grid, validation and eval metrics, one diverged
point), then final seeds 1 and 2 at the chosen lr, all with eval curves. The tune trial at the chosen lr is seed
0's final. Deterministic, no torch. (Schema-1 study files, tuned on fewer steps: test_summary.py.)"""

import math

from optbench.job.spec import TrialSpec
from optbench.records.record import Record

MIB = 2**20
GRID = [1e-5, 1e-4, 1e-3, 1e-2]
VAL_ROWS = 400
# optimizer: (best lr, state MiB, step s, final accuracy offset, per-seed noise)
PROFILE = {"adamw": (1e-4, 80.0, 0.40, 0.00, (0.000, 0.010, -0.005)),
           "adafactor": (1e-3, 0.5, 0.42, -0.04, (0.000, 0.012, -0.006)),
           "adamw8bit": (1e-4, 20.0, 0.58, 0.001, (0.003, 0.008, -0.010))}


def _record(spec: TrialSpec, model: str) -> Record:
    best_lr, state_mib, step_s, offset, noise = PROFILE[spec.optimizer]
    record = Record(trial_id=spec.trial_id + model, status="ok", optimizer=spec.optimizer, seed=spec.seed,
                    workload=spec.workload, model=model, dataset="reviews", device="cpu", steps=spec.steps,
                    batch_size=spec.batch_size, seq_len=spec.seq_len, lr=spec.lr, stage=spec.stage,
                    state_precision="fp32" if spec.optimizer == "adamw" else "low", pretrained=model != "scratch",
                    state_bytes=int(state_mib * MIB), state_bytes_per_param=1.0, weights_bytes=90 * MIB,
                    grads_bytes=90 * MIB, peak_rss_bytes=1200 * MIB, peak_rss_growth_bytes=int((300 + state_mib) * MIB),
                    step_time_median_s=step_s, optimizer_step_median_s=step_s / 4, samples_per_s=16 / step_s)
    score = 0.9 + offset - 0.08 * abs(math.log10(spec.lr / best_lr))
    if spec.stage == "tune":
        if spec.optimizer == "adamw8bit" and spec.lr == GRID[-1]:
            record.status, record.error = "diverged", "loss became nan at step 7"
            return record
        record.val_metrics, record.val_metric, record.val_accuracy = {"accuracy": score}, score, score
        record.val_rows = VAL_ROWS
    value = score + noise[spec.seed]
    record.eval_metrics, record.eval_accuracy, record.eval_f1 = {"accuracy": value}, value, value
    slow = 1.0 if model != "scratch" else 2.0
    record.eval_curve = [[k, k * step_s * slow, value - 0.3 / k] for k in (1, 2, 4, 8)]
    record.loss_curve = [1.0 / (i + 1) for i in range(8)]
    return record


def study_records() -> list[Record]:
    records = []
    for model in ("minilm", "scratch"):
        common = dict(workload="w", steps=8, batch_size=16, seq_len=32, eval_every=1)
        for name in PROFILE:
            for lr in GRID:
                records.append(_record(TrialSpec(optimizer=name, lr=lr, seed=0, stage="tune", **common), model))
        for seed in (1, 2):
            for name, (best_lr, *_rest) in PROFILE.items():
                records.append(_record(TrialSpec(optimizer=name, lr=best_lr, seed=seed, stage="final", **common),
                                       model))
    return records
