"""A record's measured peak, split into what it holds: weights, grads, optimizer state and the rest.

The trial fills the split when it writes its record; the report calls it again on every record it reads, so
records from pytest-benchmark JSON or older files, which lack it, get the same split from the same rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optbench.records.record import Record


def on_cuda(record: Record) -> bool:
    """Whether the record's memory figures are the CUDA allocator's (else the process's RSS on CPU)."""
    return record.peak_cuda_allocated_bytes is not None


# Parallel modes whose gradients are views of DDP's all-reduce buckets (engines/parallel.py: gradient_as_bucket_view).
BUCKETED_GRAD_MODES = ("ddp", "zero1")


def grads_in_baseline_bytes(record: Record) -> int:
    """Gradient bytes a CPU record's RSS baseline already holds, which RSS growth therefore leaves out.

    Under ddp and zero1 the gradients are views of DDP's buckets: allocated when the model is wrapped and written
    by the warm-up backward, before the memory window opens, so no training step adds pages for them (a 64 MiB
    gradient adds 64 MiB of RSS in one process and 2 MiB under DDP with two gloo ranks). One process and FSDP2
    allocate theirs inside the window. On CUDA the allocator's peak counts every live tensor: nothing to add."""
    if on_cuda(record) or record.parallel not in BUCKETED_GRAD_MODES:
        return 0
    return record.grads_bytes or 0


def held_bytes(record: Record) -> int | None:
    """What training holds between steps on CPU (grads + state + what the allocator keeps): the RSS growth
    right after the last optimizer step, plus gradients the baseline already held. None on CUDA, where RSS
    does not see the device's memory."""
    if on_cuda(record) or record.rss_growth_after_step_bytes is None:
        return None
    return record.rss_growth_after_step_bytes + grads_in_baseline_bytes(record)


def train_memory_bytes(record: Record) -> int | None:
    """What training itself costs: the CUDA peak on a GPU; on CPU the peak RSS growth over the post-setup baseline
    (the process's own baseline — Python, torch, the loaded model — is the same for every optimizer), plus the
    gradients that baseline already holds under ddp and zero1."""
    if on_cuda(record):
        return record.peak_cuda_allocated_bytes
    if record.peak_rss_growth_bytes is None:
        return None
    return record.peak_rss_growth_bytes + grads_in_baseline_bytes(record)


def split_peak_memory(record: Record) -> None:
    """Fill `peak_memory_bytes`, `other_peak_bytes` and `held_other_bytes` from the measured peaks.

    On CUDA the allocator's peak counts every tensor it allocated, weights included, but not state allocated
    around it (`paged_state_bytes`): that is added to the peak, and so subtracted only once with the state. On
    CPU the RSS peak is read as growth over the post-setup baseline, which already holds the weights (and, under
    ddp and zero1, the gradients: `grads_in_baseline_bytes`), so they are added back. What is left after weights,
    grads and optimizer state is activations and temporaries ("other").
    On CPU that remainder can come out negative: the baseline is taken after a warm-up backward whose
    freed buffers the allocator may keep resident and reuse (so grads or state need no new pages), and
    RSS counts pages rather than tensors. A negative remainder means "no measurable extra", so it is
    clamped at 0 rather than reported as memory given back. `held_other_bytes` is the same remainder of what
    training holds between steps (`held_bytes`), CPU only, unclamped.

    The split is derived: where the measured fields are there it is derived again, so a record written before a
    rule changed (the ddp gradients above) reads by the current rule; a record without them keeps what it has.
    """
    if on_cuda(record):
        record.peak_memory_bytes = record.peak_cuda_allocated_bytes + (record.paged_state_bytes or 0)
    elif record.peak_rss_growth_bytes is not None and record.weights_bytes is not None:
        record.peak_memory_bytes = record.weights_bytes + train_memory_bytes(record)
    if None in (record.grads_bytes, record.state_bytes):
        return
    held = held_bytes(record)
    if held is not None:
        record.held_other_bytes = held - record.grads_bytes - record.state_bytes
    elif on_cuda(record):
        record.held_other_bytes = None
    if record.peak_memory_bytes is None or record.weights_bytes is None:
        return
    other = record.peak_memory_bytes - record.weights_bytes - record.grads_bytes - record.state_bytes
    record.other_peak_bytes = max(0, other)
