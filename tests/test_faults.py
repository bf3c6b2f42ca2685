"""The fault suite: each test names a fault and what must still hold after it.

Fakes stand in for the trial where the fault is the harness's (kills, concurrent writers, disk full);
the tiny BERT runs where the fault is the trial's (timeout, out of memory, divergence).
"""

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _tiny import TINY, started

from optbench.__main__ import main
from optbench.job.spec import TrialSpec
from optbench.optimizers import OptimizerSpec
from optbench.records import exits
from optbench.records import record as results
from optbench.records.record import Record, append_record, read_records
from optbench.sweep import FunctionExecutor, LocalExecutor, ResultsWriteError, run_sweep, runner

TINY_RUN = ["--workload", "tiny", "--device", "cpu", "--steps", "3", "--warmup-steps", "1", "--batch-size", "4",
            "--seq-len", "16", "--eval-size", "16"]
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
# 100000 steps: the trial is still training when the signal comes (the group is killed on the way out anyway)
ENDLESS = ["run", *TINY_RUN[:4], "--steps", "100000", "--optimizers", "adamw", "--timeout", "600"]


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children of children too), from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkill_mid_trial_then_rerun_resumes_without_loss_or_duplicates(tmp_path):
    out, started = tmp_path / "r.jsonl", tmp_path / "second-started"
    script = tmp_path / "sweep.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path
        from optbench.job.spec import build_grid
        from optbench.records.record import Record
        from optbench.sweep import run_sweep

        def trial(spec):
            if spec.optimizer == "adafactor" and not Path({str(started)!r}).exists():
                Path({str(started)!r}).touch()
                time.sleep(600)  # killed here
            return Record(trial_id=spec.trial_id, optimizer=spec.optimizer, seed=spec.seed, status="ok")

        if __name__ == "__main__":
            specs = build_grid(["adamw", "adafactor", "adamw8bit"], [0, 1], workload="tiny", device="cpu")
            run_sweep(specs, Path({str(out)!r}), run_trial=trial)
    """))
    sweep = subprocess.Popen([sys.executable, str(script)], env=ENV, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert sweep.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    assert [r.optimizer for r in read_records(out)] == ["adamw"]  # recorded before the kill

    subprocess.run([sys.executable, str(script)], env=ENV, check=True, capture_output=True, timeout=120)
    ids = [r.trial_id for r in read_records(out)]
    assert len(ids) == 6 == len(set(ids))  # every trial once: none lost, none recorded twice


def _wait_for_trial(sweep: subprocess.Popen) -> set[int]:
    """The sweep's process tree once the trial child (the leader of its own session) is running."""
    deadline = time.monotonic() + 180
    while True:
        assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended before its trial started"
        tree = _descendants(sweep.pid)
        if any(os.getsid(pid) == pid for pid in tree if _alive(pid)):
            return tree
        time.sleep(0.2)


@pytest.mark.parametrize("signum,status,word", [(signal.SIGINT, 130, "interrupted"),
                                                 (signal.SIGTERM, 143, "terminated")])
def test_a_signal_stops_a_background_sweep_and_says_how_to_resume(tmp_path, signum, status, word):
    """Started as a script's background job (SIGINT ignored), `kill -INT` or a scheduler's SIGTERM still stops the
    sweep: one line on stderr, nothing after it, and no process of the sweep left."""
    out = tmp_path / "r.jsonl"
    with started([*ENDLESS, "--out", str(out)], ignore_sigint=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 text=True) as sweep:
        tree = _wait_for_trial(sweep)
        os.kill(sweep.pid, signum)
        _, stderr = sweep.communicate(timeout=60)
        assert sweep.returncode == status, stderr
        assert stderr.strip().splitlines()[-1] == (f"optbench: {word}: 0 trials recorded, rerun the same command "
                                                  "to resume"), stderr  # no resource-tracker warning after it
        assert "Traceback" not in stderr
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in tree), "a process of the interrupted sweep outlived it"
    assert not out.exists() or read_records(out) == []


