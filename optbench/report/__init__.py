"""Records -> answers: `frame.py` (the per-trial frame and per-job summary every renderer reads), `metrics.py`
(the one table of report columns), `stats.py` (intervals, verdict words, lr choice, time to target),
`compare.py` (BASE vs NEW: the regression gate), `noise.py` (its run-to-run interval for times), `environments.py`
(whether two runs are like with like), `campaign.py` (the gate's error rates from a campaign of runs), `render.py`
(markdown, csv, json, html, terminal), `plots.py` and `scaling.py` (figures and the state-vs-params fit).

Adding a report column: one `Metric` in `metrics.py` (and the Record field it reads).

May import: records, optimizers (names and colours). No torch.
"""
