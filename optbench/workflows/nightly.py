"""One night of benchmarking as one command: stamp, benchmark suite, sweep, reports, compare, baseline, summary.

The nightly workflow only checks out, installs, restores the baseline folder, calls `optbench nightly`
and uploads OUT; everything that decides red or green is here, so a night can be re-run by hand on any
box and behaves the same. Stages, each logged to OUT/logs/<stage>.log:

1. environment stamp (OUT/environment.json): machine, library versions, git commit;
2. benchmark suite (`pytest benchmarks --benchmark-only --benchmark-save-data`, a subprocess): the raw
   rounds go into OUT/benchmarks.json, so `compare` can test against their spread;
3. sweep (`optbench run`, a subprocess: each trial in its own child) into OUT/sweep.jsonl;
4. reports of both into OUT/report and OUT/benchmark-report;
5. compare both with BASELINE (`compare.compare`, the noise-aware verdict); no baseline yet: this night
   becomes it;
6. only a clean night replaces BASELINE, so a slow creep cannot hide one small step per night (or one
   run with `--accept`, after an intended change: it reports, then becomes the baseline);
7. OUT/summary.md, also appended to $GITHUB_STEP_SUMMARY when that is set.

Exit status: 0 clean (or first night, or accepted), 1 regression (or a failing benchmark test), 2 usage or set-up
error (a stage that could not run, a baseline of another job), 3 a sweep trial ended `error` or `timeout` (the
night is red and the baseline kept, even with --accept).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from optbench.job.devices import device_kind, resolve_device
from optbench.records import exits, nvidia
from optbench.records.benchjson import read_benchmark_records
from optbench.records.record import FAILURES, read_records
from optbench.report import compare, compare_table

SWEEP_FILE = "sweep.jsonl"
BENCHMARK_FILE = "benchmarks.json"
ENVIRONMENT_FILE = "environment.json"
BASELINE_FILES = (SWEEP_FILE, BENCHMARK_FILE, ENVIRONMENT_FILE)
BENCHMARK_DIR = Path("benchmarks")
# The suite's per-optimizer benchmarks (module::function); a `--optimizers` subset selects these by node id.
OPTIMIZER_BENCHMARKS = ("test_optimizer_step.py::test_optimizer_step", "test_train_step.py::test_train_step",
                        "test_finetune.py::test_finetune")



class NightlyError(RuntimeError):
    """A stage that could not run or a baseline that cannot be compared: exit 2, the message says which."""


@dataclass(frozen=True)
class NightConfig:
    device: str  # cpu | cuda | cuda:N
    preset: str  # smoke | nightly (both the sweep preset and the benchmark-suite size)
    baseline: Path
    out: Path
    thresholds: compare.Thresholds
    optimizers: tuple[str, ...] = ()  # empty: the sweep's default set and the whole suite
    job_argv: tuple[str, ...] = ()  # the job flags given to `nightly` (--workload tiny, --schedule ...), for the sweep
    strict_env: bool = False
    accept: bool = False  # an intended change: report it, yet make this night the baseline (exit 0)


@dataclass
class Night:
    """What the night found; `render_summary` turns it into markdown."""

    config: NightConfig
    stage_s: dict[str, float] = field(default_factory=dict)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, compare markdown)
    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    first_night: bool = False
    trial_failures: int = 0  # sweep trials that ended `error` or `timeout` (the sweep exited 3)

    @property
    def clean(self) -> bool:
        return not self.regressions and not self.trial_failures


def _stage(night: Night, name: str, command: list[str], env: dict[str, str] | None = None) -> int:
    """Run one stage as a subprocess, its output in OUT/logs/<name>.log; returns its exit status."""
    log = night.config.out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"optbench nightly: {name}: {' '.join(command)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        status = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                check=False).returncode
    night.stage_s[name] = time.perf_counter() - start
    return status


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:])


def benchmark_command(config: NightConfig, json_path: Path) -> list[str]:
    """pytest on the suite at the preset's size, raw rounds saved; the harness check (opt-in) only at nightly size
    (on shared CPU cores its tolerance is itself noise)."""
    if config.optimizers:
        targets = [f"{BENCHMARK_DIR / test}[{name}]" for name in config.optimizers for test in OPTIMIZER_BENCHMARKS]
        targets.append(f"--optbench-optimizers={','.join(config.optimizers)}")  # parametrised: ids beyond the default
    else:  # every registry entry: on a GPU the whole registry takes minutes (the CPU default is one per family)
        targets = [str(BENCHMARK_DIR), "--optbench-optimizers=all"] + (["--optbench-harness"]
                                                                       if config.preset == "nightly" else [])
    return [sys.executable, "-m", "pytest", *targets, "--benchmark-only", f"--optbench-preset={config.preset}",
            f"--optbench-device={config.device}",
            f"--benchmark-json={json_path}", "--benchmark-save-data", "-p", "no:cacheprovider", "-q"]


def sweep_command(config: NightConfig, out: Path) -> list[str]:
    """`optbench run` with the night's preset, device, optimizers and every job flag the night was given."""
    command = [sys.executable, "-m", "optbench", "run", "--preset", config.preset, "--device", config.device,
               "--out", str(out), *config.job_argv]
    if config.optimizers:
        command += ["--optimizers", ",".join(config.optimizers)]
    return command


