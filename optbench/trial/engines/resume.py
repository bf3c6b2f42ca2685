"""`--resume-check`: does the optimizer checkpoint and resume exactly?

At the middle step the trial saves model + optimizer + scheduler (+ GradScaler) state and the RNG states, the way
a training loop checkpoints: `torch.save` in a single process; under `--parallel` the model and optimizer state
through `torch.distributed.checkpoint`'s state-dict API (`get_state_dict` / `set_state_dict`, DTensor-aware; a
ZeRO-1 optimizer is consolidated on rank 0 first, as its docs say). The uninterrupted run goes on to the end and
is the reference. Then freshly built objects (a new model, optimizer and schedule, from the same seed) load the
checkpoint and train the second half on the same batches; their final parameters and last loss are compared with
the reference's. The save and the reload sit outside the timed intervals and the memory window's peak.

An optimizer that needs a mode switch before saving gets it as its authors document: schedule-free AdamW is
switched to `eval()` before `state_dict()` and back to `train()` after saving and after loading; the record says so.

`resume_status`: `exact` (bit-identical parameters and loss), `close` (max |Δparam| <= CLOSE_PARAM_DIFF and
|Δloss| <= CLOSE_LOSS_DIFF), `diverged` (beyond those), or `error: <the library's message>` when saving or
loading failed — a result, as every failure here is.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from optbench.records.record import Record
from optbench.trial.engines.base import Setup
from optbench.trial.engines.loop import timed_steps

# torch.distributed.checkpoint raises CheckpointException, a BaseException: a failed save or load is still a result
FAILURES: tuple[type[BaseException], ...] = (Exception,)
CLOSE_PARAM_DIFF = 1e-5  # below float32 noise of an update step at fine-tuning lrs
CLOSE_LOSS_DIFF = 1e-4


def middle_step(steps: int) -> int:
    """Steps trained before the checkpoint, in both checks (native and Trainer): half the job, at least one."""
    return max(1, steps // 2)


class ResumeCheck:
    """The native loop's check (native, accelerate and the parallel modes): saves at the middle step (the loop's
    `after_step` hook), then `finish` resumes and compares."""

    def __init__(self, s: Setup, record: Record) -> None:
        self.s, self.record = s, record
        self.mid = middle_step(s.spec.steps)
        self.folder, self.path = _shared_folder()
        self.error: str | None = None
        if switches_mode(s):
            record.resume_note = "optimizer.eval() before saving, optimizer.train() after saving and loading"

    @classmethod
    def if_asked(cls, s: Setup, record: Record) -> ResumeCheck | None:
        """The check where the spec asks for it (`--resume-check`), else None."""
        return cls(s, record) if s.spec.resume_check else None

    def acts_at(self, step: int) -> bool:
        """Only the middle step saves."""
        return step + 1 == self.mid

    def after_step(self, step: int) -> None:
        """The save (StepLog calls it only where `acts_at`)."""
        self._attempt(self._save)

    def _attempt(self, phase: Any, *args: Any) -> bool:
        """Run one phase; a failure is the result (its message kept). In a group every rank must take the same
        path afterwards (the next phase is collective), so the ranks agree: if any failed, all stop."""
        try:
            phase(*args)
            failed = None
        except FAILURES as exc:
            failed = _message(exc)
        if _distributed():
            messages: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(messages, failed)
            failed = next((f"rank {rank}: {m}" for rank, m in enumerate(messages) if m), None)
        self.error = self.error or failed
        return failed is None

    def _save(self) -> None:
        s = self.s
        timed_save(s, self.record, self.path, lambda: save_distributed(s, self.path) if _distributed() else
                   torch.save(capture(s), self.path))

    def finish(self, fresh: Setup) -> None:
        """Load into `fresh` (new objects from the same spec), train the second half, compare; fills the record."""
        if self.error is None and self._attempt(self._load, fresh):
            self._attempt(self._continue, fresh)
        if _distributed():
            torch.distributed.barrier()  # every rank is done reading before rank 0 removes the folder
        if self.folder is not None:
            self.folder.cleanup()
        if self.error is not None:
            self.record.resume_status = f"error: {self.error}"

    def _load(self, fresh: Setup) -> None:
        start = time.perf_counter()
        restore(fresh, load_distributed(fresh, self.path) if _distributed() else
                torch.load(self.path, weights_only=False))
        fresh.entry.after_eval(fresh.optimizer)
        _sync(fresh.device)
        self.record.checkpoint_load_s = time.perf_counter() - start

    def _continue(self, fresh: Setup) -> None:
        losses = [loss for *_, loss in timed_steps(fresh, start=self.mid)]
        compare(self.record, _params(self.s.model), _params(fresh.model), self.record.loss_curve[-1], losses[-1])


def switches_mode(s: Setup) -> bool:
    """Whether the optimizer needs its eval() mode to save (schedule-free): its registry entry has a hook for it."""
    return s.entry.before_eval is not _default_hook() and s.optimizer is not None


def timed_save(s: Setup, record: Record, path: Path, write: Any) -> None:
    """Save with `write()`, the optimizer in its eval() mode meanwhile where it has one; `checkpoint_save_s` and
    the bytes `path` holds after it go on the record. Both resume checks, native and Trainer, save this way."""
    start = time.perf_counter()
    s.entry.before_eval(s.optimizer)
    try:
        write()
    finally:
        s.entry.after_eval(s.optimizer)
    _sync(s.device)
    record.checkpoint_save_s = time.perf_counter() - start
    record.checkpoint_bytes = _size_bytes(path)


def _shared_folder() -> tuple[tempfile.TemporaryDirectory | None, Path]:
    """A fresh folder for the checkpoint: rank 0's, shared with every rank of a group (which must write their shards
    into one checkpoint); only its creator removes it."""
    folder = None
    if not _distributed() or torch.distributed.get_rank() == 0:
        folder = tempfile.TemporaryDirectory(prefix="optbench-resume-")
    name = [folder.name if folder is not None else None]
    if _distributed():
        torch.distributed.broadcast_object_list(name, src=0)
    return folder, Path(name[0]) / "checkpoint"


def _default_hook() -> Any:
    from optbench.optimizers.base import OptimizerSpec

    return OptimizerSpec.__dataclass_fields__["before_eval"].default


def loop_state(s: Setup) -> dict[str, Any]:
    """What a loop needs besides model and optimizer to continue exactly: schedule, loss scaler, RNG states."""
    state = {"scheduler": s.scheduler.state_dict(), "rng": torch.get_rng_state()}
    if s.scaler is not None:
        state["scaler"] = s.scaler.state_dict()
    if s.device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(s.device)
    return state


def capture(s: Setup) -> dict[str, Any]:
    """A single process's whole checkpoint: model, optimizer and the loop state."""
    return {"model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(), **loop_state(s)}


def restore(s: Setup, state: dict[str, Any]) -> None:
    """Load a checkpoint into fresh objects (model and optimizer only when the state carries them)."""
    if "model" in state:
        s.model.load_state_dict(state["model"])
        s.optimizer.load_state_dict(state["optimizer"])
    s.scheduler.load_state_dict(state["scheduler"])
    if s.scaler is not None and "scaler" in state:
        s.scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], s.device)


