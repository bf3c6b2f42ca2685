"""Where and how a trial's process runs on this machine: forkserver, fresh interpreter or torchrun.

An executor turns (spec, what the trial adds to its environment) into a Record, whatever happens to the process: a
timeout, a crash or a kill by the out-of-memory killer becomes a record with that status. `stop()` kills every
child still running (an interrupted sweep must not leave trials training on as orphans).

A child gets its whole environment as an argument (`child_environment`): the environment the executor was made
in, the child settings and the trial's own additions. Nothing here changes os.environ: threads that start trials
side by side read it, and the process it belongs to is the user's. An array executor
(slurm.py) takes a whole round of trials at once and hands their records back as the scheduler settles them.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from optbench.job.devices import cuda_device_count
from optbench.job.spec import TrialSpec
from optbench.records.oom import says_out_of_memory, under_cap
from optbench.records.record import Record
from optbench.sweep.child import PRELOAD, SWEEP_PID_ENV
from optbench.sweep.devices import preload_modules
from optbench.trial.settings import settings_record

STDERR_TAIL_BYTES = 32768  # torchrun's own summary alone is ~1 KB: the rank's error sits above it
ECHO_POLL_S = 0.2
STARTUPS = ("forkserver", "spawn")
SERVER_PRELOAD = ("optbench.sweep.server",)  # first in the forkserver: its own environment (sweep/server.py)


class Executor(Protocol):
    def run(self, spec: TrialSpec, env: dict[str, str]) -> Record: ...

    def stop(self) -> None: ...


@runtime_checkable
class ArrayExecutor(Protocol):
    """Runs a round of trials as one submission (a Slurm job array) and yields each record once the trial settled.
    Its trials may store their own records (`append_record(once=True)` under `run_id`): the sweep stores each once."""

    def run_all(self, specs: list[TrialSpec], run_id: str, out_path: Path) -> Iterator[Record]: ...

    def stop(self) -> None: ...


def trial_log_name(spec: TrialSpec) -> str:
    """A trial's log file name where logs are kept (a cluster sweep's, one per trial beside the results)."""
    return f"{spec.optimizer}-seed{spec.seed}-{spec.trial_id}.log"


class FunctionExecutor:
    """Runs a plain `spec -> Record` function (tests' fakes, or a caller's own trial runner)."""

    def __init__(self, run_trial: Callable[[TrialSpec], Record]):
        self.run_trial = run_trial

    def run(self, spec: TrialSpec, env: dict[str, str]) -> Record:
        return self.run_trial(spec)

    def stop(self) -> None:
        pass


def failed_record(spec: TrialSpec, status: str, error: str, wall_s: float | None = None) -> Record:
    """The record of a trial that wrote none (skipped, stopped, timed out, crashed): its settings (no torch needed,
    trial/settings.py), the status and why, and how long it ran (`wall_s`) where it ran at all."""
    started_at = None if wall_s is None else time.time() - wall_s
    record = settings_record(spec, started_at)
    record.status, record.error, record.wall_s = status, error, wall_s
    return record


def died_record(spec: TrialSpec, returncode: int, tail: bytes, wall_s: float) -> Record:
    """A child that exited without writing its record: `oom` if it was SIGKILLed (the kernel's out-of-memory
    killer's signal) or its log says it ran out of memory, else `error`; the cause from its log either way."""
    last = _last_lines(tail)
    if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return failed_record(spec, "oom", f"trial process was killed (out of memory?): {last}", wall_s)
    if says_out_of_memory(tail.decode(errors="replace")):
        return failed_record(spec, "oom", under_cap(f"trial process ran out of memory (exit code {returncode}): {last}",
                                                    spec.max_memory_bytes), wall_s)
    return failed_record(spec, "error", f"trial process exited with code {returncode}: {last}", wall_s)


# What a dying process says about why: a Python exception, a C++ abort's `what():`, a fatal signal.
# (A torchrun rank whose trial failed inside it says `trial <status>: <error>` before the group's last collective.)
CAUSE = re.compile(r"(trial \w+: .*|\w+(Error|Exception)\b.*|what\(\):.*|Signal \d+ \(\w+\) received.*)$")


def _last_lines(tail: bytes, count: int = 3) -> str:
    """The cause of a crash from the end of a log: in a torchrun group the first cause a rank printed (the root:
    the other ranks then fail on its absence), else the last line naming one, else the last `count` lines."""
    lines = [line.strip() for line in tail.decode(errors="replace").replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line]
    ranks = [found.group(1) for line in lines if (line.startswith("[rank") or "what():" in line)
             and (found := CAUSE.search(re.sub(r"^\[rank\d+\]:\s*", "", line)))]
    causes = ranks[:1] or [found.group(1) for line in lines if (found := CAUSE.search(line))][-1:]
    return causes[0][:500] if causes else " | ".join(lines[-count:]) or "no output"


def _read_tail(log_path: Path) -> bytes:
    with open(log_path, "rb") as handle:
        handle.seek(max(0, log_path.stat().st_size - STDERR_TAIL_BYTES))
        return handle.read()


def cause_in_log(log_path: Path) -> str:
    """Why a process died, read from the end of its log (`_last_lines`); `no log` where it left none."""
    return _last_lines(_read_tail(log_path)) if log_path.is_file() else "no log"


def _echo(log_path: Path, done: threading.Event) -> None:
    """Follow the child's log onto our stderr (its progress bar included) until `done`; TTY sweeps only."""
    out = sys.stderr.buffer
    with open(log_path, "rb") as handle:
        while True:
            finished = done.is_set()
            if chunk := handle.read():
                out.write(chunk)
                out.flush()
            if finished:
                return
            time.sleep(ECHO_POLL_S)


class _Child:
    """One running child: a subprocess.Popen or a multiprocessing.Process, waited on the same way."""

    def __init__(self, handle: subprocess.Popen | multiprocessing.process.BaseProcess):
        self.handle = handle
        self.pid = handle.pid

    def wait(self, timeout_s: float | None) -> int | None:
        if isinstance(self.handle, subprocess.Popen):
            try:
                return self.handle.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None
        self.handle.join(timeout_s)
        return self.handle.exitcode

    def kill(self) -> None:
        """SIGKILL the child's whole process group (it calls setsid first; before that, just itself)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.wait(None)


class LocalExecutor:
    """One fresh process per trial on this machine.

    startup="forkserver" forks each child from a server process that imported torch, transformers and
    datasets once (seconds saved per trial); "spawn" starts a fresh interpreter per trial. Trials with
    `spec.parallel != "none"` always go through `torchrun`, which starts its own ranks.
    `spec.max_memory_bytes` caps what each trial may add to its address space (RLIMIT_AS). Every child learns
    this process's pid (OPTBENCH_SWEEP_PID) and dies with it, whatever kills it (process/child.py).
    `uses_bitsandbytes`: preload bitsandbytes into the forkserver where that is safe (sweep/devices.py).
    `log_dir`: keep each trial's log there (`trial_log_name`), appended to; by default it goes with the trial.
    """

    def __init__(self, startup: str = "forkserver", uses_bitsandbytes: bool = False, echo: bool | None = None,
                 log_dir: Path | None = None):
        if startup not in STARTUPS:
            raise ValueError(f"startup must be one of {', '.join(STARTUPS)}, got '{startup}'")
        self.startup, self.log_dir = startup, log_dir
        self.echo = sys.stderr.isatty() if echo is None else echo
        self.base_env = dict(os.environ)  # read once, here: every child's environment starts from it
        self.preload = preload_modules(PRELOAD, uses_bitsandbytes, cuda_device_count())
        self._context: multiprocessing.context.BaseContext | None = None
        self._lock = threading.Lock()
        self._running: set[_Child] = set()
        self._stopped = False

    def run(self, spec: TrialSpec, env: dict[str, str]) -> Record:
        child_env = child_environment(self.base_env, env, self.echo)
        with tempfile.TemporaryDirectory(prefix="optbench-") as tmp:
            spec_path, record_path, log_path = (Path(tmp) / name for name in ("spec.json", "record.json", "log"))
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log_path = self.log_dir / trial_log_name(spec)
            spec_path.write_text(json.dumps(spec.to_dict()))
            log_path.touch()
            launched_at = time.time()
            child = self._launch(spec, spec_path, record_path, log_path, launched_at, child_env)
            if child is None:
                return failed_record(spec, "error", "sweep stopped before this trial started")
            done = threading.Event()
            echo = threading.Thread(target=_echo, args=(log_path, done), daemon=True) if self.echo else None
            if echo is not None:
                echo.start()
            try:
                returncode = child.wait(spec.timeout_s)
                if returncode is None:
                    child.kill()
            finally:
                with self._lock:
                    self._running.discard(child)
                done.set()
                if echo is not None:
                    echo.join(timeout=5)
            wall_s = time.time() - launched_at
            if returncode is None:
                return failed_record(spec, "timeout", f"trial exceeded its {spec.timeout_s:g} s timeout", wall_s)
            if record_path.is_file():
                return Record.from_dict(json.loads(record_path.read_text()))  # the trial timed itself
            return died_record(spec, returncode, _read_tail(log_path), wall_s)

    def _launch(self, spec: TrialSpec, spec_path: Path, record_path: Path, log_path: Path, launched_at: float,
                env: dict[str, str]) -> _Child | None:
        with self._lock:
            if self._stopped:
                return None
            if spec.parallel != "none":
                child = _Child(self._torchrun(spec, spec_path, record_path, log_path, env))
            elif self.startup == "forkserver":  # the child replaces its inherited environment with `env`
                process = self._forkserver_locked().Process(
                    target=_child_entry, daemon=False,
                    args=(str(spec_path), str(record_path), str(log_path), launched_at, env))
                process.start()
                child = _Child(process)
            else:
                command = [sys.executable, "-m", "optbench.sweep.child", "run", str(spec_path), str(record_path),
                           str(log_path), repr(launched_at)]
                child = _Child(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL, start_new_session=True, env=env))
            self._running.add(child)
            return child

    def _forkserver_locked(self) -> multiprocessing.context.BaseContext:
        """The forkserver, started on first use with the preloads; the first sets the server's own environment,
        which its libraries read when they are imported (sweep/server.py)."""
        if self._context is None:
            from multiprocessing import forkserver

            self._context = multiprocessing.get_context("forkserver")
            self._context.set_forkserver_preload(list(SERVER_PRELOAD + self.preload))
            forkserver.ensure_running()
        return self._context

    @staticmethod
    def _torchrun(spec: TrialSpec, spec_path: Path, record_path: Path, log_path: Path,
                  env: dict[str, str]) -> subprocess.Popen:
        """torchrun in a session of its own (its pid is its group: a timeout kills it whole); rank 0 writes."""
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                launch_command(spec, spec_path, record_path),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env)

    def stop(self) -> None:
        """Kill every running child and launch no more (an interrupted sweep)."""
        with self._lock:
            self._stopped = True
            running = list(self._running)
        for child in running:
            child.kill()


def child_environment(base: dict[str, str], env: dict[str, str], echo: bool) -> dict[str, str]:
    """The whole environment of one trial process: `base` (the environment the sweep started with), the child
    settings (tokenizers without a thread pool, the sweep's pid for the watchdog, the progress bar when echoed to a
    terminal), then what the trial adds (`env`: its GPU mask or thread share)."""
    settings = {"TOKENIZERS_PARALLELISM": "false", SWEEP_PID_ENV: str(os.getpid())}
    if echo:
        settings["OPTBENCH_PROGRESS"] = "1"  # the trial's bar reaches our terminal; a log gets none
    return {**base, **settings, **env}


def launch_command(spec: TrialSpec, spec_path: Path, record_path: Path) -> list[str]:
    """The command that runs `spec` as a torchrun group; rank 0 writes the record to `record_path`.

    `python -m torch.distributed.run` is `torchrun` from this interpreter (the venv's torch, whatever PATH
    says); `--standalone` picks a free rendezvous port on this host.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(spec.nproc),
            "-m", "optbench.sweep.child", "rank", str(spec_path), str(record_path)]


def _child_entry(*args) -> None:
    """Forkserver target (module-level so it pickles by name)."""
    from optbench.sweep.child import run_child

    run_child(*args)
