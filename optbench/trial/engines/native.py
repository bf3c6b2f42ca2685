"""optbench's own training loop: plain PyTorch, timed the way a GPU needs.

Per step (engines/loop.py): move one batch to the device (before the timed intervals), forward under the precision's
autocast, backward (through the GradScaler for fp16 on CUDA, which then unscales the gradients and checks them for
inf/NaN), optimizer step, zero_grad and schedule. Three intervals are timed with `timing.StepTimer` and added
up the way every engine adds them up (`timing.STEP_MARKS`): forward/backward, optimizer.step() alone,
zero_grad + schedule — CUDA events, one synchronize at the end of the step (the GradScaler's own inf check aside),
perf_counter on CPU. The gaps between intervals hold the untimed probes (fidelity, RSS after the last step);
`--eval-every` evaluations run between steps, so neither shows in the medians. A step the GradScaler skips is
trained on but kept out of `first_step_s` and the medians (`base.StepLog`). Under `--resume-check` the loop
saves at the middle step through its own check (engines/resume.py), which the trial finishes after describing.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from optbench.probes import measure
from optbench.trial.engines.base import EngineResult, StepLog
from optbench.trial.engines.loop import timed_steps, warm_up
from optbench.trial.engines.resume import ResumeCheck

if TYPE_CHECKING:
    from optbench.records.record import Record
    from optbench.trial.engines.base import Setup


def train(s: Setup, record: Record) -> EngineResult:
    from optbench.probes.fidelity import UpdateFidelity
    from optbench.probes.paired import PairedStream

    spec = s.spec
    # Built before the baseline so its fixed buffers (parameter snapshot + shadow parameters) sit in it;
    # the shadow's moments appear lazily on its first step and do land in the peaks: hence `fidelity`.
    probe = UpdateFidelity(s.optimizer) if spec.fidelity else None
    # --paired-probe: its operands before the baseline too, so that the training-memory figures do not carry them
    paired = PairedStream.for_model(s.model, s.device) if spec.paired_probe else None
    check = ResumeCheck.if_asked(s, record)
    warm_up(s)
    memory = measure.MemoryWindow(s.device)
    log = StepLog(s, record, memory, hook=check)
    progress = _progress(spec, record)
    for sample in timed_steps(s, probe=probe, memory=memory):
        progress.update(1)
        progress.set_postfix(loss=f"{sample.loss:.3f}", refresh=False)
        if paired is not None and sample.stepped:
            paired.after_step(sample.step)  # after the step's timed intervals, before the next step
        log.after_step(sample.step, sample.step_s, sample.optimizer_s, sample.loss, sample.stepped)
    progress.close()
    return log.result(memory, resume=check, fidelity=probe, paired=paired)


def _progress(spec, record: Record):
    from tqdm.auto import tqdm

    # A bar only on a terminal (the runner sets OPTBENCH_PROGRESS=1 when its own stderr is one): a log
    # file would collect every carriage-return frame.
    on_terminal = sys.stderr.isatty() or os.environ.get("OPTBENCH_PROGRESS") == "1"
    return tqdm(total=spec.steps, desc=f"{record.optimizer} seed={spec.seed}", unit="step", file=sys.stderr,
                leave=False, dynamic_ncols=True, disable=not on_terminal)
