"""The one table of exit codes: every command, the nightly workflow that runs `optbench run` as a child, and the
README speak of these and no other numbers.

A trial's status decides two of them: `error` and `timeout` (`record.FAILURES`, a harness or library failure)
make a sweep exit 3; `oom`, `diverged` and `skipped` are results, exit 0.
"""

from __future__ import annotations

import signal

OK = 0
REGRESSION = 1  # compare / nightly found a regression; recommend: nothing fits the budget
NOTHING_FITS = REGRESSION
CHECK_FAILED = REGRESSION  # a check found what it guards against: coverage under 95 %, a stale tuned-lr table
USAGE = 2  # bad input or set-up: one line on stderr, never a traceback
TRIAL_FAILED = 3  # a trial ended `error` or `timeout` (`--allow-errors`: 0)
WRITE_FAILED = 4  # the results file stopped taking records (disk full, read-only): what was written stays
INTERRUPTED = 128 + signal.SIGINT  # 130: Ctrl-C, after the trials finished so far were recorded
TERMINATED = 128 + signal.SIGTERM  # 143: SIGTERM (a scheduler's or CI's cancel), likewise
PIPE_CLOSED = 128 + signal.SIGPIPE  # 141: stdout's reader went away (`| head`), as a shell reports SIGPIPE

# What each code means, as the README says it (scripts/readme_tables.py renders it there from this table)
TABLE = {OK: "ok (`oom`, `diverged` and `skipped` trials are results)",
         REGRESSION: "a regression (`compare`, `nightly`), nothing fits (`recommend`), or a check failed (the "
                     "predictor's coverage under 95 %, a tuned-lr table out of date)",
         USAGE: "bad input or set-up: one line on stderr, no traceback, before any trial runs",
         TRIAL_FAILED: "a trial ended `error` or `timeout` (a harness or library failure; one line names them; "
                       "`--allow-errors` gives 0)",
         WRITE_FAILED: "the results file stopped taking records (disk full, read-only): what was written stays; "
                       "rerun to resume",
         INTERRUPTED: "SIGINT, after the trials finished so far were recorded",
         PIPE_CLOSED: "stdout's reader went away (`optbench list | head`); what was recorded stays",
         TERMINATED: "SIGTERM (a scheduler's or CI's cancel), after the trials finished so far were recorded"}
