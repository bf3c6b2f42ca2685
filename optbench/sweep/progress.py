"""The one progress printer of every sweep and of the study: one plain line per finished trial (no carriage
returns, so a log file reads it as a terminal does), `[i/N] optimizer [stage lr=...] seed=S status in 12s
[(val 0.81, eval 0.80)]; ETA 3m05s`, the ETA from the trials that ran (not those found already recorded, nor
those that cannot run here). A warning a trial's probes raised (`Record.measurement_warnings`) is printed once
per sweep, however many trials raise it."""

from __future__ import annotations

import time
from collections.abc import Callable

from optbench.records.record import Record
from optbench.report.bounds import score_text
from optbench.report.stats import validation_chance

ALREADY_OK = "already recorded ok in this results file"  # the note a resumed sweep shows for a trial it skips


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _scores(record: Record) -> str:
    """The validation and eval values of the workload's target metric, where the trial has them."""
    values = (("val", record.val_metric, validation_chance([record])),
              ("eval", (record.eval_metrics or {}).get(record.target_metric), record.metric_chance))
    scores = ", ".join(f"{split} {score_text(value, chance, record.target_mode)}"
                       for split, value, chance in values if isinstance(value, float))
    return f" ({scores})" if scores else ""


class Progress:
    """Call it with each record as it lands; `show` prints one line (the sweep: to stderr, the study: stdout)."""

    def __init__(self, total: int, show: Callable[[str], None]) -> None:
        self.total, self.show = total, show
        self.done = self.ran = 0
        self.started = time.perf_counter()
        self.warned: set[str] = set()

    def __call__(self, record: Record) -> None:
        self.done += 1
        resumed = record.status == "skipped" and record.error == ALREADY_OK
        self.ran += record.status != "skipped"
        left = self.total - self.done
        elapsed = time.perf_counter() - self.started
        eta = "done" if left <= 0 else f"ETA {_duration(elapsed / self.ran * left)}" if self.ran else "ETA -"
        stage = f" {record.stage} lr={record.lr:g}" if record.stage else ""
        head = f"[{self.done}/{self.total}] {record.optimizer}{stage} seed={record.seed}"
        if resumed:
            self.show(f"{head} already ok; {eta}")
        else:
            self.show(f"{head} {record.status} in {_duration(record.wall_s or 0.0)}{_scores(record)}; {eta}")
        for text in record.measurement_warnings:
            if text not in self.warned:
                self.warned.add(text)
                self.show(f"warning: {text}")
