"""Why a bare loop written from scratch can read slower than the harness on "the same" MiniLM job: it trains on
other data. Three bare loops (forward, backward, AdamW step, zero_grad; no harness) over copies of one model,
interleaved in ABBA order, differing only in their batches:

- `workload`: the harness's own batches (the embedded reviews, padded to seq 32: about 45 % padding, masked);
- `random-ids-full-mask`: random token ids with a full attention mask (what a from-scratch loop typically feeds);
- `workload-ids-full-mask`: the workload's token ids with the padding unmasked.

    python scripts/bare_loop_probe.py OUT.json [PAIRS]

writes each loop's median step per repetition and the ratios to the workload loop; run it on an idle machine.
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from optbench.job.spec import TrialSpec  # noqa: E402
from optbench.records.environment import environment  # noqa: E402
from optbench.workloads import get_workload, train_batches  # noqa: E402

SPEC = TrialSpec(optimizer="adamw", workload="minilm", device="cpu", steps=20, warmup_steps=4, batch_size=16,
                 seq_len=32)
KINDS = ("workload", "random-ids-full-mask", "workload-ids-full-mask")


def batches(built, kind: str):
    generator = torch.Generator().manual_seed(0)
    vocab = built.model.config.vocab_size
    for batch in train_batches(built.train, SPEC.batch_size, SPEC.steps, SPEC.seed):
        if kind == "random-ids-full-mask":
            ids = torch.randint(1000, vocab, batch["input_ids"].shape, generator=generator)
            batch = {**batch, "input_ids": ids, "attention_mask": torch.ones_like(batch["attention_mask"])}
        elif kind == "workload-ids-full-mask":
            batch = {**batch, "attention_mask": torch.ones_like(batch["attention_mask"])}
        yield batch


def median_step_s(built, kind: str) -> float:
    model = copy.deepcopy(built.model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    times = []
    for batch in batches(built, kind):
        start = time.perf_counter()
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[SPEC.warmup_steps:])


def main(argv: list[str]) -> int:
    out, pairs = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 4
    built = get_workload("minilm").build(SPEC)
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for rep in range(pairs):
        for kind in KINDS if rep % 2 == 0 else KINDS[::-1]:
            runs[kind].append(median_step_s(built, kind))
    medians = {kind: statistics.median(values) for kind, values in runs.items()}
    result = {"step_median_s": runs, "ratio_to_workload": {k: v / medians["workload"] for k, v in medians.items()},
              "non_padding_token_share": float(built.train["attention_mask"].float().mean()),
              "env": environment(torch.device("cpu"))}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["ratio_to_workload"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
