"""The process layer: every process optbench starts for a trial, and the sweep that runs them.

`runner.run_sweep` runs trials up to `--jobs` at a time and appends each record as it lands; an executor
(`executors.py`: a forkserver or spawned child, a torchrun group, a submitit job) turns one spec into a record
whatever happens to its process; `child.py` is the bootstrap inside that process (process group, watchdog on the
sweep, threads, memory cap, record hand-off, the torchrun rank's entry); `server.py` is the forkserver's own
environment (the sweep's os.environ is never changed; a child is handed its whole environment); `devices.py`
decides GPUs, threads and preloads; `progress.py` is the one progress printer (the study's too). Nothing below this
layer imports it: the trial itself (optbench/trial/run.py) starts no process.

Adding an executor: a class with `run(spec, env) -> Record` and `stop()` in `executors.py`. May import: trial,
memory, workloads, report, job, records, probes, optimizers.
"""

from optbench.sweep.executors import Executor, FunctionExecutor, LocalExecutor, SubmititExecutor, failed_record
from optbench.sweep.runner import ResultsWriteError, SweepInterrupted, new_run_id, run_sweep

__all__ = ["Executor", "FunctionExecutor", "LocalExecutor", "ResultsWriteError", "SubmititExecutor",
           "SweepInterrupted", "failed_record", "new_run_id", "run_sweep"]
