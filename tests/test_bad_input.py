"""Bad input across the commands: exit 2, exactly one line on stderr saying what to do, no traceback,
and no results file started. Runs `main()` in this process (fd-level capture, so library prints count)."""

import json
import shutil

import pytest
from _tiny import TINY_ARGS

from optbench.__main__ import main
from optbench.records.record import Record, append_record


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "malformed.jsonl").write_text('{"trial_id": "a", "optimizer": \n[1, 2\n')
    append_record(tmp_path / "good.jsonl", Record(trial_id="a", optimizer="adamw", status="ok", workload="tiny"))
    (tmp_path / "empty.csv").write_text("text,label\n")
    (tmp_path / "zero-bytes.csv").write_text("")
    (tmp_path / "reviews.csv").write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(40)))
    (tmp_path / "latin-1.csv").write_bytes("text,label\nd\xe9j\xe0 vu,1\n".encode("latin-1"))
    (tmp_path / "one-class.csv").write_text("text,label\n" + "".join(f"review {i},1\n" for i in range(40)))
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("weights live elsewhere")
    bert = {"model_type": "bert", "vocab_size": 100, "num_hidden_layers": 1, "intermediate_size": 16,
            "num_attention_heads": 2}
    for name, hidden in {"no-weights": 8, "unbuildable": 7}.items():  # 7: not a multiple of the heads
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({**bert, "hidden_size": hidden}))
    (tmp_path / "unbuildable" / "model.safetensors").write_text("")
    return tmp_path


RUN = ["run", *TINY_ARGS, "--out", "r.jsonl"]  # the tiny CPU job: a case's flags come after (and win)
STUDY = ["study", *TINY_ARGS, "--out", "r.jsonl"]
FIT = ["fit", "--memory", "1GiB", "--workload", "tiny", "--device", "cpu", "--optimizers", "adamw", "--out", "r.jsonl"]
NIGHT = ["nightly", "--baseline", "b", "--out", "o", "--device", "cpu", "--preset", "smoke"]

