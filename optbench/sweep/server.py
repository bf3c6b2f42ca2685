"""The forkserver's first preload: the environment its libraries read when they are imported there, set in the
forkserver's own process (never in the sweep's, whose os.environ no code changes).

multiprocessing starts the forkserver with the sweep's environment and offers no way to pass another, so the
server sets its own before it imports anything else: tokenizers without their own thread pool (a pool started
before a fork is disabled in every child, with a warning) and the CUDA check through NVML (a preloaded library
that asks `torch.cuda.is_available()` must not initialise CUDA: a child forked after that could not use it).
Each forked child then replaces the environment it inherited with the one the sweep handed it (child.run_child).

Named only in the forkserver's preload list (executors.LocalExecutor); imported anywhere else it does nothing.
"""

from __future__ import annotations

import os
import sys

from optbench.optimizers.noise import filter_known_noise

SERVER_ENV = {"TOKENIZERS_PARALLELISM": "false", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def in_forkserver() -> bool:
    """Whether this process is multiprocessing's forkserver (its command line is `-c 'from multiprocessing.forkserver
    import main; ...'`)."""
    return bool(sys.orig_argv) and sys.orig_argv[-1].startswith("from multiprocessing.forkserver import main")


if in_forkserver():
    os.environ.update(SERVER_ENV)
    filter_known_noise()  # the server's stderr is the sweep's: its imports' known notices stay out of it