def _is_zero(optimizer: Any) -> bool:
    return hasattr(optimizer, "consolidate_state_dict")


def save_distributed(s: Setup, path: Path) -> None:
    """Every rank: its loop state; model and optimizer through torch.distributed.checkpoint (each rank writes its
    own shards), or for ZeRO-1 the optimizer consolidated on rank 0 as its documentation prescribes."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank = dist.get_rank()
    path.mkdir(parents=True, exist_ok=True)
    torch.save(loop_state(s), path / f"loop-rank{rank}.pt")
    if _is_zero(s.optimizer):
        s.optimizer.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": s.model.module.state_dict(), "optimizer": s.optimizer.state_dict()}, path / "zero.pt")
    else:
        model_state, optimizer_state = get_state_dict(s.model, s.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path / "dcp"))
    dist.barrier()


def load_distributed(fresh: Setup, path: Path) -> dict[str, Any]:
    """Load model and optimizer into the fresh, already wrapped objects; returns this rank's loop state."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if _is_zero(fresh.optimizer):
        whole = torch.load(path / "zero.pt", weights_only=False)
        fresh.model.module.load_state_dict(whole["model"])
        fresh.optimizer.load_state_dict(whole["optimizer"])
    else:
        model_state, optimizer_state = get_state_dict(fresh.model, fresh.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(fresh.model, fresh.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
    return torch.load(path / f"loop-rank{dist.get_rank()}.pt", weights_only=False)


def compare(record: Record, reference: list[torch.Tensor], resumed: list[torch.Tensor], reference_loss: float,
            resumed_loss: float) -> None:
    """Max |Δparam| over every parameter and |Δ last loss|, and the status they mean."""
    diff = max((float((a - b).abs().max()) for a, b in zip(reference, resumed, strict=True) if a.numel()),
               default=0.0)
    record.resume_max_abs_param_diff = diff
    record.resume_final_loss_diff = abs(resumed_loss - reference_loss)
    if diff == 0.0 and record.resume_final_loss_diff == 0.0:
        record.resume_status = "exact"
    elif diff <= CLOSE_PARAM_DIFF and record.resume_final_loss_diff <= CLOSE_LOSS_DIFF:
        record.resume_status = "close"
    else:
        record.resume_status = "diverged"


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    """Full parameter values (a sharded DTensor gathered), in float32, on the CPU."""
    tensors = []
    for p in model.parameters():
        value = p.detach()
        if hasattr(value, "full_tensor"):
            value = value.full_tensor()
        tensors.append(value.float().cpu())
    return tensors


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _checkpoint_failures() -> tuple[type[BaseException], ...]:
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


if torch.distributed.is_available():
    FAILURES = _checkpoint_failures()


def _size_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _message(exc: BaseException) -> str:
    """The library's own message, short enough for a table cell: its first line, or where torch.load's
    weights-only unpickler refused a class, the line that names it (the first line only says loading failed)."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()] or [""]
    cause = next((line for line in lines if line.startswith("WeightsUnpickler error:")), lines[0])
    return f"{type(exc).__name__}: {cause}"[:300]
