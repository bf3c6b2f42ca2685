"""Commands made of many sweeps: `study.py` (tune each optimizer's lr, then seeds at the chosen lr), `nightly.py`
(benchmark suite + sweep + compare with the last clean night) and `scaling.py` (the tiny BERT across widths).

May import: sweep, report, job, records, optimizers.
"""
