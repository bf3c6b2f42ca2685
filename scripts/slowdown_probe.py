"""Why an injected optimizer.step() slowdown read larger than injected: the knob slept, and a sleep is not work.

One process, one model (the gate's smoke job: MiniLM, batch 8 x seq 32, AdamW), one loop, three ways of adding
FRACTION of each optimizer.step()'s own time, in interleaved blocks of steps (off, sleep, spin, spin, sleep, off,
...), so the machine's drift hits them alike and no process-to-process shift enters:

- `off`: nothing added;
- `sleep`: time.sleep(FRACTION x the step) — what the knob did;
- `spin`: a busy-wait for as long — what the knob does now (optbench/probes/slowdown.py busy_wait).

Per mode: the median optimizer.step() itself (without the added wait), the median forward/backward of the next
step, and how much longer the added wait took than asked (a sleep returns late when the core went elsewhere).

    python scripts/slowdown_probe.py OUT.json [FRACTION] [BLOCKS] [WORKLOAD]

Run it on an idle machine (about a minute); reference-results gate runs it beside the campaign.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optbench.job.spec import TrialSpec  # noqa: E402
from optbench.probes.slowdown import busy_wait  # noqa: E402
from optbench.records.environment import environment  # noqa: E402
from optbench.trial.run import setup  # noqa: E402
from optbench.trial.settings import settings_record  # noqa: E402
from optbench.workloads import train_batches  # noqa: E402

MODES = ("off", "sleep", "spin")
BLOCK_STEPS = 8
SPEC = TrialSpec(optimizer="adamw", workload="minilm", device="cpu", batch_size=8, seq_len=32, steps=10_000,
                 warmup_steps=0)


def _wait(mode: str, seconds: float) -> float:
    start = time.perf_counter()
    if mode == "sleep":
        time.sleep(seconds)
    elif mode == "spin":
        busy_wait(seconds)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    if not argv or not all(a.replace(".", "", 1).isdigit() for a in argv[1:3]):
        print("usage: python scripts/slowdown_probe.py OUT.json [FRACTION] [BLOCKS] [WORKLOAD]", file=sys.stderr)
        return 2
    out, fraction = Path(argv[0]), float(argv[1]) if len(argv) > 1 else 0.3
    blocks = int(argv[2]) if len(argv) > 2 else 6
    spec = dataclasses.replace(SPEC, workload=argv[3]) if len(argv) > 3 else SPEC  # `tiny`: a quick smoke run
    s = setup(spec, settings_record(spec))
    order = [mode for b in range(blocks) for mode in (MODES if b % 2 == 0 else MODES[::-1])]
    batches = train_batches(s.built.train, spec.batch_size, (len(order) + 1) * BLOCK_STEPS, spec.seed)
    seen: dict[str, dict[str, list[float]]] = {m: {"step_s": [], "forward_backward_s": [], "late": []} for m in MODES}
    previous = "off"
    for index, batch in enumerate(batches):
        mode = "warm-up" if index < BLOCK_STEPS else order[index // BLOCK_STEPS - 1]
        start = time.perf_counter()
        s.model(**batch).loss.backward()
        backward = time.perf_counter()
        s.optimizer.step()
        step_s = time.perf_counter() - backward
        waited = _wait(mode, fraction * step_s) if mode in ("sleep", "spin") else 0.0
        s.optimizer.zero_grad(set_to_none=True)
        if mode in MODES:
            seen[mode]["step_s"].append(step_s)
            seen[previous]["forward_backward_s"].append(backward - start)  # the step after the previous wait
            if mode != "off":
                seen[mode]["late"].append(waited / (fraction * step_s) - 1)
            previous = mode
    medians = {m: {k: statistics.median(v) for k, v in d.items() if v} for m, d in seen.items()}
    result = {"fraction": fraction, "blocks": blocks, "block_steps": BLOCK_STEPS, "medians": medians,
              "vs_off": {m: {k: medians[m][k] / medians["off"][k] - 1 for k in ("step_s", "forward_backward_s")}
                         for m in MODES if m != "off"},
              "env": environment(s.device)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"vs_off": result["vs_off"], "late": {m: medians[m].get("late") for m in MODES}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