def test_a_sweep_killed_with_sigkill_leaves_no_process_behind(tmp_path):
    """SIGKILL cannot be caught: the trial child, the forkserver and the resource tracker must notice on their own
    (the child watches the sweep's pid) and be gone within 5 seconds."""
    with started([*ENDLESS, "--out", str(tmp_path / "r.jsonl")], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as sweep:
        tree = _wait_for_trial(sweep)
        assert len(tree) >= 3  # forkserver, resource tracker, trial child
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        time.sleep(5)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in tree if _alive(pid)}
        assert not left, f"alive 5 s after the sweep's SIGKILL: {left}"


def test_trial_past_its_timeout_is_a_timeout_record_and_the_sweep_goes_on(tmp_path):
    out = tmp_path / "r.jsonl"
    specs = [TrialSpec(optimizer="adamw", timeout_s=0.5, **TINY), TrialSpec(optimizer="adafactor", **TINY)]
    records = run_sweep(specs, out)
    assert [r.status for r in records] == ["timeout", "ok"]
    assert "0.5 s timeout" in records[0].error
    assert [r.status for r in read_records(out)] == ["timeout", "ok"]


def test_out_of_memory_on_cpu_is_an_oom_record_and_the_next_trial_runs(tmp_path, monkeypatch):
    # 64 MiB on top of the loaded libraries cannot hold batch 256 x seq 128 activations. RUST_BACKTRACE=1 (as on the
    # machine this runs on): with it the tokenizer's allocation failure hung about one trial in 6-10 (cap_memory);
    # the short timeout makes such a hang cost two minutes, not fifteen.
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    hungry = TrialSpec(optimizer="adamw", max_memory_bytes=64 * 2**20, timeout_s=120,
                       **{**TINY, "batch_size": 256, "seq_len": 128})
    assert hungry.trial_id == TrialSpec(optimizer="adamw", **{**TINY, "batch_size": 256, "seq_len": 128}).trial_id
    records = run_sweep([hungry, TrialSpec(optimizer="adafactor", **TINY)], tmp_path / "r.jsonl")
    assert [r.status for r in records] == ["oom", "ok"], [r.error for r in records]
    assert "under the trial's --max-memory cap of 64 MiB" in records[0].error  # it read "MemoryError: "


