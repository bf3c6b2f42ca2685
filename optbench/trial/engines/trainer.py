"""The trial through Hugging Face `Trainer`: the loop most fine-tuning runs actually use.

The registry's optimizer and the trial's warm-up schedule go in as `optimizers=(optimizer, scheduler)`,
the training split as a map-style dataset, the workload's loss through `compute_loss`; `OptbenchCallback`
does the timing (the native engine's intervals: see integrations/callback.py) and the memory window. Trainer's
own extras are off (no saving but `--resume-check`'s checkpoint (engines/trainer_resume.py), no reporting,
evaluation, gradient clipping, NaN filtering of the logged loss) so the
job is the native engine's: the differences left are Trainer's own (its shuffling order, its per-step
bookkeeping — transformers 5 computes the gradient norm every step for its logs, inside the forward/backward
interval), which is what this engine shows.

Device: outside a distributed launch Trainer picks `cuda:0` and, with more than one GPU visible, wraps the model
in `nn.DataParallel` (TrainingArguments._setup_devices sets `_n_gpu` to the GPU count). `pin_device` gives it the
trial's one GPU instead, so a trial never spreads over GPUs it was not given.
"""

from __future__ import annotations

import sys
import tempfile
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from optbench.trial.engines.base import EngineResult
from optbench.trial.engines.loop import warm_up
from optbench.trial.engines.trainer_resume import TrainerResumeCheck

if TYPE_CHECKING:
    from optbench.records.record import Record
    from optbench.trial.engines.base import Setup


class SplitDataset(torch.utils.data.Dataset):
    """A workload split (a dict of equally long tensors) as rows of dicts, which Trainer's collator stacks."""

    def __init__(self, split: dict[str, torch.Tensor]) -> None:
        self.split = split

    def __len__(self) -> int:
        return next(iter(self.split.values())).shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {k: v[index] for k, v in self.split.items()}


class EvalCurve(TrainerCallback):
    """`--eval-every`: the fixed curve subset scored every K steps, after the step's timing has closed."""

    def __init__(self, s: Setup, record: Record, timing) -> None:
        self.s, self.record, self.timing = s, record, timing
        self.split = s.curve_split if s.spec.eval_every else None

    def on_step_end(self, args, state, control, **kwargs):
        from optbench.trial.engines.base import evaluate

        if self.split is not None and state.global_step % self.s.spec.eval_every == 0:
            with self.timing.memory.paused():  # an evaluation's memory is not the training peak
                value = evaluate(self.s, self.split)[self.record.target_metric]
            self.record.eval_curve.append([state.global_step, self.timing.trained_s, value])


def training_arguments(s: Setup, output_dir: str, **overrides: Any):
    from transformers import TrainingArguments

    spec = s.spec
    settings = dict(
        output_dir=output_dir, max_steps=spec.steps, per_device_train_batch_size=spec.batch_size,
        seed=spec.seed, data_seed=spec.seed, use_cpu=s.device.type == "cpu",
        bf16=spec.precision == "bf16-autocast", fp16=spec.precision == "fp16-autocast",
        max_grad_norm=0.0,  # the native loop does not clip
        logging_strategy="steps", logging_steps=1,  # one loss per step: the loss curve (logged after on_step_end)
        logging_nan_inf_filter=False,  # a non-finite loss must show: it is how divergence is recorded
        eval_strategy="no", save_strategy="no", report_to=[], disable_tqdm=not sys.stderr.isatty(),
        dataloader_num_workers=0, remove_unused_columns=False,
        # Trainer's training step hands LOMO the learning rate for its fused backward only when told the name.
        **({"optim": s.entry.trainer_optim} if s.entry.trainer_optim else {}),
    )
    return pin_device(TrainingArguments(**{**settings, **overrides}), s.device)


def pin_device(args, device: torch.device):
    """Make `args` (TrainingArguments, whose device is already set up) train on `device` alone: its cached
    `_setup_devices` (transformers 5: a functools.cached_property, read through `args.device`) becomes `device`,
    that GPU becomes the current one (Trainer's Accelerator places everything on the current GPU), and `_n_gpu`
    is 1, so Trainer never wraps the model in DataParallel. A CPU trial keeps Trainer's own choice (no GPU)."""
    if device.type != "cuda":
        return args
    args.__dict__["_setup_devices"] = device
    torch.cuda.set_device(device)
    args._n_gpu = 1
    return args


def build_trainer(s: Setup, output_dir: str, callbacks: list, resume: Any = None, timing: Any = None):
    """A Trainer on the trial's objects: the registry's optimizer and the trial's schedule, the training split, the
    workload's loss. With `resume` (an engines.trainer_resume.TrainerResumeCheck), Trainer's own `_save_checkpoint`
    writes the resume check's checkpoint at the middle step only (outside the memory window's peak:
    `timing.memory.paused()`) and nowhere else."""
    from transformers import PrinterCallback, Trainer

    workload = s.workload

    class WorkloadTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return workload.loss(model, inputs)  # Trainer wraps this in its bf16/fp16 autocast

        def _save_checkpoint(self, model, trial):
            if resume is None:
                return super()._save_checkpoint(model, trial)
            if self.state.global_step == resume.mid:
                parent = super()._save_checkpoint
                with timing.memory.paused():
                    resume.save(lambda: parent(model, trial))
            return None

    args = training_arguments(s, output_dir, **(resume.arguments() if resume is not None else {}))
    trainer = WorkloadTrainer(model=s.model, args=args, train_dataset=SplitDataset(s.built.train),
                              optimizers=(s.optimizer, s.scheduler), callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # it prints every per-step log line on stdout
    return trainer


def train(s: Setup, record: Record) -> EngineResult:
    from optbench.trial.callback import OptbenchCallback
    from optbench.trial.engines.base import Diverged

    callback = OptbenchCallback(record=record, warmup_steps=s.spec.warmup_steps)
    # --resume-check: Trainer's own checkpoint and resume_from_checkpoint; its folder outlives train()
    resume = TrainerResumeCheck(s, record, build_trainer) if s.spec.resume_check else None
    warm_up(s)  # the same untimed pass as the native engine, so the memory baselines match
    with tempfile.TemporaryDirectory(prefix="optbench-trainer-") as output_dir:
        trainer = build_trainer(s, resume.output_dir if resume is not None else output_dir,
                                [callback, EvalCurve(s, record, callback)], resume, callback)
        trainer.train()
    if callback.diverged_at is not None:
        raise Diverged(f"loss became non-finite at step {callback.diverged_at}")
    return EngineResult(memory=callback.memory, samples=callback.samples, resume=resume)
