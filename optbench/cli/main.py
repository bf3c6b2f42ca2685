"""The command line: `python -m optbench run | study | list | report | compare | nightly | estimate | recommend |
explain | fit | calibrate-bandwidth`. Each command is one module of this folder that takes the parsed flags, calls
the package that knows, prints, and returns an exit status from the one table (optbench/records/exits.py). This
module parses, dispatches, and turns the errors every command shares into that table's codes: bad input -> 2 (one
line on stderr, never a traceback), a results file that stops taking records -> 4, SIGINT / SIGTERM -> 130 / 143
after the trials finished so far were recorded. torch and friends are imported only by the commands that need them,
so `list` and `report` start fast.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from optbench.cli import bandwidth, listing, nightly, report, run, sizing, study
from optbench.cli.options import UsageError, build_parser
from optbench.job.planner import PlanError
from optbench.optimizers.noise import filter_known_noise
from optbench.records import exits
from optbench.sweep.runner import ResultsWriteError

COMMANDS = {"run": run.run_command, "study": study.study_command, "report": report.report_command,
            "compare": report.compare_command, "nightly": nightly.nightly_command,
            "calibrate-bandwidth": bandwidth.calibrate_bandwidth_command, **listing.COMMANDS, **sizing.COMMANDS}


# The libraries every measuring command needs (pyproject's dependencies): missing, they are a set-up error, said in
# one line; a missing optional library is the registry's business (its entries are unavailable, with the reason).
REQUIRED = {"torch": "torch==2.13.0 (the CPU build; on a GPU machine your CUDA build)", "transformers": "transformers",
            "datasets": "datasets", "accelerate": "accelerate", "pandas": "pandas", "scipy": "scipy",
            "matplotlib": "matplotlib", "tabulate": "tabulate", "tqdm": "tqdm", "numpy": "numpy"}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or CI's cancel, `timeout`), taken down the same path as Ctrl-C: the running
    trial's process group is killed, what was recorded stays, and the exit status says which signal."""


def _terminate(signum: int, frame: object) -> NoReturn:
    raise Terminated()


def _install_signal_handlers() -> dict[int, object]:
    """Our own SIGINT and SIGTERM handlers. A process started in the background by a script inherits SIGINT
    *ignored*, and Python then installs no KeyboardInterrupt handler: `kill -INT` must stop a sweep however it
    was started, so SIGINT gets Python's default handler explicitly."""
    try:
        return {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    except ValueError:  # not the main thread: leave signals to whoever owns it
        return {}


def main(argv: list[str] | None = None) -> int:
    filter_known_noise()  # the user's first lines are the answer, not a library's import-time notices
    previous = _install_signal_handlers()
    shown_before = warnings.showwarning
    warnings.showwarning = _say_warning(shown_before)
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UsageError, PlanError) as exc:
        print(f"optbench: error: {exc}", file=sys.stderr)
        return exits.USAGE
    except KeyboardInterrupt as exc:
        recorded = getattr(exc, "recorded", 0)
        terminated = isinstance(exc, Terminated) or isinstance(exc.__context__, Terminated)
        print(f"optbench: {'terminated' if terminated else 'interrupted'}: {recorded} trials recorded, rerun the "
              "same command to resume", file=sys.stderr)
        return exits.TERMINATED if terminated else exits.INTERRUPTED
    except ModuleNotFoundError as exc:
        package = (exc.name or "").partition(".")[0]
        if package not in REQUIRED:
            raise
        print(f"optbench: error: {package} is not installed in this Python ({sys.executable}): "
              f"pip install {REQUIRED[package]}, or `pip install -e .` from a checkout", file=sys.stderr)
        return exits.USAGE
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a pipe of ours (to a child, a scheduler): a real failure, not a reader gone
        return exits.PIPE_CLOSED
    except ResultsWriteError as exc:  # the results file stopped taking records (disk full, ...)
        print(f"optbench: error: {exc.strerror or exc}; free space or pick another --out, then rerun to resume",
              file=sys.stderr)
        return exits.WRITE_FAILED
    finally:
        warnings.showwarning = shown_before
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _say_warning(shown_before: Callable[..., None]) -> Callable[..., None]:
    """A warning optbench raises reads `optbench: warning: ...` on stderr, once however many times the tables are
    drawn in one command (not a UserWarning with a source line); a library's goes on as it would."""
    package, said = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), set()

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if not os.path.abspath(filename).startswith(package + os.sep):
            return shown_before(message, category, filename, lineno, file, line)
        if str(message) not in said:
            said.add(str(message))
            print(f"optbench: warning: {message}", file=sys.stderr)
        return None

    return show


def _stdout_closed() -> bool:
    """Whether stdout's reader went away (`optbench list | head`): the write end of a pipe with no reader polls as an
    error. If so, stdout is pointed at /dev/null, so the flush at exit does not fail again and print a traceback after
    the answer the reader already took."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a stream with no descriptor (a test's capture)
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    return True
