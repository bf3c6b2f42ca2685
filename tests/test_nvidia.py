"""The GPU's state in the environment stamp and the nightly's pre-flight (optbench/records/nvidia.py), read from a
fake nvidia-smi: driver, clocks, temperature, ECC, other processes; the baseline key, and a night that refuses a
busy GPU or a baseline timed on another GPU, driver or torch."""

from __future__ import annotations

import json
import os
from importlib import metadata

import pytest
import torch

from optbench.__main__ import main
from optbench.records import nvidia
from optbench.records.environment import environment
from optbench.workflows import nightly

UUID0, UUID1 = "GPU-5e1c6a3b-0000-1111-2222-333344445555", "GPU-9a8b7c6d-0000-1111-2222-333344445555"
GPUS = (f"0, {UUID0}, NVIDIA H200, 580.159.04, 345, 3201, 1980, 31, 74.52, P0, Enabled, 0\n"
        f"1, {UUID1}, NVIDIA H200, 580.159.04, 1980, 3201, 1980, 58, 690.10, P0, Enabled, 2\n")


def fake_smi(processes: str = "", gpus: str = GPUS):
    """nvidia-smi answering the two queries optbench asks, from canned csv."""

    def run(args: list[str]) -> str:
        return gpus if args[0].startswith("--query-gpu=") else processes

    return run


def test_gpu_rows_read_numbers_text_and_not_available():
    rows = nvidia.gpu_rows(fake_smi(gpus=GPUS + "2, GPU-x, Some GPU, 580.159.04, [N/A], 0, 0, 30, [N/A], P8, "
                                                  "[Not Supported], [N/A]\n"))
    assert rows[0]["clocks.sm"] == 345 and rows[0]["power.draw"] == 74.52 and rows[0]["driver_version"] == "580.159.04"
    assert rows[2]["clocks.sm"] is None and rows[2]["ecc.mode.current"] is None and rows[2]["pstate"] == "P8"


def test_the_mask_selects_gpus_by_index_or_uuid():
    rows = nvidia.gpu_rows(fake_smi())
    assert [r["index"] for r in nvidia.select_gpus(rows, None)] == [0, 1]
    assert [r["index"] for r in nvidia.select_gpus(rows, "1")] == [1]
    assert [r["index"] for r in nvidia.select_gpus(rows, "GPU-9a8b,0")] == [1, 0]  # a UUID prefix, in mask order
    assert nvidia.select_gpus(rows, "") == []


def test_the_stamp_names_other_processes_on_that_gpu_only():
    processes = f"{UUID0}, 4242, python, 1024\n{UUID1}, 77, other, 10\n{UUID0}, {os.getpid()}, me, 500\n"
    state = nvidia.gpu_stamp(UUID0.removeprefix("GPU-"), fake_smi(processes))
    assert state == {"gpu": "NVIDIA H200", "gpu_driver": "580.159.04", "gpu_clock_sm_mhz": 345,
                     "gpu_clock_mem_mhz": 3201, "gpu_clock_max_sm_mhz": 1980, "gpu_temperature_c": 31,
                     "gpu_power_w": 74.52, "gpu_pstate": "P0", "gpu_ecc_mode": "Enabled", "gpu_ecc_uncorrected": 0,
                     "gpu_other_processes": ["4242 python (1024 MiB)"]}  # not this process, not GPU 1's
    assert nvidia.gpu_stamp("not-a-gpu", fake_smi()) == {}
    assert nvidia.gpu_stamp(None, lambda args: None) == {}  # no nvidia-smi


def test_a_cuda_trials_environment_stamp_carries_its_gpus_state(monkeypatch):
    class Properties:
        uuid = UUID1.removeprefix("GPU-")
        total_memory = 141 * 2**30

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Properties())
    monkeypatch.setattr(nvidia, "nvidia_smi", fake_smi())
    env = environment(torch.device("cuda", 0))
    assert env["gpu"] == "NVIDIA H200" and env["gpu_ecc_uncorrected"] == 2 and env["gpu_temperature_c"] == 58
    assert "gpu_driver" not in environment(torch.device("cpu"))


def test_the_preflight_names_a_busy_gpu():
    stamps, busy = nvidia.preflight(None, fake_smi(f"{UUID1}, 4242, python, 1024\n"))
    assert [s["gpu_clock_sm_mhz"] for s in stamps] == [345, 1980]
    assert busy == ["GPU 1 (NVIDIA H200) is in use by 4242 python (1024 MiB)"]
    assert nvidia.preflight("0", fake_smi(f"{UUID1}, 4242, python, 1024\n"))[1] == []  # not a GPU this night uses


def test_a_night_refuses_a_busy_gpu_and_stamps_an_idle_one(monkeypatch):
    from optbench.job import devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)  # the two GPUs the fake nvidia-smi lists
    with pytest.raises(nightly.NightlyError, match=r"^pre-flight: GPU 0 \(NVIDIA H200\) is in use by 4242 python"):
        nightly.night_environment("cuda", fake_smi(f"{UUID0}, 4242, python, 1024\n"))
    env = nightly.night_environment("cuda:1", fake_smi())
    assert env["gpu"] == "NVIDIA H200" and env["gpu_clock_sm_mhz"] == 1980 and env["gpu_driver"] == "580.159.04"
    assert env["torch"] == metadata.version("torch") and env["gpus_visible"] == 2
    assert "gpu_driver" not in nightly.night_environment("cpu", fake_smi())


def test_the_baseline_key_is_gpu_driver_and_torch():
    key = nvidia.baseline_key({"gpu": "NVIDIA H200", "gpu_driver": "580.159.04", "torch": "2.11.0+cu130",
                               "cpu": "AMD EPYC"})
    assert key == "nvidia-h200_driver-580.159.04_torch-2.11.0+cu130"
    assert nvidia.baseline_key({"cpu_model": "family 25 model 1 stepping 1", "torch": "2.13.0"}) == \
        "family-25-model-1-stepping-1_driver-none_torch-2.13.0"


def test_a_night_refuses_a_baseline_timed_with_another_torch(tmp_path, capsys):
    (tmp_path / "baseline").mkdir()
    env = nightly.night_environment("cpu")
    (tmp_path / "baseline" / nightly.ENVIRONMENT_FILE).write_text(json.dumps({**env, "torch": "2.9.0"}))
    status = main(["nightly", "--device", "cpu", "--preset", "smoke", "--baseline", str(tmp_path / "baseline"),
                   "--out", str(tmp_path / "night")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "torch-2.9.0, this night runs on" in err[0]
    assert not (tmp_path / "night" / nightly.SWEEP_FILE).exists()  # refused before any stage ran


def test_print_baseline_key_prints_this_machines(capsys):
    assert main(["nightly", "--device", "cpu", "--print-baseline-key"]) == 0
    assert capsys.readouterr().out.strip() == nvidia.baseline_key(nightly.night_environment("cpu"))
    assert main(["nightly", "--device", "cpu"]) == 2  # neither --baseline nor --out
    assert "nightly needs --baseline and --out" in capsys.readouterr().err
