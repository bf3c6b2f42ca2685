"""What a trial is, before anything runs: `spec.py` (TrialSpec, whose hash is the resume key; the presets and
study budgets, read from the committed `presets.toml`), `planner.py` (job flags + a preset -> the trials to run,
the one availability policy), `tuned.py` (the shipped table of tuned lrs, `tuned-lrs.json`, generated from
committed studies), `devices.py` (what a device name means here: the one device resolver; it asks torch only for
`auto` or a CUDA device). Pure data, no torch at import: planning is instant and testable.

Adding a preset: one table in `presets.toml`. Adding a job flag: the flag in cli/options.py, its name in
`planner.JOB_FLAGS`, its field on TrialSpec.

May import: optimizers (names, availability, default lrs), records (the record's vocabulary).
"""