def night_environment(device: str, run: nvidia.Runner | None = None) -> dict:
    """The night's stamp, and its pre-flight on CUDA: the GPU's driver, clocks, temperature, ECC state and other
    processes come from nvidia-smi, so this process never holds a CUDA context while its children time; a GPU
    another process uses is a set-up error (its timings would be the other process's too)."""
    import torch

    from optbench.records.environment import environment

    try:  # the night runs here: a device this machine cannot run (cuda without a GPU, cuda:abc, mps) is refused
        index = resolve_device(device).index or 0
    except ValueError as exc:
        raise NightlyError(str(exc)) from None
    env = environment(torch.device("cpu"))  # libraries, CPU, commit: no CUDA asked
    if device_kind(device) != "cuda":  # `auto` on a GPU machine is pre-flighted too
        return env
    stamps, busy = nvidia.preflight(os.environ.get("CUDA_VISIBLE_DEVICES"), run)
    if busy:
        raise NightlyError("pre-flight: " + "; ".join(busy) + ": a night timed beside it is noise; wait for it, or "
                           "point CUDA_VISIBLE_DEVICES at an idle GPU")
    if index < len(stamps):
        env.update(stamps[index])
        env["gpus_visible"] = len(stamps)
    else:
        env["gpu_preflight"] = "nvidia-smi found no such GPU: clocks, temperature, driver and processes unchecked"
    return env


def check_folders(config: NightConfig) -> None:
    """The suite's benchmarks/ folder (a night runs from the repository root), --out and --baseline, before
    anything is made: a night into a folder that holds one would resume an old night's trials as tonight's, and a
    night into its own baseline (or either inside the other) would compare the night with itself and then rotate it
    over itself."""
    if not BENCHMARK_DIR.is_dir():
        raise NightlyError(f"no {BENCHMARK_DIR}/ here: run `optbench nightly` from the repository root")
    out, baseline = config.out.resolve(), config.baseline.resolve()
    if out == baseline or out.is_relative_to(baseline) or baseline.is_relative_to(out):
        raise NightlyError(f"--out {config.out} and --baseline {config.baseline} must be separate folders, neither "
                           "inside the other")
    if any((config.out / name).exists() for name in (SWEEP_FILE, BENCHMARK_FILE)):
        raise NightlyError(f"--out {config.out} already holds a night; give each night a new folder")
    for flag, folder in (("--out", config.out), ("--baseline", config.baseline)):
        if folder.exists() and not folder.is_dir():
            raise NightlyError(f"{flag} {folder} is not a folder")


