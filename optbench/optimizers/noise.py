"""Library messages known to be harmless, kept out of a user's output: their first lines are optbench's answer.

transformers imports torchao whenever it is installed (its quantizers register themselves), so every command that
builds a model would open with torchao's import-time messages (and bitsandbytes' on some CPUs). Each entry names
the logger, the message (a pattern that matches that message only) and why it is harmless here; nothing else is
filtered, and a message that changes its wording shows again. `filter_known_noise()` is called first by every entry
point (the command line, the forkserver, a trial child, a torchrun rank).
"""

from __future__ import annotations

import logging
import re

KNOWN_NOISE = (
    ("torchao", r"^Failed to load \S*torchao/_C_\w+\S*\.so: ",
     "torchao's optional compiled kernels (MXFP8, CUTLASS) built for another torch or GPU; optbench's torchao "
     "optimizers do not use them"),
    ("torch.utils._pytree", r"^<enum '\w+'> is an Enum subclass and is now natively supported by torch\.compile",
     "torchao registers its enums for torch.compile the old way, which torch no longer needs; a deprecation notice"),
    ("bitsandbytes.backends.cpu.ops", r"^Failed to load CPU gemm_4bit_forward from kernels-community: ",
     "bitsandbytes' optional 4-bit CPU matmul kernel, fetched from the hub by the `kernels` package on AVX512-BF16 "
     "CPUs; optbench's bitsandbytes optimizers run no 4-bit matmul"),
)


class _Drop(logging.Filter):
    """Drops the records of one logger whose message matches `pattern`."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def filter_known_noise() -> None:
    """Install the filters (once per process; calling again adds nothing)."""
    for logger_name, pattern, _why in KNOWN_NOISE:
        logger = logging.getLogger(logger_name)
        if not any(isinstance(f, _Drop) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))
