"""Why five trials of one fused AdamW step disagree: does the step's speed move within one process, over minutes?

One process, the default job (MiniLM, batch 64 x seq 32, adamw_fused: what `reference-results roofline` runs),
trained for BLOCKS blocks of BLOCK_STEPS steps. Per block: the median optimizer.step() and the median forward +
backward before it. If the step's block medians spread as widely as the trials' medians do, and move with the
forward/backward (which no optimizer touches), the spread between trials is the machine's speed moving over
minutes, not the process or the kernel: a trial's roofline then depends on when it ran, and no ceiling measured
at another time can make trials agree.

    python scripts/step_drift_probe.py OUT.json [BLOCKS] [WORKLOAD]

Run it on an idle machine (about 5 minutes at 36 blocks): `reference-results step-drift`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy import stats  # noqa: E402

from optbench.job.spec import PRESETS, TrialSpec  # noqa: E402
from optbench.records.environment import environment  # noqa: E402
from optbench.trial.run import setup  # noqa: E402
from optbench.trial.settings import settings_record  # noqa: E402
from optbench.workloads import train_batches  # noqa: E402

BLOCK_STEPS = 10
STUDY = PRESETS["study"]  # the default job's shape
SPEC = TrialSpec(optimizer="adamw_fused", workload="minilm", device="cpu", batch_size=STUDY.batch_size,
                 seq_len=STUDY.seq_len, steps=10_000, warmup_steps=0)


def main(argv: list[str]) -> int:
    if not argv or not all(a.isdigit() for a in argv[1:2]):
        print("usage: python scripts/step_drift_probe.py OUT.json [BLOCKS] [WORKLOAD]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    blocks = int(argv[1]) if len(argv) > 1 else 36
    spec = dataclasses.replace(SPEC, workload=argv[2]) if len(argv) > 2 else SPEC  # `tiny`: a quick smoke run
    s = setup(spec, settings_record(spec))
    batches = iter(train_batches(s.built.train, spec.batch_size, (blocks + 1) * BLOCK_STEPS, spec.seed))
    start = time.monotonic()
    rows = []
    for block in range(blocks + 1):  # block 0 warms up and is dropped
        step_s, forward_backward_s = [], []
        for _ in range(BLOCK_STEPS):
            batch = next(batches)
            began = time.perf_counter()
            s.model(**batch).loss.backward()
            backward = time.perf_counter()
            s.optimizer.step()
            step_s.append(time.perf_counter() - backward)
            forward_backward_s.append(backward - began)
            s.model.zero_grad(set_to_none=True)  # as the loop does (trial/engines/loop.py)
        if block:
            rows.append({"at_s": time.monotonic() - start, "step_s": statistics.median(step_s),
                         "forward_backward_s": statistics.median(forward_backward_s)})
    steps = [row["step_s"] for row in rows]
    moving = stats.spearmanr(steps, [row["forward_backward_s"] for row in rows]) if len(rows) > 2 else None
    middle = statistics.median(steps)
    result = {"spec": dataclasses.asdict(spec), "block_steps": BLOCK_STEPS, "blocks": rows,
              "step_median_s": middle, "step_stray": max(abs(v / middle - 1) for v in steps),
              "step_vs_forward_backward_spearman": None if moving is None else float(moving.statistic),
              "step_vs_forward_backward_p": None if moving is None else float(moving.pvalue),
              "env": environment(s.device)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(rows)} blocks of {BLOCK_STEPS} steps over {rows[-1]['at_s']:.0f} s: block medians of the step "
          f"{1e3 * min(steps):.2f}-{1e3 * max(steps):.2f} ms, each within ±{100 * result['step_stray']:.1f} % of their "
          f"median; Spearman rho with the forward/backward {result['step_vs_forward_backward_spearman']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