def check_baseline(baseline: Path, env: dict) -> None:
    """The baseline is read whole before the night runs: a file in it that is not what it should be is said in one
    line now, not as a traceback after the night's hour. A baseline times one GPU (or CPU) model with one driver and
    one torch: another's timings differ for reasons no code change made, so comparing across them is refused (each
    key gets its own baseline folder)."""
    for name, read in ((SWEEP_FILE, read_records), (BENCHMARK_FILE, read_benchmark_records)):
        if (baseline / name).is_file():
            _read_baseline(baseline / name, read)
    stamp = baseline / ENVIRONMENT_FILE
    if not stamp.is_file():
        return
    theirs, ours = nvidia.baseline_key(_read_baseline(stamp, _read_stamp)), nvidia.baseline_key(env)
    if theirs != ours:
        raise NightlyError(f"the baseline in {baseline} was timed on {theirs}, this night runs on {ours}: timings "
                           "across GPUs, drivers or torch releases are not comparable; give this key its own "
                           "--baseline folder (`optbench nightly --print-baseline-key` prints it)")


def _read_stamp(path: Path) -> dict:
    stamp = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(stamp, dict):
        raise ValueError("not an environment stamp: a JSON object is expected")
    return stamp


def _read_baseline(path: Path, read):
    try:
        return read(path)
    except ValueError as exc:  # ResultsFileError, BenchmarkJsonError, JSONDecodeError
        raise NightlyError(f"--baseline: {path} cannot be read ({exc}); point --baseline at a night's folder, or "
                           "an empty one for a first night") from None


def _run_stages(night: Night) -> None:
    config, out = night.config, night.config.out
    # --device cpu on a GPU box: hide the GPUs from the suite, whose fixture picks a device by itself.
    bench_env = {"CUDA_VISIBLE_DEVICES": ""} if config.device == "cpu" else None
    status = _stage(night, "benchmarks", benchmark_command(config, out / BENCHMARK_FILE), bench_env)
    if status == 1 and (out / BENCHMARK_FILE).is_file():  # ran, but a benchmark's own check failed
        night.regressions.append(f"benchmark suite: a benchmark test failed (see logs/benchmarks.log: "
                                 f"{_tail(out / 'logs' / 'benchmarks.log', 2)})")
    elif status != 0:
        raise NightlyError(f"the benchmark suite did not run (pytest exit {status}): "
                           f"{_tail(out / 'logs' / 'benchmarks.log')}")
    status = _stage(night, "sweep", sweep_command(config, out / SWEEP_FILE))
    if status not in (exits.OK, exits.TRIAL_FAILED) or not (out / SWEEP_FILE).is_file():
        raise NightlyError(f"the sweep did not run (exit {status}): {_tail(out / 'logs' / 'sweep.log')}")
    if status == exits.TRIAL_FAILED:  # it ran, but a trial hit a harness or library failure: red, named below
        failed = [r for r in read_records(out / SWEEP_FILE) if r.status in FAILURES]
        night.trial_failures = len(failed)
        night.notes += [f"trial {r.optimizer} seed {r.seed} ended {r.status}: {r.error}" for r in failed]


def _write_reports(night: Night) -> None:
    from optbench.report.render import write_report

    out = night.config.out
    start = time.perf_counter()
    write_report(read_records(out / SWEEP_FILE), out / "report")
    write_report(read_benchmark_records(out / BENCHMARK_FILE), out / "benchmark-report")
    night.stage_s["reports"] = time.perf_counter() - start


def _compare_with_baseline(night: Night) -> None:
    config = night.config
    for title, name, read in (("Sweep", SWEEP_FILE, read_records), ("Benchmark suite", BENCHMARK_FILE,
                                                                     read_benchmark_records)):
        try:
            comparison = compare.compare(read(config.baseline / name), read(config.out / name), config.thresholds)
        except compare.CompareError as exc:
            raise NightlyError(f"{title.lower()}: the baseline in {config.baseline} is another job ({exc}); "
                               "point --baseline at a folder for this preset and device") from None
        if config.strict_env and comparison.env_differences:
            raise NightlyError(f"--strict-env: the baseline ran elsewhere: {'; '.join(comparison.env_differences)}")
        night.sections.append((title, compare_table.render_markdown(comparison)))
        night.regressions += [f"{title.lower()}: {line}" for line in comparison.regressions]


