"""Measuring instruments, each written once: optimizer-state bytes and peak memory (`measure.py`), step and
optimizer-step timing (`timing.py`), update fidelity against an fp32 shadow AdamW (`fidelity.py`), device
bandwidth (the triad probe in `triad.py`; the machine's calibration, measured once, in `bandwidth.py`). The
trial, the HF Trainer callback and the benchmark suite all measure through these. A probe that cannot measure as
it should says so (`measure.MeasurementWarning`). `slowdown.py` is a test-only knob, reached by production code
through one seam (`Setup.install_optimizer`).

Adding a probe: a function or class here that takes torch objects and returns numbers; the record field that
holds it in optbench/records/record.py.

May import: nothing else of optbench (torch only).
"""

# `optimizer_impl` of a step that calls torch.cuda.synchronize() after every parameter (bitsandbytes'
# Optimizer8bit.step): the host waits out each kernel before it launches the next, so the step is host-serialised
# and its roofline share is bound by launches and waits. Here, torch-free, so that the report can name it.
HOST_SYNCED = "per-parameter, host-synced"
