"""scripts/gpu-check on a machine without a GPU: one line and exit 2; its plan and its exit status through its dry
run; and the checks it makes on the records (scripts/gpu_check_records.py) on records built here."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optbench.probes import HOST_SYNCED
from optbench.records.record import Record

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"


def gpu_check(path_first: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The script with `path_first` (a folder holding a `python3`) first on PATH."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_") and k != "OUT"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**clean, "PATH": f"{path_first}{os.pathsep}{os.environ['PATH']}", **env})


def _assert_one_line_exit_2(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu-check would really run")
@pytest.mark.parametrize("part", ["part1", "part2"])
def test_without_cuda_it_says_so_in_one_line_and_exits_2(part):
    line = _assert_one_line_exit_2(gpu_check(Path(sys.executable).parent, part))
    assert f"torch {torch.__version__} sees none" in line


def test_without_torch_it_says_so_in_one_line_and_exits_2(tmp_path):
    for name in ("python", "python3"):  # no site-packages: no torch
        (tmp_path / name).write_text("#!/bin/sh\nexec " + sys.executable + " -I -S \"$@\"\n")
        (tmp_path / name).chmod(0o755)
    line = _assert_one_line_exit_2(gpu_check(tmp_path, "part1"))
    assert "torch cannot be imported" in line


def test_a_part_must_be_named():
    result = gpu_check(Path(sys.executable).parent)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "gpu-check: usage: scripts/gpu-check part1|part2 (or predictor ...)"]


def _plan(tmp_path, part: str, **env: str) -> dict[str, str]:
    result = gpu_check(Path(sys.executable).parent, part, GPU_CHECK_DRY_RUN="1", GPU_CHECK_OUT=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr
    return dict(line.split(": ", 1) for line in result.stdout.splitlines())


def test_both_parts_install_offline_from_the_bundle_keeping_the_machines_torch(tmp_path):
    for part in ("part1", "part2"):
        install = _plan(tmp_path, part)["install"]
        assert "--no-index --find-links .gpu-bundle" in install and "torch==<installed>" in install
        assert ".[all]" in install and "[dev" not in install  # dev's linters and browser are not on the device


def test_part_1_runs_the_cuda_tests_and_every_entry_on_tiny(tmp_path):
    steps = _plan(tmp_path, "part1")
    assert steps["cuda-tests"].endswith("-m pytest -q -n 0 -m cuda tests -p no:cacheprovider")
    for flags in ("--optimizers all", "--preset smoke", "--workload tiny", "--device cuda", "--resume-check"):
        assert flags in steps["smoke-all"]
    assert steps["checks"].endswith(f"gpu_check_records.py {tmp_path} part1")
    assert f"{tmp_path}/smoke-all.jsonl --out-dir {tmp_path}/report-part1 --format html" in steps["report"]
    assert not {"ddp", "fp16", "predictor", "lm"} & set(steps)


def test_part_2_runs_ddp_autocast_the_cap_the_predictor_and_the_lm_roofline(tmp_path):
    steps = _plan(tmp_path, "part2")
    assert "--parallel ddp --nproc 1" in steps["ddp"]  # one GPU: a one-rank torchrun group
    assert "--precision fp16-autocast --fidelity" in steps["fp16"] and "bf16-autocast" in steps["bf16"]
    assert "--max-memory 64MiB" in steps["max-memory"]
    fits = [name for name in steps if name.startswith("predictor-fit-")]
    held = [name for name in steps if name.startswith("predictor-held-")]
    assert len(fits) == 3 and len(held) == 2
    assert all("--resume-check" not in steps[n] and "--fidelity" not in steps[n] for n in fits + held)
    assert steps["predictor"].endswith(f"scripts/gpu-check predictor {tmp_path}/predictor-fit.jsonl "
                                       f"{tmp_path}/predictor-held.jsonl cuda {tmp_path}/predictor")
    assert "--workload lm" in steps["lm"] and "adamw8bit" in steps["lm"]
    assert "smoke-all" not in steps
    two = _plan(tmp_path, "part2", GPU_CHECK_DRY_RUN_GPUS="2")
    assert "--parallel ddp --nproc 2" in two["ddp"]


def test_a_failed_step_makes_it_exit_1_after_running_the_rest(tmp_path):
    result = gpu_check(Path(sys.executable).parent, "part1", GPU_CHECK_DRY_RUN="fail:smoke-all",
                       GPU_CHECK_OUT=str(tmp_path))
    assert result.returncode == 1
    assert "1 step(s) failed in part1" in result.stderr and "smoke-all (exit 1" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("report: ")  # the steps after it still ran


def test_the_predictor_step_passes_on_cpu_records_and_writes_nothing_into_the_package(tmp_path):
    """The step part 2 runs, pointed at the committed CPU calibration and held-out trials."""
    package = {p: p.read_bytes() for p in (ROOT / "optbench" / "memory" / "calibrations").glob("*.json")}
    cpu = ROOT / "results" / "cpu-2core" / "predictor"
    result = gpu_check(Path(sys.executable).parent, "predictor", str(cpu / "calibration.jsonl"),
                       str(cpu / "held-out.jsonl"), "cpu", str(tmp_path / "predictor"))
    assert result.returncode == 0, result.stderr
    # the LM's held-out trials are of its earlier design (llama-h256-l4): left out, by name, not a traceback
    assert re.match(r"predictor error on \d+ held-out cpu trials", result.stdout), result.stdout
    assert {p.name for p in (tmp_path / "predictor").iterdir()} >= {"held-out.md", "held-out.csv", "cpu.json",
                                                                     "calibration.md"}
    assert package == {p: p.read_bytes() for p in (ROOT / "optbench" / "memory" / "calibrations").glob("*.json")}


def test_the_predictor_step_says_why_records_cannot_be_held_out(tmp_path):
    """The step that always failed: every smoke trial ran --resume-check, which the predictor cannot use."""
    cpu = ROOT / "results" / "cpu-2core"
    result = gpu_check(Path(sys.executable).parent, "predictor", str(cpu / "predictor" / "calibration.jsonl"),
                       str(cpu / "smoke-all.jsonl"), "cpu", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr  # was a KeyError: 'held_out'
    lines = result.stderr.strip().splitlines()
    assert "left out 23 of 23 records: 23 --resume-check" in lines[-2]
    assert lines[-1] == "optbench.memory.calibrate: no held-out cpu trial to measure the predictor's error on"


def _checks():
    spec = importlib.util.spec_from_file_location("gpu_check_records", ROOT / "scripts" / "gpu_check_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _paged(**fields) -> Record:
    return Record(optimizer="paged_adamw8bit", status="ok", paged=True, **fields)


def test_the_record_checks_pass_a_good_run_and_name_each_problem():
    checks = _checks()
    lm = [Record(optimizer="adamw", status="ok", roofline_fraction=0.6, optimizer_impl="fused"),
          Record(optimizer="adamw8bit", status="ok", roofline_fraction=0.1, optimizer_impl=HOST_SYNCED)]
    good = {"smoke-all": [Record(optimizer="adamw", status="ok"), Record(optimizer="galore_adamw8bit", status="ok"),
                          _paged(paged_state_bytes=300, peak_cuda_allocated_bytes=1000, peak_memory_bytes=1300)],
            "max-memory": [Record(optimizer="adamw", status="oom")], "lm": lm}
    assert checks.problems(good) == []
    assert checks.problems({"smoke-all": good["smoke-all"]}, "part1") == []
    assert checks.problems({k: good[k] for k in ("max-memory", "lm")}, "part2") == []
    bad = {"smoke-all": [Record(optimizer="muon", status="error", error="boom"),
                         _paged(paged_state_bytes=0),
                         _paged(paged_state_bytes=300, peak_cuda_allocated_bytes=1000, peak_memory_bytes=1000)],
           "max-memory": [Record(optimizer="adamw", status="ok")],
           "lm": [Record(optimizer="adamw8bit", status="ok", optimizer_impl="per-parameter")]}
    found = checks.problems(bad)
    assert len(found) == 7, found
    assert found[0].startswith("smoke-all: muon seed 0 ended error: boom")
    assert "no paged state counted" in found[1] and "leaves out its paged state" in found[2]
    assert found[3] == "smoke-all: galore_adamw8bit is not in the sweep"
    assert found[4] == "max-memory: adamw ended ok, not oom"
    assert found[5].startswith("lm: adamw8bit has no roofline share") and "host-synced" in found[6]
    assert checks.problems({}, "part1") == ["smoke-all: no record",
                                            "smoke-all: no paged entry ran ok (bitsandbytes with CUDA support "
                                            "installed?)", "smoke-all: galore_adamw8bit is not in the sweep"]
    assert checks.problems({}, "part2") == ["max-memory: no record", "lm: no ok trial for the roofline"]


def test_every_python_snippet_in_the_script_compiles():
    """The dry run skips what only a GPU machine runs: a snippet that did not compile named the first GPU run's
    results folder `results/` (an empty GPU name) instead of `results/nvidia-h200/`."""
    text = (ROOT / "scripts" / "gpu-check").read_text(encoding="utf-8")
    snippets = re.findall(r'-c "([^"$]*)"', text) + re.findall(r"- [^<]*<<'PY'\n(.*?)\nPY\n", text, re.S)
    assert len(snippets) >= 5
    for snippet in snippets:
        compile(snippet, "gpu-check", "exec")
