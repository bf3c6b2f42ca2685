"""Parallel trials as real 2-process torchrun groups on CPU (gloo) with the tiny BERT: what each rank holds."""

import sys
from pathlib import Path

import pytest

from optbench import optimizers
from optbench.__main__ import main
from optbench.job.spec import PARALLEL_MODES, TrialSpec
from optbench.memory.estimate import Estimate
from optbench.sweep import LocalExecutor
from optbench.sweep.executors import launch_command
from optbench.trial.run import run_trial

TINY = dict(workload="tiny", device="cpu", steps=4, warmup_steps=1, batch_size=8, seq_len=16, eval_size=24,
            nproc=2, timeout_s=600)


def in_group(spec: TrialSpec):
    """A parallel trial as the sweep runs it: a torchrun group started by the process layer."""
    return LocalExecutor(echo=False).run(spec, {})


@pytest.fixture(scope="module")
def state_maps(tmp_path_factory):
    return str(tmp_path_factory.mktemp("state-maps"))


@pytest.fixture(scope="module")
def adamw(state_maps):
    """Each mode once, with the resume check (a checkpoint through torch.distributed.checkpoint at step 2) and the
    sharding check (--state-map)."""
    return {mode: in_group(TrialSpec(optimizer="adamw", parallel=mode, resume_check=True, state_map_dir=state_maps,
                                     **TINY)) for mode in PARALLEL_MODES}


def largest_tensor_state_bytes(record) -> int:
    """AdamW's state for the model's largest parameter: the granularity ZeRO-1 shards at."""
    from optbench.workloads import get_workload

    model = get_workload("tiny").build(TrialSpec(optimizer="adamw", **TINY)).model
    return 2 * 4 * max(p.numel() for p in model.parameters()) + 4


def test_every_rank_reports(adamw):
    for mode, record in adamw.items():
        assert record.status == "ok", (mode, record.error)
        assert (record.parallel, record.world_size) == (mode, 2)
        assert [rank["rank"] for rank in record.per_rank] == [0, 1]
        for rank in record.per_rank:
            assert rank["status"] == "ok" and rank["state_bytes"] > 0 and rank["step_time_median_s"] > 0
            assert rank["peak_rss_bytes"] > 0
        assert record.state_bytes == record.per_rank[0]["state_bytes"]
        assert record.eval_accuracy == record.per_rank[0]["eval_accuracy"] == record.eval_metrics["accuracy"]


def test_every_mode_resumes_adamw_exactly_from_its_checkpoint(adamw):
    for mode, record in adamw.items():
        assert (record.resume_status, record.resume_max_abs_param_diff) == ("exact", 0.0), (mode, record.resume_status)
        assert record.checkpoint_bytes > record.state_bytes  # model + optimizer (+ every rank's shards)


def test_a_one_rank_group_holds_what_a_single_process_holds():
    """--nproc 1 (gpu-check's group on a one-GPU machine): the torchrun path, every byte of the state on rank 0."""
    record = in_group(TrialSpec(optimizer="adamw", parallel="zero1", **{**TINY, "nproc": 1}))
    assert record.status == "ok", record.error
    assert record.world_size == 1 and [rank["rank"] for rank in record.per_rank] == [0]
    assert record.state_bytes == record.analytic_state_bytes


def test_run_trial_refuses_a_parallel_spec_outside_a_group():
    record = run_trial(TrialSpec(optimizer="adamw", parallel="ddp", **TINY))
    assert record.status == "error" and "torchrun group" in record.error


def test_ddp_ranks_hold_everything_zero1_shards_the_state(adamw):
    ddp, zero1 = adamw["ddp"], adamw["zero1"]
    assert [r["state_bytes"] for r in ddp.per_rank] == [ddp.analytic_state_bytes] * 2
    # Each parameter's state lives on exactly one rank; ZeRO-1 splits at whole tensors.
    assert sum(r["state_bytes"] for r in zero1.per_rank) == ddp.state_bytes
    for rank in zero1.per_rank:
        assert abs(rank["state_bytes"] - ddp.state_bytes / 2) <= largest_tensor_state_bytes(ddp)
        assert rank["weights_bytes"] == rank["grads_bytes"] == ddp.weights_bytes


def test_fsdp2_halves_weights_grads_and_state(adamw):
    ddp, fsdp2 = adamw["ddp"], adamw["fsdp2"]
    for rank in fsdp2.per_rank:
        assert rank["state_bytes"] == pytest.approx(ddp.state_bytes / 2, rel=0.01)
        assert rank["weights_bytes"] == pytest.approx(ddp.weights_bytes / 2, rel=0.01)
        assert rank["grads_bytes"] == pytest.approx(ddp.grads_bytes / 2, rel=0.01)


