"""The Slurm executor's parts that need no cluster: what squeue and sinfo answers mean, how many GPUs and minutes a
task asks for, the node's environment, one record per trial under racing writers, the sweep's array path, and the
--slurm-* flags (tests/test_slurm.py runs the whole against a real one-node cluster)."""

from __future__ import annotations

import json
import multiprocessing
import stat
from pathlib import Path

import pytest
from _tiny import TINY, TINY_ARGS

from optbench.__main__ import main
from optbench.job.spec import TrialSpec, build_grid
from optbench.records.record import Record, append_record, read_records
from optbench.sweep import SweepInterrupted, run_sweep
from optbench.sweep.slurm import NODE_SLACK_S, cpus_per_task, gpus_for, time_limit_min
from optbench.sweep.slurm_node import node_environment, slurm_job_id
from optbench.sweep.slurm_queue import (
    TaskState,
    complaint,
    ended_status,
    gres_gpus,
    parse_sinfo_gpus,
    parse_squeue,
)


def test_squeue_lines_become_task_states_and_only_hopeless_reasons_are_stuck():
    states = parse_squeue("12_0|RUNNING|None\n12_1|PENDING|JobArrayTaskLimit\n12_2|PENDING|PartitionDown\n"
                          "13|PENDING|ReqNodeNotAvail, UnavailableNodes:n1\n14|CANCELLED|None\n\n")
    assert set(states) == {"12_0", "12_1", "12_2", "13", "14"}
    assert [s for s, state in states.items() if state.stuck] == ["12_2", "13"]
    assert states["12_1"].waiting and not states["12_1"].stuck  # our own array cap: it waits its turn
    assert states["14"].ended and not states["12_0"].ended and not states["12_0"].waiting
    assert not TaskState("PENDING", "Priority").stuck and not TaskState("PENDING", "BeginTime").stuck


def test_an_ended_task_maps_to_a_status_with_the_schedulers_words():
    assert ended_status(TaskState("CANCELLED", "None")) == ("error", "cancelled on the cluster (scancel, or by an "
                                                                     "administrator)")
    assert ended_status(TaskState("TIMEOUT", "TimeLimit"))[0] == "timeout"
    assert ended_status(TaskState("OUT_OF_MEMORY", "None"))[0] == "oom"
    assert ended_status(TaskState("NODE_FAIL", "None")) == ("error", "its node failed")
    assert ended_status(TaskState("FAILED", "NonZeroExitCode")) == ("error",
                                                                    "Slurm ended the job FAILED (NonZeroExitCode)")


def test_a_refusal_is_one_line_without_the_commands_prefixes():
    stderr = ("sbatch: error: invalid partition specified: nosuch\n"
              "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    assert complaint(stderr) == ("invalid partition specified: nosuch; Batch job submission failed: Invalid "
                                 "partition name specified")
    assert complaint("something else\n") == "something else"


def test_gpus_per_node_are_read_from_sinfos_gres_column():
    assert gres_gpus("(null)") == 0
    assert gres_gpus("gpu:4") == 4 and gres_gpus("gpu:a100:8(S:0-1),shard:16") == 8
    sinfo = "cpu*|(null)\ngpu|gpu:a100:4(S:0-1)\ngpu|gpu:a100:8(S:0-1)\nmixed|gpu:2,mps:200\n"
    assert parse_sinfo_gpus(sinfo, None) == 0  # the default partition is marked *
    assert parse_sinfo_gpus(sinfo, "gpu") == 8 and parse_sinfo_gpus(sinfo, "mixed") == 2
    assert parse_sinfo_gpus(sinfo, "nosuch") is None


