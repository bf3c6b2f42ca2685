"""Which GPUs, threads and preloads each trial process gets (optbench/sweep/devices.py): the device logic of the
CUDA path, as plain functions, so that it is tested here although this machine has no GPU."""

import importlib
import threading
import time

import pytest

from optbench.job.spec import TrialSpec
from optbench.records.record import Record
from optbench.sweep.devices import (
    MODEL_PRELOAD,
    DeviceError,
    check_devices,
    gpu_slots,
    preload_modules,
    trial_environment,
    visible_gpus,
)


def test_visible_gpus_index_into_the_users_mask_indices_or_uuids():
    assert visible_gpus({}, 2) == ["0", "1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, 2) == ["2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}, 2) == ["GPU-aa", "GPU-bb"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 0) == []


def test_each_slot_gets_its_own_gpu_from_the_mask_and_a_group_gets_n():
    gpus = ["2", "3", "5", "7"]
    one = [trial_environment("cuda", 1, slot, gpus, 4, 16)["CUDA_VISIBLE_DEVICES"] for slot in range(4)]
    assert one == ["2", "3", "5", "7"]  # never the slot number itself: the user's mask is indexed into
    assert trial_environment("auto", 2, 1, gpus, 2, 16)["CUDA_VISIBLE_DEVICES"] == "5,7"  # torchrun: 2 GPUs
    assert trial_environment("cuda", 2, 0, gpus, 1, 16)["CUDA_VISIBLE_DEVICES"] == "2,3"  # --jobs 1 group
    # an explicit index pins that GPU of the mask, whatever the slot; the process sees it as cuda:0
    pinned = trial_environment("cuda:1", 1, 0, gpus, 2, 16)
    assert pinned == {"CUDA_VISIBLE_DEVICES": "3", "OPTBENCH_GPU_PINNED": "1"}


def test_no_gpu_or_cpu_trials_share_the_threads_instead():
    assert trial_environment("auto", 1, 0, [], 1, 8) == {}
    assert trial_environment("auto", 1, 2, [], 3, 8) == {"OPTBENCH_TORCH_THREADS": "2", "OMP_NUM_THREADS": "2"}
    assert trial_environment("cpu", 1, 0, ["0", "1"], 2, 2)["OPTBENCH_TORCH_THREADS"] == "1"


def test_a_torchrun_groups_ranks_share_their_slots_cores():
    assert trial_environment("cpu", 2, 0, [], 1, 8)["OPTBENCH_TORCH_THREADS"] == "4"  # one group: 4 per rank
    assert trial_environment("cpu", 2, 1, [], 2, 8)["OMP_NUM_THREADS"] == "2"  # two groups of two: 2 per rank
    assert trial_environment("cpu", 2, 0, [], 1, 2)["OPTBENCH_TORCH_THREADS"] == "1"  # this host: as torchrun's 1

def test_a_cpu_trial_sees_no_gpu():
    """bitsandbytes asks every GPU's capability when imported: a CPU trial would make a CUDA context."""
    assert trial_environment("cpu", 1, 0, ["0"], 1, 2) == {"CUDA_VISIBLE_DEVICES": ""}
    assert trial_environment("cpu", 1, 0, [], 1, 2) == {"CUDA_VISIBLE_DEVICES": ""}  # GPUs never counted
    assert trial_environment("cpu", 1, 1, ["0", "1"], 2, 8)["CUDA_VISIBLE_DEVICES"] == ""
    assert trial_environment("auto", 1, 0, [], 1, 8) == {}  # auto on a machine without GPUs: nothing to hide


def test_an_index_past_the_mask_is_refused_not_passed_on_raw():
    with pytest.raises(DeviceError, match=r"only 2 GPU\(s\) are visible.*entries 5,7.*cuda:0 to cuda:1"):
        trial_environment("cuda:2", 1, 0, ["5", "7"], 1, 16)
    with pytest.raises(DeviceError, match="no GPU is visible"):
        check_devices(["cpu", "cuda:0"], [])
    check_devices(["cpu", "cuda", "cuda:1"], ["5", "7"])  # every index inside the mask: no error


