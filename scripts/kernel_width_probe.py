"""Why a fused AdamW step read above 100 % of a triad's ceiling: how many bytes a kernel moves depends on how many
streams it keeps in flight, not only on the memory.

Three in-place kernels, their bytes counted as an optimizer step's are (every operand byte read once, every
written byte once), over the same working sets (all operands together), in interleaved rounds so that the
machine's drift hits them alike:

- `triad`: `a += s * b` — two operands, 3 x the operand moved (what calibrate-bandwidth ran before);
- `addcmul`: `a += b * c` — three operands, 4 x;
- `fused-adamw`: torch's fused AdamW update over weights, gradients and two moments — four operands, 7 x (the
  stream probe's kernel, optbench/probes/stream.py: what calibrate-bandwidth runs now).

Then the fused AdamW step of MiniLM's own parameters alone in this process (random gradients, no forward or
backward between steps): its median time and the bandwidth its analytic traffic (optimizers/base.py) gives.

    python scripts/kernel_width_probe.py OUT.json [ROUNDS] [PASSES]

Run it on an idle machine (about a minute at the defaults); reference-results roofline runs it after its trials.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from optbench import optimizers  # noqa: E402
from optbench.job.spec import TrialSpec  # noqa: E402
from optbench.probes import stream  # noqa: E402
from optbench.records.environment import environment  # noqa: E402
from optbench.trial.run import setup  # noqa: E402
from optbench.trial.settings import settings_record  # noqa: E402

WORKING_SETS_MIB = (240, 480, 960)  # the levels MiniLM's step (364 MB) and the memory sit between
STEP_SPEC = TrialSpec(optimizer="adamw_fused", workload="minilm", device="cpu", batch_size=8, seq_len=32,
                      steps=10_000, warmup_steps=0)
STEPS, WARM_UP_STEPS = 60, 6


def _timed(work, passes: int, nbytes: int) -> list[float]:
    work()  # untimed: warms the kernel
    rates = []
    for _ in range(passes):
        start = time.perf_counter()
        work()
        rates.append(nbytes / (time.perf_counter() - start))
    return rates


def triad(working_set: int, passes: int) -> list[float]:
    a = torch.ones(working_set // 2 // 4)
    b = torch.full_like(a, 1e-3)
    return _timed(lambda: a.add_(b, alpha=0.5), passes, 3 * a.nbytes)


def addcmul(working_set: int, passes: int) -> list[float]:
    a = torch.ones(working_set // 3 // 4)
    b, c = torch.full_like(a, 1e-3), torch.full_like(a, 0.5)
    return _timed(lambda: a.addcmul_(b, c), passes, 4 * a.nbytes)


def fused_adamw(working_set: int, passes: int) -> list[float]:
    return stream.stream_bandwidth_samples(torch.device("cpu"), passes, working_set // stream.OPERANDS)


KERNELS = {"triad": triad, "addcmul": addcmul, "fused-adamw": fused_adamw}


def minilm_step() -> dict[str, float]:
    """MiniLM's fused AdamW step alone: random gradients, the optimizer stepped back to back."""
    s = setup(STEP_SPEC, settings_record(STEP_SPEC))
    params = [p for p in s.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    times = []
    for index in range(WARM_UP_STEPS + STEPS):
        start = time.perf_counter()
        s.optimizer.step()
        if index >= WARM_UP_STEPS:
            times.append(time.perf_counter() - start)
    weights = sum(p.nbytes for p in params)
    traffic = optimizers.resolve(STEP_SPEC.optimizer).analytic_for(s.model).step_traffic_bytes
    median = statistics.median(times)
    return {"weights_bytes": weights, "traffic_bytes": traffic, "median_s": median,
            "q05_s": float(np.quantile(times, 0.05)), "bandwidth_bytes_per_s": traffic / median}


def main(argv: list[str]) -> int:
    if not argv or not all(a.isdigit() for a in argv[1:3]):
        print("usage: python scripts/kernel_width_probe.py OUT.json [ROUNDS] [PASSES]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    rounds = int(argv[1]) if len(argv) > 1 else 4
    passes = int(argv[2]) if len(argv) > 2 else 10
    seen: dict[int, dict[str, list[float]]] = {mib: {name: [] for name in KERNELS} for mib in WORKING_SETS_MIB}
    for round_index in range(rounds):
        names = list(KERNELS) if round_index % 2 == 0 else list(KERNELS)[::-1]
        for mib in WORKING_SETS_MIB:
            for name in names:
                seen[mib][name] += KERNELS[name](mib * 2**20, passes)
    kernels = {str(mib): {name: {"passes": len(rates), "median_bytes_per_s": float(np.median(rates)),
                                 "q95_bytes_per_s": float(np.quantile(rates, 0.95))}
                          for name, rates in by_kernel.items()}
               for mib, by_kernel in seen.items()}
    result = {"rounds": rounds, "passes": passes, "threads": torch.get_num_threads(), "kernels": kernels,
              "minilm_fused_adamw_step": minilm_step(), "env": environment(torch.device("cpu"))}
    out.write_text(json.dumps(result, indent=1) + "\n")
    for mib, by_kernel in kernels.items():
        print(f"{mib} MiB: " + ", ".join(f"{name} {k['median_bytes_per_s'] / 1e9:.1f} GB/s (q95 "
                                          f"{k['q95_bytes_per_s'] / 1e9:.1f})" for name, k in by_kernel.items()))
    step = result["minilm_fused_adamw_step"]
    print(f"MiniLM fused AdamW step alone: {step['traffic_bytes'] / 1e6:.0f} MB in {step['median_s'] * 1e3:.2f} ms, "
          f"{step['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
