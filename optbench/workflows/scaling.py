"""Scaling sweep: the tiny BERT family at several widths, a few steps each, so that optimizer-state bytes and
step time can be read against parameter count.

`python -m optbench run --scale` trains the tiny BERT family (workload `tiny`, `hidden_size` N) for a
few steps with each optimizer: enough to create the full optimizer state (it exists from the first
step) and to time a handful of steady steps, not to learn anything. The fit and its figure are
optbench/report/scaling.py's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from optbench.job.spec import Preset, TrialSpec
from optbench.report import scaling
from optbench.workloads.classify import TINY_WIDTH_RULE, tiny_width_ok

if TYPE_CHECKING:
    from optbench.records.record import Record

# Hidden widths of the tiny BERT: 1.0 M to 22.5 M parameters (the top one is MiniLM-sized), 1.3 decades.
SCALE_WIDTHS: tuple[int, ...] = (32, 64, 128, 256, 512)
# Few steps: state is complete after the first step; 5 steps after the warm-up give a step-time median.
SCALE_PRESET = Preset("tiny", steps=8, warmup_steps=3, batch_size=8, seq_len=32, eval_size=32,
                      seeds=(0,), timeout_s=600)
SCALE_OUT = Path("results") / "scaling.jsonl"


def across_widths(specs: Iterable[TrialSpec], widths: Sequence[int] = SCALE_WIDTHS) -> list[TrialSpec]:
    """Each spec once per width (`workload_options["hidden_size"]`), smallest width first so an interrupted sweep
    already spans every optimizer at the small sizes. Raises ValueError on widths BERT cannot build."""
    if not all(map(tiny_width_ok, widths)) or len(set(widths)) < 2:
        raise ValueError(f"--widths needs at least two distinct hidden widths, each {TINY_WIDTH_RULE}; got "
                         f"{','.join(map(str, widths))}")
    specs = list(specs)
    return [dataclasses.replace(spec, workload="tiny", workload_options={**spec.workload_options, "hidden_size": width})
            for width in sorted(widths) for spec in specs]


def write_scaling(records: Iterable[Record], out: Path) -> tuple[str, Path]:
    """The fit table as markdown, and scaling.png written next to the results file `out`."""
    per_trial = scaling.trials(records)
    return scaling.render_scaling_markdown(per_trial), scaling.plot_scaling(per_trial, out.parent / scaling.FIGURE_NAME)
