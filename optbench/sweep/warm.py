"""Imported by the forkserver before it forks any trial: builds what every trial of the default workloads would
otherwise build again (the embedded review task: 5,000 generated examples), so each forked child inherits it."""

from optbench.workloads import data

data.embedded_splits()
