"""What the tests share: the tiny job (a random 2-layer BERT, a few steps: seconds per trial on a CPU) and a way
to start a command in its own process group that is killed, with everything it started, whatever the test does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

# --device cpu: the tests are about the CPU path; `auto` would switch them to CUDA on a GPU machine.
TINY = dict(workload="tiny", device="cpu", steps=3, warmup_steps=1, batch_size=4, seq_len=16, eval_size=16)
TINY_ARGS = ["--workload", "tiny", "--device", "cpu", "--steps", "3", "--warmup-steps", "1", "--batch-size", "4",
             "--seq-len", "16", "--eval-size", "16"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}


@contextlib.contextmanager
def started(argv: list[str], ignore_sigint: bool = False, **kwargs) -> Iterator[subprocess.Popen]:
    """`python -m optbench ARGV` in a session of its own; its whole group is SIGKILLed on the way out, pass or
    fail. `ignore_sigint`: start it the way a script's background job starts (SIGINT ignored)."""
    preexec = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
    process = subprocess.Popen([sys.executable, "-m", "optbench", *argv], start_new_session=True,
                               env={**os.environ, **OFFLINE}, preexec_fn=preexec, **kwargs)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def optbench(*args: object, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the command line to the end; its output captured."""
    return subprocess.run([sys.executable, "-m", "optbench", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **OFFLINE}, timeout=timeout)


def entry_step(spec, optimizer, loss, lr: float) -> None:
    """One update from `loss` the way the registry entry trains: LOMO's fused backward (Trainer's training step calls
    it), a backward whose hooks step each parameter (layer-wise entries: step() has nothing left to do), or
    backward then optimizer.step()."""
    if spec.trainer_optim:
        optimizer.fused_backward(loss, lr)
        return
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def tiny_bert_models(dtypes) -> dict:
    """One random tiny BERT (seed 0) per dtype: the models the state-byte tests build every optimizer on."""
    import copy

    import torch
    import transformers

    from optbench.workloads import tiny_bert_config

    torch.manual_seed(0)
    base = transformers.BertForSequenceClassification(tiny_bert_config())
    return {dtype: copy.deepcopy(base).to(dtype) for dtype in dtypes}


def skip_unavailable(spec) -> None:
    """Skip a test of an entry this machine cannot run (a missing library, CUDA only), saying why."""
    import pytest

    reason = spec.unavailable_reason()
    if reason is not None:
        pytest.skip(f"{spec.name} is unavailable here: {reason}")
