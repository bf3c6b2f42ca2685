"""scripts/gpu-check on a machine without a GPU: one line and exit 2; its plan and its exit status through its dry
run; and the checks it makes on the records (scripts/gpu_check_records.py) on records built here."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optbench.records.record import Record

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"


def gpu_check(path_first: Path, **env: str) -> subprocess.CompletedProcess:
    """The script with `path_first` (a folder holding a `python`) first on PATH."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**clean, "PATH": f"{path_first}{os.pathsep}{os.environ['PATH']}", **env})


def _assert_one_line_exit_2(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu-check would really run")
def test_without_cuda_it_says_so_in_one_line_and_exits_2():
    line = _assert_one_line_exit_2(gpu_check(Path(sys.executable).parent))
    assert f"torch {torch.__version__} sees none" in line


def test_without_torch_it_says_so_in_one_line_and_exits_2(tmp_path):
    (tmp_path / "python").write_text("#!/bin/sh\nexec python3 -I -S \"$@\"\n")  # no site-packages: no torch
    (tmp_path / "python").chmod(0o755)
    line = _assert_one_line_exit_2(gpu_check(tmp_path))
    assert "torch cannot be imported" in line


def test_the_plan_covers_every_check_the_cuda_path_needs(tmp_path):
    result = gpu_check(Path(sys.executable).parent, GPU_CHECK_DRY_RUN="1", GPU_CHECK_OUT=str(tmp_path))
    assert result.returncode == 0, result.stderr
    steps = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert "--system-site-packages" in steps["install"] and "torch==<installed>" in steps["install"]
    assert steps["cuda-tests"].endswith("-m pytest -q -n 0 -m cuda tests -p no:cacheprovider")
    for flags in ("--optimizers all", "--preset smoke", "--device cuda", "--resume-check"):
        assert flags in steps["smoke-all"]
    assert "--precision fp16-autocast --fidelity" in steps["fp16"] and "bf16-autocast" in steps["bf16"]
    assert "--max-memory 64MiB" in steps["max-memory"] and "gpu_check_records.py" in steps["checks"]
    assert steps["report"].endswith("--format html") and str(tmp_path) in steps["report"]
    assert "--parallel ddp --nproc 1" in steps["ddp"]  # one GPU: a one-rank torchrun group
    two = gpu_check(Path(sys.executable).parent, GPU_CHECK_DRY_RUN="1", GPU_CHECK_OUT=str(tmp_path),
                    GPU_CHECK_DRY_RUN_GPUS="2")
    assert "--parallel ddp --nproc 2" in dict(line.split(": ", 1) for line in two.stdout.splitlines())["ddp"]


def _cuda_records(path: Path, shapes, precision: str = "fp32") -> None:
    """Records a plain CUDA trial of the tiny BERT would write, peaks 5 % over the uncalibrated prediction."""
    from optbench.job.spec import TrialSpec
    from optbench.memory import predict
    from optbench.optimizers import resolve
    from optbench.records.record import append_record

    facts = predict.facts_for_spec(TrialSpec(optimizer="adamw", workload="tiny"))
    for name, batch in shapes:
        peak = predict.predict_peak(facts, resolve(name), batch_size=batch, seq_len=32, precision=precision,
                                    device_kind="cuda", calibration=None).total_bytes
        append_record(path, Record(trial_id=f"{path.stem}-{name}-{batch}", status="ok", optimizer=name,
                                   workload="tiny", model="tiny-bert-h64", device="cuda:0", batch_size=batch,
                                   seq_len=32, precision=precision, peak_cuda_allocated_bytes=round(peak * 1.05)))


def test_the_predictor_step_measures_plain_trials_and_writes_only_into_its_results(tmp_path):
    """The band's inputs come from steps whose trials it can use (a resume check, a fidelity probe or a parallel
    group holds more than the predictor models: such records are left out, and a band of none fails); its command,
    run on the records those steps would write, puts its tables and its band in the results folder, not the
    package."""
    result = gpu_check(Path(sys.executable).parent, GPU_CHECK_DRY_RUN="1", GPU_CHECK_OUT=str(tmp_path))
    steps = {name: shlex.split(command) for name, command in
             (line.split(": ", 1) for line in result.stdout.splitlines())}
    command = steps["predictor"]
    held = command[command.index("--held-out") + 1:command.index("--out-dir")]
    for path in held:
        writers = [argv for argv in steps.values() if "--out" in argv and argv[argv.index("--out") + 1] == path]
        assert writers, f"no step writes {path}"
        assert all(not {"--resume-check", "--fidelity", "--parallel"} & set(argv) for argv in writers), path
    _cuda_records(Path(held[0]), [("adamw", 8), ("adafactor", 8), ("adamw8bit", 32), ("adamw", 32)])
    _cuda_records(Path(held[1]), [("adamw", 8)], precision="bf16-autocast")
    shipped = {p.name: p.read_bytes() for p in (ROOT / "optbench" / "memory" / "calibrations").iterdir()}
    run = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("predictor error on 5 held-out cuda trials")
    band = json.loads((tmp_path / "predictor" / "cuda.json").read_text())["validation_uncalibrated"]
    assert band["trials"] == 5 and band["worst_under"] == pytest.approx(0.05, abs=1e-3)  # measured 5 % over
    assert (tmp_path / "predictor" / "held-out.md").is_file()
    assert {p.name: p.read_bytes() for p in (ROOT / "optbench" / "memory" / "calibrations").iterdir()} == shipped


def test_a_failed_step_makes_it_exit_1_after_running_the_rest(tmp_path):
    result = gpu_check(Path(sys.executable).parent, GPU_CHECK_DRY_RUN="fail:smoke-all", GPU_CHECK_OUT=str(tmp_path))
    assert result.returncode == 1
    assert "1 step(s) failed" in result.stderr and "smoke-all (exit 1" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("report: ")  # the steps after it still ran


def _checks():
    spec = importlib.util.spec_from_file_location("gpu_check_records", ROOT / "scripts" / "gpu_check_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paged(**fields) -> Record:
    return Record(optimizer="paged_adamw8bit", status="ok", paged=True, **fields)


def test_the_record_checks_pass_a_good_run_and_name_each_problem():
    checks = _checks()
    good = {"smoke-all": [Record(optimizer="adamw", status="ok"),
                          _paged(paged_state_bytes=300, peak_cuda_allocated_bytes=1000, peak_memory_bytes=1300)],
            "max-memory": [Record(optimizer="adamw", status="oom")]}
    assert checks.problems(good) == []
    bad = {"smoke-all": [Record(optimizer="muon", status="error", error="boom"),
                         _paged(paged_state_bytes=0),
                         _paged(paged_state_bytes=300, peak_cuda_allocated_bytes=1000, peak_memory_bytes=1000)],
           "max-memory": [Record(optimizer="adamw", status="ok")]}
    found = checks.problems(bad)
    assert len(found) == 4, found
    assert found[0].startswith("smoke-all: muon seed 0 ended error: boom")
    assert "no paged state counted" in found[1] and "leaves out its paged state" in found[2]
    assert found[3] == "max-memory: adamw ended ok, not oom"
    assert checks.problems({}) == ["smoke-all: no paged entry ran ok (bitsandbytes with CUDA support installed?)",
                                   "max-memory: no record"]