def test_a_capped_trial_asks_rust_for_no_backtrace():
    """Under the cap, Rust's allocation-failure hook capturing a backtrace fails to allocate again and waits on its own
    lock forever (py-spy: tokenizers' default_alloc_error_hook -> backtrace::lock, inside a symbolize callback)."""
    code = ("import os, torch; from optbench.sweep.child import cap_memory; cap_memory(torch.device('cpu'), 2**30); "
            "print([os.environ.get(n) for n in ('RUST_BACKTRACE', 'RUST_LIB_BACKTRACE')])")
    env = {**os.environ, "RUST_BACKTRACE": "1", "RUST_LIB_BACKTRACE": "full"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[None, None]"


@pytest.mark.cuda
def test_out_of_memory_on_cuda_is_an_oom_record_and_the_next_trial_runs(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: the cap is the allocator's per-process fraction (torch.OutOfMemoryError)")
    cuda = {**TINY, "device": "cuda", "batch_size": 256, "seq_len": 512}
    hungry = TrialSpec(optimizer="adamw", max_memory_bytes=16 * 2**20, **cuda)
    records = run_sweep([hungry, TrialSpec(optimizer="adafactor", **{**TINY, "device": "cuda"})], tmp_path / "r.jsonl")
    assert [r.status for r in records] == ["oom", "ok"], [r.error for r in records]


def test_non_finite_loss_is_diverged_at_that_step(tmp_path):
    record = LocalExecutor(echo=False).run(TrialSpec(optimizer="adamw", lr=1e30, **{**TINY, "steps": 6}), {})
    assert record.status == "diverged", record.error
    assert "at step" in record.error


def test_two_writers_appending_at_once_leave_every_line_intact(tmp_path):
    out = tmp_path / "r.jsonl"
    writer = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from optbench.records.record import Record, append_record
        for i in range(1500):
            append_record(Path({str(out)!r}), Record(trial_id=f"{{sys.argv[1]}}-{{i}}", optimizer="adamw",
                                                      loss_curve=[float(i)] * 2000))  # ~20 KB a line
    """)
    writers = [subprocess.Popen([sys.executable, "-c", writer, name], env=ENV) for name in ("a", "b")]
    assert [w.wait(timeout=300) for w in writers] == [0, 0]
    lines = out.read_text().splitlines()
    assert len(lines) == 3000
    ids = {json.loads(line)["trial_id"] for line in lines}  # every line parses: none torn or interleaved
    assert ids == {f"{name}-{i}" for name in "ab" for i in range(1500)}


def test_corrupt_lines_in_the_middle_are_skipped_with_one_warning_naming_them(tmp_path):
    out = tmp_path / "r.jsonl"
    for name in "abc":
        append_record(out, Record(trial_id=name, optimizer="adamw", status="ok"))
    lines = out.read_text().splitlines()
    out.write_text("\n".join([lines[0], "{garbage", lines[1], "\x00\x00", lines[2]]) + "\n")
    with pytest.warns(UserWarning, match=r"skipping 2 unreadable line\(s\): 2, 4") as caught:
        records = read_records(out)
    assert len(caught) == 1 and [r.trial_id for r in records] == ["a", "b", "c"]


def test_results_folder_missing_is_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "new" / "deeper" / "r.jsonl"
    assert main(["run", *TINY_RUN, "--no-figures", "--optimizers", "adafactor", "--out", str(out)]) == 0
    assert [r.status for r in read_records(out)] == ["ok"]


def _unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root ignores permission bits; sysfs refuses new files even to root
        return Path("/sys/fs")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


@pytest.mark.parametrize("where", ["read-only", "directory"])
def test_unwritable_out_is_one_line_before_any_trial(tmp_path, monkeypatch, capsys, where):
    monkeypatch.chdir(tmp_path)
    out = _unwritable_dir(tmp_path) / "r.jsonl" if where == "read-only" else tmp_path
    ran = []
    monkeypatch.setattr("optbench.sweep.run_sweep", lambda *a, **k: ran.append(a))
    assert main(["run", *TINY_RUN, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"optbench: error: cannot write results to {out}"), lines
    assert ran == []


def test_missing_optional_library_is_a_skipped_record_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = OptimizerSpec.unavailable_reason

    def no_bitsandbytes(self):
        return "needs `pip install bitsandbytes`" if self.library.startswith("bitsandbytes") else real(self)

    monkeypatch.setattr(OptimizerSpec, "unavailable_reason", no_bitsandbytes)
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY_RUN, "--no-figures", "--optimizers", "adamw8bit,adafactor", "--out", str(out)]) == 0
    by_name = {r.optimizer: r for r in read_records(out)}
    assert by_name["adamw8bit"].status == "skipped" and "pip install bitsandbytes" in by_name["adamw8bit"].error
    assert by_name["adafactor"].status == "ok"


def test_write_failing_half_way_leaves_earlier_lines_and_no_torn_fragment(tmp_path, monkeypatch):
    out = tmp_path / "r.jsonl"
    append_record(out, Record(trial_id="a", optimizer="adamw", status="ok"))
    before = out.read_bytes()
    real_write_all = results._write_all

    def disk_full(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "_write_all", disk_full)
    with pytest.raises(ResultsWriteError, match="No space left on device; 0 trials recorded"):
        run_sweep([TrialSpec(optimizer="adamw", **TINY)], out,
                  run_trial=lambda spec: Record(trial_id=spec.trial_id, optimizer="adamw", status="ok"))
    assert out.read_bytes() == before  # the half-written line was cut back off

    monkeypatch.setattr(results, "_write_all", real_write_all)
    append_record(out, Record(trial_id="b", optimizer="adamw", status="ok"))
    assert [r.trial_id for r in read_records(out)] == ["a", "b"]  # no warning: nothing torn in between


def test_a_results_write_failure_exits_4_with_one_line_and_keeps_the_lines_written(tmp_path, monkeypatch, capsys):
    """The disk fills up on the second trial's line: the sweep stops with exit 4 (1 would read as a regression to
    a script or CI), one line on stderr says what to do, and the first trial's line stays in the file."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.jsonl"
    real_append, appended = runner.append_record, []

    def full_on_the_second_line(path, record, **kwargs):
        appended.append(record.seed)
        if len(appended) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(path, record, **kwargs)

    def fake_trial(spec):  # a result without figures to print: the harness is under test here, not the trial
        return Record(trial_id=spec.trial_id, optimizer=spec.optimizer, seed=spec.seed, status="oom", error="fake")

    monkeypatch.setattr(runner, "append_record", full_on_the_second_line)
    monkeypatch.setattr("optbench.sweep.LocalExecutor", lambda **_: FunctionExecutor(fake_trial))
    code = main(["run", *TINY_RUN, "--no-figures", "--optimizers", "adamw", "--seeds", "0,1", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == exits.WRITE_FAILED == 4
    assert [r.seed for r in read_records(out)] == [0]
    failures = [line for line in err.splitlines() if "error" in line]
    assert len(failures) == 1 and "Traceback" not in err, err
    assert failures[0].startswith("optbench: error: cannot append to") and "No space left on device" in failures[0]


def test_a_writer_killed_mid_line_does_not_corrupt_the_next_append(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"trial_id": "a", "optim')  # torn, no newline
    append_record(out, Record(trial_id="b", optimizer="adamw", status="ok"))
    with pytest.warns(UserWarning, match="unreadable line"):
        assert [r.trial_id for r in read_records(out)] == ["b"]


def test_a_run_killed_while_writing_its_first_record_resumes(tmp_path, capfd):
    """Its results file held one torn line, and rerunning (the README's way to resume) was refused: "not a results
    file". It reads as empty now, and the rerun appends the record on a line of its own."""
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps(Record(trial_id="x", optimizer="adamw", status="ok").to_dict())[:80])
    assert main(["run", *TINY_RUN, "--no-figures", "--optimizers", "adamw", "--out", str(out)]) == 0
    with pytest.warns(UserWarning, match="unreadable line"):
        assert [r.status for r in read_records(out)] == ["ok"]


@pytest.mark.parametrize("extra,code", [([], 3), (["--allow-errors"], 0)])
def test_a_trial_that_times_out_makes_run_exit_3_with_one_line_naming_it(tmp_path, capfd, extra, code):
    """`error` and `timeout` are harness or library failures: a script must be able to tell a broken run from a
    good one. `--allow-errors` restores exit 0; the record is written either way."""
    out = tmp_path / "r.jsonl"
    assert main(["run", *TINY_RUN, "--no-figures", "--optimizers", "adamw", "--timeout", "0.5", "--out", str(out),
                 *extra]) == code
    err = [line for line in capfd.readouterr().err.splitlines() if "error/timeout" in line]
    assert err == ([] if extra else ["optbench: 1 trial(s) ended error/timeout: adamw seed 0 (timeout); see the "
                                     "results file (--allow-errors: exit 0)"])
    assert [r.status for r in read_records(out)] == ["timeout"]


RANK = """
import os, subprocess, sys, time
from optbench.sweep.child import kill_groups_when_gone
launcher = int(sys.argv[1])
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # in the rank's group
print(helper.pid, flush=True)
kill_groups_when_gone([launcher], [os.getpgrp()])  # what rank_main does, torchrun's group aside
time.sleep(60)
"""


def test_a_rank_whose_launcher_is_gone_takes_its_process_group_down(tmp_path):
    """A torchrun rank runs in a session of its own: when torchrun dies (killed with the sweep's timeout, or by
    the OOM killer) the rank's watchdog must kill the rank and everything it started, not train on as an orphan."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(launcher.pid)], start_new_session=True,
                            stdout=subprocess.PIPE, text=True, env=ENV)
    helper = None
    try:
        helper = int(rank.stdout.readline())
        assert _alive(rank.pid) and _alive(helper)
        launcher.kill()
        launcher.wait()
        assert rank.wait(timeout=30) in (1, -signal.SIGKILL)  # the watchdog's kill, or its own exit after it
        deadline = time.monotonic() + 10
        while _alive(helper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(helper), "the rank's helper outlived the launcher"
    finally:
        for pid in (launcher.pid, rank.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        if helper is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(helper, signal.SIGKILL)
        rank.wait()
        launcher.wait()
