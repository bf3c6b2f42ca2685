"""What an executor makes of a trial process that died: the cause read from its log (a torchrun group's root cause
among its ranks' echoes), `oom` or `error` by one rule (records/oom.py), and the environment a child is handed."""

import os
import signal

import pytest
import torch
from _tiny import TINY

from optbench.job.spec import TrialSpec
from optbench.records.oom import out_of_memory_cause, says_out_of_memory
from optbench.sweep.executors import _last_lines, child_environment, died_record

# The tail of a torchrun log where rank 1 failed first: rank 0 then fails on its absence, and torchrun's own
# summary follows. The root is rank 1's error.
TORCHRUN_TAIL = b"""\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/venv/lib/python3.11/site-packages/optbench/sweep/child.py", line 219, in rank_main
[rank1]: RuntimeError: CUDA error: an illegal memory access was encountered
[rank0]: Traceback (most recent call last):
[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited
W1201 10:00:00.000000 123 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 124 closing signal
E1201 10:00:01.000000 123 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 1
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 905, in main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
optbench.sweep.child FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 125)
============================================================
"""
# One rank's trial failed inside it (torchao's compiled step on an uneven FSDP2 shard); it says so before the
# group's last collective, where the other rank, still inside FSDP's all-gather, dies on its absence.
RANK_FAILED_TAIL = b"""[rank1]: trial error: AssertionError: expected size 1==2, stride 1==1 at dim=0
[rank0]: trial error: RuntimeError: [pair.cc:537] Read error [127.0.0.1]:946: Connection reset by peer.
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 149380 vs 4.
"""
BAD_ALLOC_TAIL = b"terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
PYTHON_TAIL = b'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: no such lr\n'


@pytest.mark.parametrize("tail,cause", [
    (TORCHRUN_TAIL, "RuntimeError: CUDA error: an illegal memory access was encountered"),
    (RANK_FAILED_TAIL, "trial error: AssertionError: expected size 1==2, stride 1==1 at dim=0"),
    (BAD_ALLOC_TAIL, "what():  std::bad_alloc"),
    (PYTHON_TAIL, "ValueError: no such lr"),
    (b"Signal 9 (SIGKILL) received by PID 125\n", "Signal 9 (SIGKILL) received by PID 125"),
    (b"step 1\r\rstep 2\nstep 3\nstep 4\n", "step 2 | step 3 | step 4"),  # no cause named: the last lines
    (b"", "no output"),
])
def test_the_cause_of_a_crash_is_read_from_the_end_of_its_log(tail, cause):
    assert _last_lines(tail) == cause


def test_a_torchrun_group_is_recorded_with_its_root_cause_not_the_other_ranks_echo():
    record = died_record(TrialSpec(optimizer="adamw", parallel="ddp", nproc=2, **TINY), 1, TORCHRUN_TAIL, 3.0)
    assert record.status == "error" and record.wall_s == 3.0
    assert record.error == ("trial process exited with code 1: RuntimeError: CUDA error: an illegal memory access "
                            "was encountered")


@pytest.mark.parametrize("returncode,tail,status", [
    (-signal.SIGKILL, b"", "oom"),  # the kernel's out-of-memory killer
    (128 + signal.SIGKILL, b"", "oom"),  # the same kill, as a shell reports it
    (-signal.SIGABRT, BAD_ALLOC_TAIL, "oom"),  # an allocation refused under the memory cap
    # Rust's (tokenizers') refused allocation under the cap, as a trial's log ended with it
    (-signal.SIGABRT, b"memory allocation of 5 bytes failed\nmemory allocation of 1 bytes failed\n", "oom"),
    (1, b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", "oom"),
    (1, PYTHON_TAIL, "error"),
    (-signal.SIGSEGV, b"", "error"),
])
def test_a_child_that_died_without_its_record_is_oom_only_when_the_signs_say_so(returncode, tail, status):
    record = died_record(TrialSpec(optimizer="adamw", **TINY), returncode, tail, 1.0)
    assert record.status == status, record.error
    assert record.optimizer == "adamw" and record.trial_id == TrialSpec(optimizer="adamw", **TINY).trial_id


@pytest.mark.parametrize("exc,oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (torch.OutOfMemoryError(""), True),  # by its type alone
    (MemoryError(), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes"), True),
    (RuntimeError("std::bad_alloc"), True),
    (ValueError("lr must be positive"), False),
    (RuntimeError("expected scalar type Float but found Half"), False),
])
def test_one_rule_says_out_of_memory_for_exceptions_and_logs_alike(exc, oom):
    assert (out_of_memory_cause(exc) is not None) is oom
    assert says_out_of_memory(f"{type(exc).__name__}: {exc}") is oom


def test_an_exception_raised_from_an_out_of_memory_failure_is_out_of_memory():
    """transformers 5.17 words a refused allocation in a batch's tensors as a padding problem, raised from it."""
    def reworded(cause):
        try:
            raise cause
        except Exception as exc:
            try:
                raise ValueError("Unable to create tensor, you should probably activate truncation and/or "
                                 "padding") from exc
            except ValueError as outer:
                return outer

    refused = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes")
    assert out_of_memory_cause(reworded(refused)) is refused
    assert isinstance(out_of_memory_cause(reworded(MemoryError())), MemoryError)
    assert out_of_memory_cause(reworded(TypeError("excessive nesting"))) is None


def test_a_child_is_handed_the_sweeps_environment_its_settings_and_then_its_slots_additions():
    base = {"PATH": "/bin", "TOKENIZERS_PARALLELISM": "true", "CUDA_VISIBLE_DEVICES": "3,4"}
    env = child_environment(base, {"CUDA_VISIBLE_DEVICES": "4"}, echo=True)
    assert env == {"PATH": "/bin", "TOKENIZERS_PARALLELISM": "false", "CUDA_VISIBLE_DEVICES": "4",
                   "OPTBENCH_SWEEP_PID": str(os.getpid()), "OPTBENCH_PROGRESS": "1"}
    assert "OPTBENCH_PROGRESS" not in child_environment(base, {}, echo=False)
    assert base["CUDA_VISIBLE_DEVICES"] == "3,4"  # the base is read, never changed


def test_the_forkserver_sets_its_own_environment_and_leaves_the_sweeps_alone():
    """The forkserver's first preload (sweep/server.py) sets what its libraries read at import: the CUDA check
    through NVML and tokenizers without a pool. Checked in a fresh interpreter (the forkserver is one per
    process): a forkserver worker sees both, the starting process neither."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import multiprocessing as mp, os\n"
            "ctx = mp.get_context('forkserver')\n"
            "ctx.set_forkserver_preload(['optbench.sweep.server'])\n"
            "with ctx.Pool(1) as pool:\n"
            "    print(*pool.map(os.getenv, ['PYTORCH_NVML_BASED_CUDA_CHECK', 'TOKENIZERS_PARALLELISM']))\n"
            "print(os.getenv('PYTORCH_NVML_BASED_CUDA_CHECK'), os.getenv('TOKENIZERS_PARALLELISM'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_NVML_BASED_CUDA_CHECK", "TOKENIZERS_PARALLELISM")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["1 false", "None None"]
