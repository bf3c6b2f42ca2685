"""A record's measured peak, split into what it holds: weights, grads, optimizer state and the rest.

The trial fills the split when it writes its record; the report calls it again on every record it reads, so
records from pytest-benchmark JSON or older files, which lack it, get the same split from the same rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optbench.records.record import Record


def split_peak_memory(record: Record) -> None:
    """Fill `peak_memory_bytes` and `other_peak_bytes` from the measured peaks.

    On CUDA the allocator's peak counts every tensor it allocated, weights included, but not state allocated
    around it (`paged_state_bytes`): that is added to the peak, and so subtracted only once with the state. On
    CPU the RSS peak is read as growth over the post-setup baseline, which already holds the weights, so they are
    added back. What is left after weights, grads and optimizer state is activations and temporaries ("other").
    On CPU that remainder can come out negative: the baseline is taken after a warm-up backward whose
    freed buffers the allocator may keep resident and reuse (so grads or state need no new pages), and
    RSS counts pages rather than tensors. A negative remainder means "no measurable extra", so it is
    clamped at 0 rather than reported as memory given back.

    Only fields the record lacks are filled, so the report can call this on any record it reads.
    """
    if record.peak_memory_bytes is None:
        if record.peak_cuda_allocated_bytes is not None:
            record.peak_memory_bytes = record.peak_cuda_allocated_bytes + (record.paged_state_bytes or 0)
        elif record.peak_rss_growth_bytes is not None and record.weights_bytes is not None:
            record.peak_memory_bytes = record.weights_bytes + record.peak_rss_growth_bytes
    if record.other_peak_bytes is not None or record.peak_memory_bytes is None or None in (
            record.weights_bytes, record.grads_bytes, record.state_bytes):
        return
    other = record.peak_memory_bytes - record.weights_bytes - record.grads_bytes - record.state_bytes
    record.other_peak_bytes = max(0, other)
