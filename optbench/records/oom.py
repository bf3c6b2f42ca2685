"""Out of memory, recognised in one place: in an exception a trial raised (trial/run.py) and in the log of a trial
process that died without writing its record (sweep/executors.py). Either way the trial is recorded `oom`, a
result, not `error`."""

from __future__ import annotations

import re

# What running out of memory says, lower-cased: torch's OutOfMemoryError ("CUDA out of memory. Tried to allocate
# ..."), Python's MemoryError, C++'s std::bad_alloc (an allocation refused under the RLIMIT_AS memory cap, often
# as "what(): std::bad_alloc" before an abort), and the C library's words for a refused mmap or brk.
OOM_MARKERS = ("outofmemoryerror", "out of memory", "memoryerror", "std::bad_alloc", "cannot allocate memory",
               "can't allocate memory")
# Rust's (the tokenizers library's) refused allocation, which aborts the process: "memory allocation of 5 bytes
# failed"
RUST_OOM = re.compile(r"memory allocation of \d+ bytes failed")


def says_out_of_memory(text: str) -> bool:
    """Whether an error message or a log tail says the process ran out of memory."""
    lowered = text.lower()
    return any(marker in lowered for marker in OOM_MARKERS) or RUST_OOM.search(lowered) is not None


def out_of_memory_cause(exc: BaseException) -> BaseException | None:
    """The out-of-memory failure behind an exception, if any: the exception itself or one in its cause/context
    chain that is a MemoryError or whose type or message says so. A library may word it as something else:
    transformers turns a refused allocation while it makes a batch's tensors into "ValueError: Unable to create
    tensor, you should probably activate truncation and/or padding ..." (raised from it)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or says_out_of_memory(f"{type(current).__name__}: {current}"):
            return current
        current = current.__cause__ or current.__context__
    return None


def under_cap(error: str, cap_bytes: int | None) -> str:
    """An out-of-memory error with the trial's own --max-memory cap named, where it had one: Python's MemoryError
    says nothing ("MemoryError: "), and the cap, not the machine, is usually what ran out."""
    if not cap_bytes:
        return error
    return f"{error.rstrip(': ')} (under the trial's --max-memory cap of {cap_bytes / 2**20:,.0f} MiB)"
