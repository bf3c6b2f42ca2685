"""Which GPUs, threads and preloads each trial process gets (optbench/sweep/devices.py): the device logic of the
CUDA path, as plain functions, so that it is tested here although this machine has no GPU."""

from optbench.sweep.devices import gpu_slots, preload_modules, trial_environment, visible_gpus


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
    assert "CUDA_VISIBLE_DEVICES" not in trial_environment("cpu", 1, 0, ["0"], 1, 2)


def test_slots_never_put_two_trials_on_one_gpu():
    assert gpu_slots(["0", "1"], 4, 1) == 2
    assert gpu_slots(["0", "1", "2", "3"], 4, 2) == 2  # two torchrun groups of 2
    assert gpu_slots(["0"], 3, 2) == 1


def test_bitsandbytes_is_preloaded_only_where_no_gpu_is_visible():
    base = ("torch",)
    assert preload_modules(base, True, 0) == ("torch", "bitsandbytes")
    assert preload_modules(base, True, 1) == base  # its import initialises CUDA: forked children could not use it
    assert preload_modules(base, False, 0) == base

