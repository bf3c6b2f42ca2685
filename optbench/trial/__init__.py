"""One trial, in this process: `run.run_trial(spec) -> Record` sets up the workload and optimizer (`precision.py`,
`schedules.py`), trains under an engine (`engines/`: native, trainer, accelerate, the torchrun rank loop, and the
resume checks), measures with the probes and evaluates. `callback.py` is the same measurement inside a user's own
HF Trainer (`OptbenchCallback`).

It starts no process (optbench/sweep/ does). Adding an engine: a module in `engines/` with
`train(setup, record) -> EngineResult`, its name in `engines.ENGINES`.

May import: memory (the peak prediction, the state map), workloads, report (the untrained rule of the per-rank
table), probes, optimizers, job, records.
"""
