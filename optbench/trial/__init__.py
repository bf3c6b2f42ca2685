"""One trial, in this process: `run.run_trial(spec) -> Record` starts from the record of the trial's settings
(`settings.py`, torch-free: the sweep writes such records for trials that never ran), sets up the workload and
optimizer (`precision.py`, `schedules.py`), trains under an engine (`engines/`: native, trainer, accelerate, the
torchrun rank loop, each with its resume check), fills the record once from what the engine returns
(`describe.py`) and evaluates. `callback.py` is the same measurement inside a user's own HF Trainer
(`OptbenchCallback`), described by the same `describe.py`.

It starts no process (optbench/sweep/ does). Adding an engine: a module in `engines/` with
`train(setup, record) -> EngineResult`, its name in `engines.ENGINES`.

May import: memory (the peak prediction, the state map), workloads, report (stats' time-to-target rule, the
untrained rule of the per-rank table), probes, optimizers, job, records.
"""
