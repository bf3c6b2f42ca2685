"""Memory before training: `predict.py` (the peak from a meta-device model and a calibration), `calibration.py`
and `calibrations/` (the user's calibration file, else the shipped one, read-only), `calibrate.py` (fitting a
calibration from records, written to a user file, never into the package), `validation.py` (the predictor
against measured peaks: the held-out error band), `estimate.py` (weights + grads + state for any size),
`recommend.py` (what fits a budget), `fit.py` (the largest batch per optimizer, confirmed by trials), `coverage.py`
(the predictor's margin tested on fresh trials), `statemap.py` (where state bytes go, parameter by parameter),
`sharding.py` (whether ZeRO-1 or FSDP2 changes what each parameter's state keeps, measured or predicted).

May import: workloads (their models on the meta device), report (stats, finals, colours), probes, optimizers, job,
records.
"""
