"""The process layer: every process optbench starts for a trial, and the sweep that runs them.

`runner.run_sweep` runs trials up to `--jobs` at a time and appends each record as it lands; an executor
(`executors.py`: a forkserver or spawned child, a torchrun group) turns one spec into a record whatever happens to
its process; an array executor (`slurm.py`: a round of trials as one Slurm job array; `slurm_node.py` runs on the
node, `slurm_queue.py` asks the scheduler) takes a whole round and yields each trial's record once it settled;
`child.py` is the bootstrap inside a trial's process (process group, watchdog on the sweep, threads, memory cap,
record hand-off, the torchrun rank's entry); `server.py` is the forkserver's own environment (the sweep's
os.environ is never changed; a child is handed its whole environment); `devices.py` decides GPUs, threads and
preloads; `progress.py` is the one progress printer (the study's too). Nothing below this
layer imports it: the trial itself (optbench/trial/run.py) starts no process.

Adding an executor: a class with `run(spec, env) -> Record` and `stop()` in `executors.py`; for a scheduler that
takes many trials at once, `run_all(specs, run_id, out_path)` and `stop()` (executors.ArrayExecutor). May import:
trial, memory, workloads, report, job, records, probes, optimizers.
"""

from optbench.sweep.executors import ArrayExecutor, Executor, FunctionExecutor, LocalExecutor, failed_record
from optbench.sweep.runner import ResultsWriteError, SweepInterrupted, new_run_id, run_sweep

__all__ = ["ArrayExecutor", "Executor", "FunctionExecutor", "LocalExecutor", "ResultsWriteError",
           "SweepInterrupted", "failed_record", "new_run_id", "run_sweep"]