@pytest.mark.parametrize("device,nproc,asked,partition_gpus,gpus", [
    ("auto", 1, None, 0, 0),  # a CPU partition: `auto` asks for no GPU (it used to, and was refused)
    ("auto", 1, None, None, 0),  # an unknown partition: its refusal is the record
    ("auto", 1, None, 4, 1),
    ("auto", 2, None, 4, 2),  # a torchrun group: a GPU per rank
    ("cuda", 1, None, 0, 1),  # asked for CUDA: the scheduler says whether it can
    ("cpu", 1, None, 8, 0),
    ("cpu", 1, 1, 0, 1),  # --gpus-per-trial wins
    ("auto", 1, 0, 8, 0),
])
def test_gpus_per_task_follow_the_device_the_partition_and_the_flag(device, nproc, asked, partition_gpus, gpus):
    spec = TrialSpec(optimizer="adamw", **{**TINY, "device": device}, nproc=nproc)
    assert gpus_for(spec, asked, partition_gpus) == gpus


def done(optimizer: str, wall_s: float, **changes) -> Record:
    """A trial of the TINY job recorded ok in `wall_s` (`changes`: other fields)."""
    fields = {k: v for k, v in TINY.items() if k != "workload"}
    return Record(trial_id=optimizer, optimizer=optimizer, wall_s=wall_s, workload="tiny",
                  **{**fields, "status": "ok", **changes})


def test_the_time_limit_is_predicted_from_the_same_jobs_records_else_the_timeout():
    spec = TrialSpec(optimizer="adamw", **TINY, timeout_s=600)
    assert time_limit_min([spec], [], 0) == (600 + NODE_SLACK_S) / 60  # nothing recorded: the trial's timeout

    history = [done("adamw", 50.0), done("adamw", 70.0), done("adafactor", 400.0),
               done("adamw", 500.0, steps=300), done("adamw", 900.0, status="error")]
    assert time_limit_min([spec], history, 0) == 5  # 2 x 70 s + 120 s = 260 s -> 5 min
    assert time_limit_min([spec], [done("adamw", 550.0)], 0) == 12  # never past the timeout: 600 + 120 s
    assert time_limit_min([spec], history, 1) == 12  # CPU records do not predict a GPU task
    other = TrialSpec(optimizer="adafactor", **TINY, timeout_s=600)
    assert time_limit_min([spec, other], history, 0) == 12  # the array's limit: its longest trial's


@pytest.mark.parametrize("changes", [{"warmup_steps": 2}, {"schedule": "cosine"}, {"world_size": 2},
                                     {"env": {"torch_threads": 2}}])
def test_a_record_of_other_warmup_schedule_ranks_or_threads_does_not_predict_the_time_limit(changes):
    spec = TrialSpec(optimizer="adamw", **TINY, timeout_s=600, threads=1)
    same = done("adamw", 50.0, env={"torch_threads": 1})
    assert time_limit_min([spec], [same], 0) == 4  # the same job: 2 x 50 s + 120 s = 220 s -> 4 min
    other = done("adamw", 50.0, **{"env": {"torch_threads": 1}, **changes})
    assert time_limit_min([spec], [other], 0) == 12  # another job: the trial's timeout


def test_a_task_asks_for_a_cpu_per_thread_of_every_rank():
    one, threads = TrialSpec(optimizer="adamw", **TINY), TrialSpec(optimizer="adamw", **TINY, threads=4)
    group = TrialSpec(optimizer="adamw", **TINY, parallel="ddp", nproc=2, threads=3)
    assert cpus_per_task([one]) == 1 and cpus_per_task([one, threads]) == 4  # --threads 4 once got 1 CPU
    assert cpus_per_task([group]) == 6 and cpus_per_task([TrialSpec(optimizer="adamw", **TINY, nproc=2)]) == 2