def test_estimate_columns_match_the_measured_ranks(adamw):
    ddp = adamw["ddp"]
    estimate = Estimate(optimizer="adamw", precision="fp32", basis="measured", num_params=ddp.num_params,
                        state_bytes=ddp.state_bytes, weights_bytes=ddp.weights_bytes, grads_bytes=ddp.grads_bytes)

    def held(record, rank):
        return sum(record.per_rank[rank][key] for key in ("weights_bytes", "grads_bytes", "state_bytes"))

    for rank in (0, 1):
        assert held(ddp, rank) == estimate.per_gpu_bytes(2, stage=0)
        assert abs(held(adamw["zero1"], rank) - estimate.per_gpu_bytes(2, stage=1)) <= largest_tensor_state_bytes(ddp)
        assert held(adamw["fsdp2"], rank) == pytest.approx(estimate.per_gpu_bytes(2, stage=3), rel=0.01)


def test_fsdp2_with_an_eval_curve_holds_what_it_holds_without_one(adamw):
    """An eval-curve point (a forward with no backward) left FSDP2's root parameters gathered, so the optimizer's
    state matched no parameter of the model: every fsdp2 trial with --eval-every, every fsdp2 study, ended `error`."""
    record = in_group(TrialSpec(optimizer="adamw", parallel="fsdp2", eval_every=2, **TINY))
    assert record.status == "ok", record.error
    assert [point[0] for point in record.eval_curve] == [2, 4]  # the last point after the last step
    without = adamw["fsdp2"].per_rank
    assert [rank["state_bytes"] for rank in record.per_rank] == [rank["state_bytes"] for rank in without]


@pytest.mark.skipif(not optimizers.resolve("adamw8bit").available, reason="needs bitsandbytes")
def test_an_optimizer_failing_under_fsdp2_keeps_the_library_message():
    record = in_group(TrialSpec(optimizer="adamw8bit", parallel="fsdp2", **TINY))
    if record.status == "ok":  # a bitsandbytes that takes DTensors: then its state must be sharded too
        assert all(rank["state_bytes"] > 0 for rank in record.per_rank)
    else:
        assert record.status == "error" and "DTensor" in record.error
        assert [rank["status"] for rank in record.per_rank] == ["error", "error"]


def test_launch_command_is_torchrun_from_this_interpreter():
    spec = TrialSpec(optimizer="adamw", parallel="ddp", nproc=4)
    command = launch_command(spec, Path("s.json"), Path("r.json"))
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[-5:] == ["-m", "optbench.sweep.child", "rank", "s.json", "r.json"]


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2"], "--nproc needs a --parallel mode"),
    (["--parallel", "ddp", "--engine", "trainer"], "native loop"),
    (["--parallel", "fsdp2", "--nproc", "0"], "must be positive"),
    (["--parallel", "zero3"], "invalid choice"),
    (["--parallel", "ddp", "--device", "cuda:1"], "not a device index"),
    (["--resume-check", "--engine", "accelerate"], "--resume-check runs with the native loop"),
])
def test_bad_parallel_options_are_one_line(capsys, args, message):
    assert main(["run", "--workload", "tiny", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_per_rank_table_compares_each_rank_with_a_ddp_rank(adamw):
    from optbench.trial.engines.parallel import per_rank_markdown

    rows = [line.split("|")[1:-1] for line in per_rank_markdown(list(adamw.values())).splitlines()[2:]]
    share = {(cells[1].strip(), cells[2].strip()): float(cells[8]) for cells in rows}
    assert share[("ddp x2", "0")] == share[("ddp x2", "1")] == 100.0
    assert share[("fsdp2 x2", "0")] == pytest.approx(50, abs=1)


def _changes(record):
    return [(c["name"], c["kind"], c["single"], c["sharded"]) for c in record.sharding_state_changes]


def _predicted(optimizer, mode):
    from optbench.memory import sharding

    return [(c.name, c.kind, c.single, c.sharded) for c in sharding.predict(optimizer, mode, 2, workload="tiny")[2]]


def test_the_sharding_check_finds_no_change_for_adamw_and_writes_each_ranks_map(adamw, state_maps):
    from optbench.workloads import get_workload

    tensors = len(list(get_workload("tiny").build(TrialSpec(optimizer="adamw", **TINY)).model.parameters()))
    for mode, record in adamw.items():
        assert (record.sharding_state_changes, record.sharding_checked_params) == ([], tensors), mode
    assert {path.name.rsplit("-", 1)[1] for path in Path(state_maps).iterdir()} == {"rank0.csv", "rank1.csv"}


@pytest.mark.parametrize("optimizer,mode", [("adamw8bit_torchao", "fsdp2"), ("adamw8bit_hf", "zero1")])
def test_the_measured_sharding_changes_are_the_predicted_ones(optimizer, mode, state_maps, monkeypatch):
    """torchao under FSDP2 quantises by each rank's shard; ZeRO-1 loses HF's fp32 embeddings: both measured in real
    torchrun groups, both exactly what `explain --parallel` predicts without training."""
    if not optimizers.resolve(optimizer).available:
        pytest.skip(f"{optimizer}: {optimizers.resolve(optimizer).unavailable_reason()}")
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")  # torchao's update eagerly: the same state, no compile time
    record = in_group(TrialSpec(optimizer=optimizer, parallel=mode, state_map_dir=state_maps, **TINY))
    assert record.status == "ok", record.error
    assert _changes(record) == _predicted(optimizer, mode) != []
