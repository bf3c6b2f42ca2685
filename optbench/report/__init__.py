"""Records -> answers: `frame.py` (the per-trial frame and per-job summary every renderer reads), `metrics.py`
(the one table of report columns), `stats.py` (intervals, verdict words and the minimum detectable difference, lr
choice, time to target), `bounds.py` (what the metric's ceiling and chance say: saturated, untrained),
`pareto.py` (the Pareto front and the performance profile), `tuning.py` (whether a study's lr range bracketed its
optimum), `compare.py` (BASE vs NEW: the regression gate) and `compare_table.py` (its table and
export), `noise.py` (its run-to-run interval for times, adjusted for each process's speed),
`environments.py` (whether two runs are like with like),
`campaign.py` (the gate's error rates from a campaign of runs), `cells.py` (a summary row's cells as text),
`render.py` (markdown, csv, json, terminal) and `html_page.py`, `plots.py` and `scaling.py` (figures and the
state-vs-params fit) on `canvas.py` (what every figure shares: panels per job, each optimizer's colour).

Adding a report column: one `Metric` in `metrics.py` (and the Record field it reads).

May import: records, optimizers (names and colours), probes (their torch-free constants). No torch.
"""