CASES = [
    # run: numbers that are zero, negative, not numbers or infinite
    (RUN + ["--jobs", "0"], "--jobs: must be positive"),
    (RUN + ["--jobs", "two"], "--jobs: expected a whole number"),
    (RUN + ["--threads", "0"], "--threads: must be positive"),
    (RUN + ["--max-memory", "0GiB"], "--max-memory: the memory size must be at least 1 byte"),
    (RUN + ["--max-memory", "12"], "--max-memory: expected a memory size with a unit"),
    (RUN + ["--timeout", "inf"], "--timeout: must be a positive finite number"),
    (RUN + ["--timeout", "-5"], "--timeout: must be a positive finite number"),
    (RUN + ["--lr", "0"], "--lr: must be a positive finite number"),
    (RUN + ["--eval-size", "-1"], "--eval-size: must be positive"),
    # seeds some generator a trial seeds refuses (torch past int64, numpy via HF's set_seed past 2**32)
    (RUN + ["--seeds", "0,99999999999999999999"], "--seeds: seeds are whole numbers from 0 to 4294967295"),
    (RUN + ["--seeds=-1"], "got -1"),
    # a time-to-target threshold the metric cannot be timed to: reached before any step, or never
    (RUN + ["--target", "2"], "--target 2 is no accuracy a trial can be timed to: give one above 0 and at most 1"),
    (RUN + ["--target", "0"], "give one above 0 and at most 1"),
    (RUN + ["--workload", "lm", "--target", "0.5"], "--target 0.5 is no perplexity a trial can be timed to"),
    (RUN + ["--executor", "kubernetes"], "--executor: invalid choice"),
    (RUN + ["--executor", "slurm"], "are you indeed on a slurm cluster? (use --executor local)"),
    # run: a model path that is not a model, datasets with no rows or one class, a GPU that is not there
    (RUN + ["--model", "not-a-model"], "not-a-model"),
    (RUN + ["--dataset", "empty.csv"], "cannot read dataset file empty.csv"),
    # a file datasets cannot read: the reader's fault, not datasets' "An error occurred while generating the dataset"
    (RUN + ["--dataset", "zero-bytes.csv"], "cannot read dataset file zero-bytes.csv: it is empty (not even a header"),
    (RUN + ["--dataset", "latin-1.csv"], "latin-1.csv: it is not UTF-8 text (it holds byte 0xe9); save it as UTF-8"),
    (RUN + ["--dataset", "one-class.csv"], "has a single class in 'label'"),
    # a width BERT cannot build (the rule read "<= 32 or a multiple of 32, got -5", which -5 is)
    (RUN + ["--workload-option", "hidden_size=-5"], "hidden_size must be a positive whole number, at most 32 or a"),
    # text that str.isdigit passes and int() does not read ("--5", "²") raised ValueError, a traceback
    (RUN + ["--workload-option", "hidden_size=--5"], "hidden_size must be a positive whole number"),
    (RUN + ["--workload-option", "hidden_size=²"], "hidden_size must be a positive whole number"),
    # the text given as labels: one column as both, or a column of text as the classes
    (RUN + ["--dataset", "reviews.csv", "--label-column", "text"], "--label-column text is the --text-column too"),
    (RUN + ["--dataset", "reviews.csv", "--text-column", "label", "--label-column", "text"],
     "'text' in reviews.csv has 40 distinct values in 40 rows: text, not classes"),
    # a batch larger than the training rows it is drawn from (it would be cut to them, and its samples/s overstated)
    (RUN + ["--batch-size", "100000"], "--batch-size 100000 is more than the 3600 training rows this job has"),
    (RUN + ["--workload", "lm", "--batch-size", "100000"], "use --batch-size 14746 or less"),  # blocks of 16
    # a sequence longer than the model's positions (padded to it, 100000 tokens a row exhausts the machine's memory)
    (RUN + ["--seq-len", "100000"], "--seq-len 100000 is more than the 512 positions tiny-bert-h64 has"),
    (RUN + ["--workload", "minilm", "--seq-len", "513"], "use --seq-len 512 or less"),
    (RUN + ["--device", "cuda"], "sees no CUDA device (use --device cpu)"),
    (RUN + ["--device", "tpu"], "unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
    # report / compare: malformed JSON where results are read
    (["report", "malformed.jsonl"], "malformed.jsonl:1: not a JSON line"),
    (["report", "good.jsonl", "--format", "xml"], "--format: invalid choice"),
    (["compare", "malformed.jsonl", "good.jsonl"], "malformed.jsonl:1: not a JSON line"),
    (["compare", "empty-folder", "good.jsonl"], "no results files (*.jsonl) in it and no pytest-benchmark JSON"),
    (["report", "empty-folder"], "nothing to read under empty-folder"),
    (["compare", "good.jsonl", "good.jsonl", "--max-slowdown", "-5"], "must be a finite number >= 0"),
    (["compare", "good.jsonl", "good.jsonl", "--max-memory-growth", "inf"], "must be a finite number >= 0"),
    # estimate
    (["estimate", "--params", "0"], "the parameter count must be at least 1"),
    (["estimate", "--params=-7B"], "expected a positive parameter count"),
    (["estimate", "--params", "7B", "--gpu-memory", "infGiB"], "expected a memory size with a unit"),
    (["estimate", "--model", "not-a-model"], "cannot read the config of model 'not-a-model'"),
    (["estimate", "--params", "7B", "--optimizers", "adamw,nope"], "unknown optimizer 'nope'"),
    (["recommend", "--params", "7B", "--gpu-memory", "24GiB", "--optimizers", "nope"], "unknown optimizer 'nope'"),
    (["recommend", "--params", "7B", "--gpu-memory", "24GiB", "--num-labels", "3"], "--num-labels needs --model"),
    # recommend
    (["recommend", "--params", "7B"], "the following arguments are required: --gpu-memory"),
    (["recommend", "--params", "7B", "--gpu-memory", "0GiB"], "the memory size must be at least 1 byte"),
    (["recommend", "--params", "7B", "--gpu-memory=-1GiB"], "the memory size must be at least 1 byte, got '-1GiB'"),
    # With a space too: a value starting with "-" and a digit is a value, not an unknown flag.
    (["recommend", "--params", "7B", "--gpu-memory", "-1GiB"], "the memory size must be at least 1 byte, got '-1GiB'"),
    (["fit", "--memory", "-1.5GiB"], "the memory size must be at least 1 byte, got '-1.5GiB'"),
    (["recommend", "--params", "seven", "--gpu-memory", "24GiB"], "expected a positive parameter count"),
    (["recommend", "--params", "7B", "--gpu-memory", "24GiB", "--results", "malformed.jsonl"],
     "malformed.jsonl:1: not a JSON line"),
    (["recommend", "--model", "not-a-model", "--gpu-memory", "24GiB"], "cannot read the config of model"),
    (["recommend", "--params", "7B", "--gpu-memory", "24GiB", "--precision", "fp8"], "--precision: invalid choice"),
    # study: optimizers, grids and searches that do not exist, a dataset with no rows
    (STUDY + ["--optimizers", "adamw,nosuch"], "unknown optimizer 'nosuch'"),
    (STUDY + ["--lr-grid", "1e-4,0"], "--lr-grid: must be a positive finite number"),
    (STUDY + ["--lr-grid", "1e-3", "--lr", "1e-4"], "--lr and --lr-grid both given"),
    (STUDY + ["--tune-seeds", "x"], "--tune-seeds: expected comma-separated integers"),
    (STUDY + ["--tune-seeds", "4294967296"], "--tune-seeds: seeds are whole numbers from 0 to 4294967295"),
    (STUDY + ["--tune-search", "random"], "--tune-search: invalid choice"),
    (STUDY + ["--dataset", "empty.csv"], "cannot read dataset file empty.csv"),
    # fit: a budget, a model, a workload or a device that cannot be used, before any probe runs
    (FIT + ["--memory", "0GiB"], "--memory: the memory size must be at least 1 byte"),
    (FIT[:1] + FIT[3:], "the following arguments are required: --memory"),
    (FIT + ["--grow", "width"], "--grow: invalid choice"),
    (FIT + ["--max-size", "0"], "--max-size: must be positive"),
    (FIT + ["--model", "not-a-model"], "not-a-model"),
    (FIT + ["--workload", "nosuch"], "unknown workload 'nosuch'; known: minilm"),
    (FIT + ["--device", "tpu"], "unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
    (FIT + ["--repeats", "1"], "--repeats 1: fit needs at least two trials per size"),
    # sequences past the model's positions: every probe there would end `error` (six trials learning nothing)
    (FIT + ["--grow", "seq", "--max-size", "2000"], "--max-size 2000 is more than the 512 positions tiny-bert-h64"),
    (FIT + ["--seq-len", "600"], "--seq-len 600 is more than the 512 positions tiny-bert-h64 has"),
    # nightly: a missing baseline flag, a preset or optimizer that does not exist, not run from the repository
    (NIGHT[:1] + NIGHT[3:], "nightly needs --baseline"),
    (["nightly"], "nightly needs --baseline and --out"),  # was: no CUDA device, on a CPU machine
    (NIGHT + ["--preset", "huge"], "--preset: invalid choice"),
    (NIGHT + ["--optimizers", "nosuch"], "unknown optimizer 'nosuch'"),
    (NIGHT, "no benchmarks/ here: run `optbench nightly` from the repository root"),
    # explain: an optimizer, a workload or a model that does not exist
    (["explain", "nosuch"], "unknown optimizer 'nosuch'; known: adamw"),
    (["explain", "adamw", "--workload", "nosuch"], "unknown workload 'nosuch'; known: minilm"),
    (["explain", "adamw", "--model", "not-a-model"], "cannot read the config of model 'not-a-model'"),
    # --workload custom without --model: it trained (or explained) the default model under another name
    (RUN + ["--workload", "custom"], "--workload custom needs --model (a local folder or a cached hub id)"),
    # --resume-check of a one-step job: its resume half was empty and the record said "error: IndexError"
    (RUN + ["--steps", "1", "--warmup-steps", "0", "--resume-check"], "--resume-check saves at the middle step"),
    # --out naming a file that is not a results file: the resume read ended run and study in a traceback
    (RUN + ["--out", "malformed.jsonl"], "--out malformed.jsonl is not a results file (line 1: not a JSON line"),
    (RUN + ["--out", "latin-1.csv"], "--out latin-1.csv is not a results file (not UTF-8 text (byte 12"),
    (STUDY + ["--out", "empty.csv"], "--out empty.csv is not a results file (line 1: not a JSON line"),
    # a user's model folder that has no weights, or a config transformers cannot build: every trial ended `error`
    (RUN + ["--workload", "custom", "--model", "no-weights"], "model folder no-weights has no weights (model."),
    (RUN + ["--workload", "custom", "--model", "unbuildable"], "cannot build model 'unbuildable' from its config"),
    (FIT + ["--workload", "custom"], "--workload custom needs --model"),
    # fit's --out: another tool's file ended fit in a traceback after its probes; a folder in "free space" (exit 4)
    (FIT + ["--out", "malformed.jsonl"], "--out malformed.jsonl is not a results file (line 1: not a JSON line"),
    (FIT + ["--out", "empty-folder"], "cannot write results to empty-folder: it is a folder"),
    (["explain", "adamw", "--workload", "custom"], "--workload custom needs --model"),
    # list takes nothing
    (["list", "--all"], "unrecognized arguments: --all"),
    # calibrate-bandwidth: a device that does not exist, no passes
    (["calibrate-bandwidth", "--device", "tpu"], "unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
    (["calibrate-bandwidth", "--passes", "0"], "--passes: must be positive"),
]


def _case_id(argv: list[str]) -> str:
    """The command and the flags a case adds to its base job."""
    extra = argv[argv.index("r.jsonl") + 1:] if "r.jsonl" in argv else argv[1:]
    return " ".join([argv[0], *extra])


@pytest.mark.parametrize("argv,message", CASES, ids=[_case_id(argv) for argv, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_no_results_file(files, capfd, argv, message):
    if argv[:1] == ["run"] and argv[-2:] == ["--device", "cuda"]:
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: --device cuda is not bad input here")
    if "slurm" in argv and shutil.which("srun"):
        pytest.skip("this machine has slurm: --executor slurm is not bad input here")
    code = main(argv)
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("optbench: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (files / "r.jsonl").exists()


def test_every_command_of_the_cli_has_its_bad_inputs_in_the_table():
    """A command added to the command line without bad-input cases fails here."""
    from optbench.cli.main import COMMANDS

    assert {argv[0] for argv, _ in CASES} == set(COMMANDS)


@pytest.mark.parametrize("missing, said", [("torch", "torch is not installed"),
                                           ("transformers.models", "transformers is")])
def test_a_required_library_missing_is_one_line_exit_2_not_a_traceback(monkeypatch, capfd, missing, said):
    from optbench.cli import main as cli_main

    def fails(args):
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)

    monkeypatch.setitem(cli_main.COMMANDS, "list", fails)
    assert main(["list"]) == 2
    err = capfd.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_optional_library_missing_inside_a_command_is_not_hidden_as_a_set_up_error(monkeypatch):
    from optbench.cli import main as cli_main

    def fails(args):
        raise ModuleNotFoundError("No module named 'torchao'", name="torchao")

    monkeypatch.setitem(cli_main.COMMANDS, "list", fails)
    with pytest.raises(ModuleNotFoundError):
        main(["list"])


def test_a_hub_model_on_a_machine_without_the_hub_fails_at_once_from_the_cache_alone(files, capfd, monkeypatch):
    """Offline, an uncached hub id took 26 s and eleven lines of the hub client's retry warnings before its one
    line: with the hub unreachable the config is read from the local cache only, and the line says so."""
    import socket

    import transformers
    from huggingface_hub import constants

    asked: list[bool] = []

    def from_pretrained(source, local_files_only=False, **kwargs):
        asked.append(local_files_only)
        raise OSError(f"{source} is not cached")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests' own offline switch aside
    monkeypatch.setattr(socket, "create_connection",
                        lambda *a, **k: (_ for _ in ()).throw(OSError("Name or service not known")))
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    code = main([*RUN, "--model", "someorg/not-cached"])
    lines = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert "the hub cannot be reached" in lines[0] and "--workload minilm" in lines[0]
    assert asked == [True]  # the cache alone: never the hub client's retries


def test_the_hub_counts_as_reachable_only_when_it_takes_a_connection(monkeypatch):
    import socket
    from contextlib import nullcontext

    from huggingface_hub import constants

    from optbench.workloads.base import hub_reachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: nullcontext())
    assert hub_reachable()
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(TimeoutError()))
    assert not hub_reachable()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: nullcontext())
    assert not hub_reachable()  # HF_HUB_OFFLINE: the user said no network


@pytest.mark.parametrize("count", ["²", "-1", "a100:²"])
def test_a_gpu_count_int_cannot_read_is_refused_as_it_is_parsed(files, capfd, count):
    """'²' passed str.isdigit and reached int() when the Slurm options were built: a ValueError traceback. Parsed
    here, before any cluster is asked, so it holds with or without one."""
    assert main(RUN + ["--executor", "slurm", "--gpus-per-trial", count]) == 2
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "expected a GPU count" in lines[0], lines