def _rotate_baseline(night: Night) -> None:
    """Replace BASELINE with this night's files, whole: written beside it first, then swapped in."""
    baseline, out = night.config.baseline, night.config.out
    staging = baseline.with_name(baseline.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in BASELINE_FILES:
        shutil.copy2(out / name, staging / name)
    shutil.rmtree(baseline, ignore_errors=True)
    staging.rename(baseline)


def render_summary(night: Night, env: dict) -> str:
    config = night.config
    verdict = (f"TRIAL FAILURES ({night.trial_failures})" if night.trial_failures
               else f"REGRESSION ({len(night.regressions)})" if night.regressions
               else "first night: no baseline yet, this night became it" if night.first_night else "clean")
    limits = config.thresholds
    lines = [f"## optbench nightly: {verdict}", "",
             f"- commit {env.get('git_commit') or 'unknown'}, device {config.device} "
             f"({env.get('gpu') or env.get('cpu')}), preset {config.preset}"
             + (f", job flags `{' '.join(config.job_argv)}`" if config.job_argv else "")
             + (f", optimizers {', '.join(config.optimizers)}" if config.optimizers else ""),
             *_gpu_lines(env),
             f"- thresholds: slowdown {limits.max_slowdown_pct:g} %, memory growth {limits.max_memory_growth_pct:g} %, "
             f"accuracy drop {limits.max_accuracy_drop_pts:g} pts (each beyond its 95 % CI where one exists)"
             + (f"; peak memory must also grow by > {limits.min_peak_growth_mib:g} MiB" if limits.min_peak_growth_mib
                else ""),
             "- stages: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in night.stage_s.items()),
             *(f"- {note}" for note in night.notes), ""]
    if night.regressions:
        lines += ["### Regressions", "", *(f"- {line}" for line in night.regressions), ""]
    for title, markdown in night.sections:
        lines += [f"### {title} vs baseline", "", markdown.replace("\n### ", "\n#### "), ""]
    return "\n".join(lines)


def _gpu_lines(env: dict) -> list[str]:
    """The pre-flight's readings, where there was one."""
    if not env.get("gpu_driver"):
        return [f"- {env['gpu_preflight']}"] if env.get("gpu_preflight") else []
    return [f"- GPU before the night: driver {env['gpu_driver']}, SM clock {env.get('gpu_clock_sm_mhz')} of "
            f"{env.get('gpu_clock_max_sm_mhz')} MHz, {env.get('gpu_temperature_c')} °C, ECC "
            f"{env.get('gpu_ecc_mode')} ({env.get('gpu_ecc_uncorrected')} uncorrected), no other process; baseline "
            f"key {nvidia.baseline_key(env)}"]


def _publish(summary: str, out: Path) -> None:
    (out / "summary.md").write_text(summary, encoding="utf-8")
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(summary + "\n")


def run_night(config: NightConfig) -> Night:
    """Every stage in order; raises NightlyError for what is exit 2. The caller maps clean/regression to 0/1."""
    check_folders(config)
    env = night_environment(config.device)  # a device the night cannot run is refused before --out is made
    check_baseline(config.baseline, env)  # so is a baseline that cannot be read, or of another machine
    try:
        config.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise NightlyError(f"cannot create --out {config.out}: {exc.strerror or exc}") from None
    (config.out / ENVIRONMENT_FILE).write_text(json.dumps(env, indent=2) + "\n", encoding="utf-8")
    night = Night(config)
    _run_stages(night)
    _write_reports(night)
    if all((config.baseline / name).is_file() for name in (SWEEP_FILE, BENCHMARK_FILE)):
        _compare_with_baseline(night)
    else:
        night.first_night = True
    if night.clean or (config.accept and not night.trial_failures):
        _rotate_baseline(night)
        accepted = "" if night.clean else ", accepted with --accept despite the regressions below"
        night.notes.append(f"baseline {config.baseline} now holds this night{accepted}")
    else:
        night.notes.append(f"baseline {config.baseline} kept (a red night never becomes the baseline)")
    _publish(render_summary(night, env), config.out)
    return night
