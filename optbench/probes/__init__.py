"""Measuring instruments, each written once: optimizer-state bytes and peak memory (`measure.py`), step and
optimizer-step timing (`timing.py`), update fidelity against an fp32 shadow AdamW (`fidelity.py`), device
bandwidth (the triad probe in `measure.py`; the machine's calibration, measured once, in `bandwidth.py`). The
trial, the HF Trainer callback and the benchmark suite all measure through these.

Adding a probe: a function or class here that takes torch objects and returns numbers; the record field that
holds it in optbench/records/record.py.

May import: nothing else of optbench (torch only).
"""