def test_the_node_gives_the_trial_its_cpus_and_no_gpu_it_did_not_ask_for():
    cpu = node_environment(0, {"SLURM_CPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert cpu == {"OPTBENCH_TORCH_THREADS": "4", "OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": ""}
    gpu = node_environment(1, {"SLURM_CPUS_ON_NODE": "8", "CUDA_VISIBLE_DEVICES": "3"})
    assert gpu["OPTBENCH_GPU_PINNED"] == "1" and "CUDA_VISIBLE_DEVICES" not in gpu  # Slurm's own mask stands
    group = node_environment(0, {"SLURM_CPUS_ON_NODE": "4"}, nproc=2)  # a torchrun group shares the task's CPUs
    assert group["OPTBENCH_TORCH_THREADS"] == group["OMP_NUM_THREADS"] == "2"
    assert node_environment(0, {"SLURM_CPUS_ON_NODE": "1"}, nproc=2)["OPTBENCH_TORCH_THREADS"] == "1"
    assert slurm_job_id({"SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "15"}) == "12_3"
    assert slurm_job_id({"SLURM_JOB_ID": "15"}) == "15"


def _race(path: str, worker: int, start) -> None:
    """Store records 0..29 of run `r` (every worker the same trials, as a node and the sweep would)."""
    start.wait()
    for index in range(30):
        record = Record(run_id="r", trial_id=f"t{index}", optimizer="adamw", status="ok", seed=worker)
        append_record(Path(path), record, once=True)


def test_racing_writers_store_each_trial_of_a_run_once(tmp_path):
    """Six processes store the same 30 trials of one run at once, under the file lock: 30 whole lines, each trial
    once; another run's record of the same trial is its own."""
    out = tmp_path / "r.jsonl"
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    workers = [context.Process(target=_race, args=(str(out), worker, start)) for worker in range(6)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
    assert all(worker.exitcode == 0 for worker in workers)
    lines = out.read_text().splitlines()
    assert len(lines) == 30 and sorted(json.loads(line)["trial_id"] for line in lines) == sorted(
        f"t{i}" for i in range(30))
    first = read_records(out)[0]
    again = append_record(out, Record(run_id="r", trial_id=first.trial_id, optimizer="adamw", seed=99), once=True)
    assert again.seed == first.seed  # the stored one comes back
    append_record(out, Record(run_id="other", trial_id=first.trial_id, optimizer="adamw"), once=True)
    assert len(out.read_text().splitlines()) == 31


class _FakeArray:
    """An ArrayExecutor whose 'nodes' store the first trial's record themselves, as slurm_node does."""

    def __init__(self, interrupt_after: int | None = None):
        self.interrupt_after, self.stopped, self.run_ids = interrupt_after, False, []

    def run_all(self, specs, run_id, out_path):
        self.run_ids.append(run_id)
        for index, spec in enumerate(specs):
            if index == self.interrupt_after:
                raise KeyboardInterrupt
            record = Record(run_id=run_id, trial_id=spec.trial_id, optimizer=spec.optimizer, status="ok")
            if index == 0:
                append_record(out_path, record, once=True)
            yield record

    def stop(self):
        self.stopped = True


def test_the_sweep_stores_an_arrays_records_once_and_stops_it_on_an_interrupt(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = build_grid(["adamw", "adafactor", "sgd"], [0], **TINY)
    records = run_sweep(specs, out, executor=_FakeArray(), progress=None)
    assert len(records) == 3 and len(out.read_text().splitlines()) == 3  # the node's record was not stored twice
    interrupted = _FakeArray(interrupt_after=1)
    with pytest.raises(SweepInterrupted) as caught:
        run_sweep(specs, tmp_path / "i.jsonl", executor=interrupted, progress=None)
    assert interrupted.stopped and caught.value.recorded == 1


def _fake_srun(folder) -> str:
    """A PATH with an `srun` and nothing else: submitit believes in Slurm, but no controller answers."""
    srun = folder / "srun"
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    return str(folder)


RUN = ["run", *TINY_ARGS, "--out", "r.jsonl"]


@pytest.mark.parametrize("extra,message,path", [
    (["--slurm-partition", "gpu"], "--slurm-partition applies to --executor slurm", None),
    (["--gpus-per-trial", "1"], "--gpus-per-trial applies to --executor slurm", None),
    (["--executor", "slurm", "--slurm-option", "time=5"], "'time' is set by optbench: use --slurm-time", None),
    (["--executor", "slurm", "--slurm-option", "a b"], "expected an sbatch option as KEY=VALUE", None),
    (["--executor", "slurm", "--gpus-per-trial", "two"], "expected a GPU count, or TYPE:COUNT", None),
    (["--executor", "slurm", "--jobs", "2"], "with --executor slurm the array runs them", None),
    (["--executor", "slurm", "--device", "tpu"], "unknown device 'tpu'", None),
    (["--executor", "slurm"], "are you indeed on a slurm cluster? (use --executor local)", "empty"),
    (["--executor", "slurm"], "cannot run sinfo", "srun"),
    (["--executor", "slurm", "--device", "cuda"], "cannot run sinfo", "srun"),  # the nodes' GPUs: not checked here
])
def test_slurm_flags_misused_are_one_line_exit_2(tmp_path, monkeypatch, capfd, extra, message, path):
    monkeypatch.chdir(tmp_path)
    if path is not None:
        (tmp_path / "bin").mkdir()
        monkeypatch.setenv("PATH", _fake_srun(tmp_path / "bin") if path == "srun" else str(tmp_path / "bin"))
    code = main(RUN + extra)
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r.jsonl").exists()


def test_every_job_flag_is_in_the_planners_list_and_nightly_passes_the_slurm_ones_on():
    from optbench.cli.options import build_parser, job_argv
    from optbench.job.planner import JOB_FLAGS

    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    groups = [g for g in run._action_groups if g.title in ("the job (defaults: the preset's)", "where it runs")
              or (g.title or "").startswith("on a Slurm cluster")]
    dests = {a.dest for g in groups for a in g._group_actions}
    assert set(JOB_FLAGS) <= dests and dests - set(JOB_FLAGS) == {"allow_errors"}  # an exit rule, not the job
    argv = ["--executor", "slurm", "--slurm-partition", "gpu", "--gpus-per-trial", "a100:1", "--slurm-time", "30",
            "--slurm-max-running", "4", "--slurm-option", "qos=high", "--slurm-option", "exclusive"]
    night = parser.parse_args(["nightly", "--baseline", "b", "--out", "o", *argv])
    again = parser.parse_args(["run", *job_argv(night)])  # what the night's `optbench run` parses
    for name in ("executor", "slurm_partition", "gpus_per_trial", "slurm_time", "slurm_max_running", "slurm_option"):
        assert getattr(again, name) == getattr(night, name), name


def test_the_slurm_options_from_the_flags():
    from optbench.cli.options import build_parser
    from optbench.cli.sweeping import slurm_options

    args = build_parser().parse_args(["run", "--executor", "slurm", "--gpus-per-trial", "a100:2",
                                      "--slurm-option", "qos=high", "--slurm-option", "exclusive",
                                      "--slurm-pending-timeout", "60"])
    options = slurm_options(args)
    assert (options.gpus_per_trial, options.gpu_type, options.pending_timeout_s) == (2, "a100", 60.0)
    assert options.sbatch_options == {"qos": "high", "exclusive": True}


def test_same_trials_tells_when_two_results_files_ran_the_same_trials(tmp_path, capsys):
    """scripts/same_trials.py: .ci/run's check that the study through Slurm ran what the local study ran."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("same_trials", Path(__file__).parents[1] / "scripts/same_trials.py")
    same_trials = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(same_trials)
    for name, trials in (("a", ["t1", "t2"]), ("b", ["t2", "t1"]), ("c", ["t1", "t3"]), ("d", ["t1", "t2", "t2"])):
        for trial in trials:
            append_record(tmp_path / f"{name}.jsonl", Record(trial_id=trial, optimizer="adamw", status="ok"))
    assert same_trials.main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    assert same_trials.main([str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 1
    assert "missing 1 trial(s): t2" in capsys.readouterr().err
    assert same_trials.main([str(tmp_path / "a.jsonl"), str(tmp_path / "d.jsonl")]) == 1  # t2 recorded twice
