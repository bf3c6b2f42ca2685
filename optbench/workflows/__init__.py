"""Commands made of many sweeps: `study.py` (tune each optimizer's lr, then seeds at the chosen lr), `nightly.py`
(benchmark suite + sweep + compare with the last clean night), `scaling.py` (the tiny BERT across widths) and
`tuned_lrs.py` (the shipped table of tuned lrs, generated from committed study files).

May import: sweep, report, job, records, optimizers, workloads.
"""