class _OnePerGpu:
    """An executor that records, per GPU mask, how many trials ran at once."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.lock = threading.Lock()

    def run(self, spec, env):
        gpu = env.get("CUDA_VISIBLE_DEVICES", "")
        with self.lock:
            self.running[gpu] = self.running.get(gpu, 0) + 1
            self.most[gpu] = max(self.most.get(gpu, 0), self.running[gpu])
        time.sleep(0.2)
        with self.lock:
            self.running[gpu] -= 1
        return Record(trial_id=spec.trial_id, optimizer=spec.optimizer, seed=spec.seed, status="ok")

    def stop(self) -> None:
        pass


def test_a_pinned_gpu_runs_one_trial_at_a_time_whatever_jobs_says(tmp_path, monkeypatch):
    from optbench.sweep import runner

    monkeypatch.setattr(runner, "cuda_device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    specs = [TrialSpec(optimizer="adamw", device="cuda:1", seed=seed, workload="tiny") for seed in range(4)]
    executor = _OnePerGpu()
    records = runner.run_sweep(specs, tmp_path / "r.jsonl", jobs=4, executor=executor, progress=None)
    assert len(records) == 4 and executor.most == {"1": 1}
    with pytest.raises(DeviceError):  # refused before any trial starts
        runner.run_sweep([TrialSpec(optimizer="adamw", device="cuda:2", workload="tiny")], tmp_path / "s.jsonl",
                         executor=_OnePerGpu(), progress=None)
    assert not (tmp_path / "s.jsonl").exists()


def test_slots_never_put_two_trials_on_one_gpu():
    assert gpu_slots(["0", "1"], 4, 1) == 2
    assert gpu_slots(["0", "1", "2", "3"], 4, 2) == 2  # two torchrun groups of 2
    assert gpu_slots(["0"], 3, 2) == 1


def test_bitsandbytes_and_the_model_code_are_preloaded_only_where_no_gpu_is_visible():
    base = ("torch",)
    assert preload_modules(base, True, 0) == ("torch", *MODEL_PRELOAD, "bitsandbytes")
    assert preload_modules(base, True, 1) == base  # their import initialises CUDA: forked children could not use it
    assert preload_modules(base, False, 0) == ("torch", *MODEL_PRELOAD)
    assert preload_modules(base, False, 2) == base
    for name in MODEL_PRELOAD:  # the forkserver skips a preload that does not import: a renamed module would go unseen
        importlib.import_module(name)



@pytest.mark.parametrize("name", ["mps", "meta", "xla"])
def test_a_device_torch_knows_but_optbench_does_not_measure_is_refused(name):
    """`run --device mps` passed the input check and ended every trial `error`; calibrate-bandwidth --device meta
    ended in a traceback. Every figure here is a CPU's or a CUDA device's: other types are refused up front."""
    from optbench.job.devices import resolve_device

    with pytest.raises(ValueError, match="not one optbench measures on"):
        resolve_device(name)


class _Envs:
    """An executor that keeps the environment each trial was given."""

    def __init__(self) -> None:
        self.envs: list[dict[str, str]] = []

    def run(self, spec, env):
        self.envs.append(env)
        return Record(trial_id=spec.trial_id, optimizer=spec.optimizer, seed=spec.seed, status="ok")

    def stop(self) -> None:
        pass


def test_cpu_slots_share_the_cores_this_process_may_use_not_the_machines(tmp_path, monkeypatch):
    """A container granting 2 of the machine's 64 cores: two slots run one thread each (64 // 2 would oversubscribe
    the two cores 32 times over); the --threads warning counts the same cores."""
    from optbench.sweep import runner

    monkeypatch.setattr(runner.os, "cpu_count", lambda: 64)
    monkeypatch.setattr(runner, "usable_cpu_cores", lambda: 2)
    specs = [TrialSpec(optimizer="adamw", device="cpu", seed=seed, workload="tiny") for seed in range(2)]
    executor = _Envs()
    runner.run_sweep(specs, tmp_path / "r.jsonl", jobs=2, executor=executor, progress=None)
    assert [env["OPTBENCH_TORCH_THREADS"] for env in executor.envs] == ["1", "1"]


def test_one_rule_names_cuda_for_specs_records_and_the_device_kind():
    from optbench.job.devices import device_kind
    from optbench.records.environment import names_cuda

    assert [names_cuda(name) for name in ("cuda", "cuda:1", "auto", "cpu", "mps")] == [True, True, False, False, False]
    assert [device_kind(name, gpus=2) for name in ("cuda:0", "auto", "cpu")] == ["cuda", "cuda", "cpu"]
    assert device_kind("auto", gpus=0) == "cpu" and device_kind("cuda", gpus=0) == "cuda"
