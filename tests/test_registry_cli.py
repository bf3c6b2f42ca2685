"""The registry on the command line: `list`, `--optimizers all` and `--optimizer-kwargs`."""

import csv
import io
import re

import pytest
from _tiny import optbench

from optbench import optimizers
from optbench.cli import main as cli
from optbench.job import planner
from optbench.job.spec import PRESETS


def test_list_fits_120_columns_and_names_each_reason_below_the_table(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    rows = {line.split()[0]: line for line in out.splitlines()[2:2 + len(optimizers.REGISTRY)]}
    assert list(rows) == list(optimizers.REGISTRY)
    below = out[out.index("why not here:"):]
    for spec in optimizers.REGISTRY.values():
        row, reason = rows[spec.name], spec.unavailable_reason()
        assert row.endswith(" yes") if reason is None else re.search(r" no \[(\d+)\]$", row)
        if reason is not None:
            number = re.search(r" no \[(\d+)\]$", row).group(1)
            assert " ".join(below.split()).count(f"[{number}] {reason}") == 1
    assert "HF Trainer optim names (transformers" in out and "adamw8bit vs adamw8bit_hf" in out


def test_list_markdown_and_csv_hold_every_column_of_every_entry(capsys):
    assert cli.main(["list", "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [row["optimizer"] for row in table] == list(optimizers.REGISTRY)
    for row in table:
        spec = optimizers.REGISTRY[row["optimizer"]]
        assert (row["hf_optim"], row["precision"], row["why_not_here"]) == (
            spec.hf_alias, spec.precision, spec.unavailable_reason() or "")
        assert row["lr_range"] == f"{spec.lr_range[0]:g} to {spec.lr_range[1]:g}"  # a dash read as a minus
        assert row["install"] == (f"optbench[{spec.extra}]" if spec.extra else "core")
    assert cli.main(["list", "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| optimizer") and len(lines) == 2 + len(optimizers.REGISTRY)


@pytest.fixture
def planned():
    """Parse an `optbench run` command line and hand back the trial specs the planner makes of it."""

    def plan(*args):
        parsed = cli.build_parser().parse_args(["run", "--workload", "tiny", "--device", "cpu", "--seeds", "0",
                                              *args])
        return planner.plan_run(vars(parsed), PRESETS[parsed.preset], parsed.optimizers, parsed.seeds)

    return plan


def test_optimizers_all_plans_every_available_entry_and_skips_what_the_loop_cannot_train(planned):
    plan = planned("--optimizers", "all")
    runnable = [name for name in optimizers.available_names() if optimizers.resolve(name).runs_under("native") is None]
    assert [s.optimizer for s in plan.specs] == runnable
    assert "adam_mini" not in optimizers.available_names()  # unavailable entries are left out of `all`
    assert [(s.optimizer, why) for s, why in plan.unavailable] == [
        ("lomo", "lomo updates the weights inside Trainer's backward (fused_backward: SGD applied in each parameter's "
                 "gradient hook): run it with --engine trainer, single-process")]


def test_optimizer_kwargs_reach_their_trials_only_and_change_the_trial_id(planned):
    plain = {s.optimizer: s for s in planned("--optimizers", "adamw,adamw8bit").specs}
    tuned = {s.optimizer: s for s in planned("--optimizers", "adamw,adamw8bit", "--optimizer-kwargs",
                                             'adamw8bit={"betas": [0.9, 0.95]}').specs}
    assert tuned["adamw8bit"].optimizer_kwargs == {"betas": (0.9, 0.95)}
    assert tuned["adamw"].optimizer_kwargs == {}
    assert tuned["adamw8bit"].trial_id != plain["adamw8bit"].trial_id
    assert tuned["adamw"].trial_id == plain["adamw"].trial_id


@pytest.mark.parametrize("args,message", [
    (["--optimizer-kwargs", "adamw"], "NAME="),
    (["--optimizer-kwargs", "adamw={'lr': 1}"], "not valid JSON"),
    (["--optimizer-kwargs", "adamw=3"], "JSON object"),
    (["--optimizer-kwargs", 'nosuch={"a": 1}'], "unknown optimizer 'nosuch'"),
    (["--optimizers", "adamw", "--optimizer-kwargs", 'lion={"betas": [0.9, 0.99]}'], "does not run"),
    # an lr among the kwargs failed every trial's build ("multiple values for keyword argument 'lr'")
    (["--optimizer-kwargs", 'adamw={"lr": 0.5}'], 'give the learning rate with --lr, not as "lr"'),
    # NaN and Infinity, which Python's json reads: NaN ran and the record said null
    (["--optimizer-kwargs", 'adamw={"weight_decay": NaN}'], "for adamw: NaN: a setting must be a finite number"),
    (["--optimizer-kwargs", 'adamw={"betas": [0.9, -Infinity]}'], "-Infinity: a setting must be a finite number"),
    # a keyword or a value the library refuses failed every trial of the sweep, each after loading the model
    (["--optimizers", "sgd", "--optimizer-kwargs", 'sgd={"nosuch": 1}'], "unexpected keyword argument 'nosuch'"),
    (["--optimizers", "sgd", "--optimizer-kwargs", 'sgd={"momentum": -5}'], "Invalid momentum value: -5"),
    (["--optimizer-kwargs", 'adafactor={"nosuch": 1}'], 'for adafactor: {"nosuch": 1} does not build it'),
    # a value the constructor takes and the step does not: every trial failed at its second step
    (["--optimizers", "sgd_momentum", "--optimizer-kwargs", 'sgd_momentum={"dampening": "0.1"}'],
     'for sgd_momentum: {"dampening": "0.1"} does not step it: unsupported operand type'),
])
def test_malformed_optimizer_kwargs_are_a_usage_error(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a kwargs check that let one through would write its sweep
    assert cli.main(["run", "--workload", "tiny", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("optbench: error:") and message in err[0]


def test_kwargs_are_refused_only_when_the_defaults_build_and_the_kwargs_do_not(monkeypatch):
    """The check builds the entry over a small probe model: an entry that cannot be built over the probe at all
    says nothing about the user's kwargs, so they pass to the trials (which build over the real model)."""
    assert optimizers.kwargs_refusal("adamw", {"betas": (0.9, 0.95)}) is None
    assert "unexpected keyword argument" in optimizers.kwargs_refusal("adamw", {"nosuch": 1})
    spec = optimizers.resolve("adamw")

    def probe_unsuitable(*_, **__):
        raise RuntimeError("needs a model with attention layers")

    monkeypatch.setattr(type(spec), "build_for", probe_unsuitable)
    assert optimizers.kwargs_refusal("adamw", {"nosuch": 1}) is None


def test_a_step_the_probe_cannot_take_even_without_the_kwargs_refuses_nothing(monkeypatch):
    """An entry whose step fails over the probe model with its own defaults (a step that needs what a trial sets
    up) says nothing about the kwargs at step time; their build is still checked."""
    import torch

    class NeedsTrialSetUp(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("call .train() first")

    spec = optimizers.resolve("sgd_momentum")
    monkeypatch.setattr(type(spec), "build_for", lambda self, model, **kw: NeedsTrialSetUp(
        model.parameters(), lr=0.1, **{"momentum": 0.9, **kw}))
    assert optimizers.kwargs_refusal("sgd_momentum", {"dampening": "0.1"}) is None
    assert "Invalid momentum value" in optimizers.kwargs_refusal("sgd_momentum", {"momentum": -5})


def test_sound_kwargs_are_built_once_and_refused_ones_twice(monkeypatch):
    """The check runs before every sweep: sound kwargs cost one build over the probe, and only a failure builds the
    entry again without them (to tell the kwargs' fault from the probe's)."""
    spec = optimizers.resolve("adamw")
    builds = []
    real = type(spec).build_for
    monkeypatch.setattr(type(spec), "build_for", lambda self, model, **kw: builds.append(kw) or real(self, model, **kw))
    assert optimizers.kwargs_refusal("adamw", {"betas": (0.9, 0.95)}) is None
    assert builds == [{"betas": (0.9, 0.95)}]
    builds.clear()
    assert optimizers.kwargs_refusal("adamw", {"nosuch": 1}) is not None
    assert builds == [{"nosuch": 1}, {}]


def test_explain_opens_with_the_answer_not_with_library_noise():
    """transformers imports torchao, whose import logs notices about kernels optbench never uses (and torch a
    deprecation about torchao's enums): a fresh `explain` prints its answer first and nothing on stderr."""
    done = optbench("explain", "adamw_bnb_8bit")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines()[0].startswith("adamw8bit_hf on all-MiniLM-L6-v2")


def test_only_the_known_messages_are_filtered(caplog):
    import logging

    from optbench.optimizers.noise import filter_known_noise

    filter_known_noise()
    torchao = logging.getLogger("torchao")
    with caplog.at_level(logging.WARNING):
        torchao.warning("Failed to load /venv/lib/site-packages/torchao/_C_mxfp8.cpython-311-x86_64-linux-gnu.so: x")
        torchao.warning("Failed to load the quantization config")  # not one of the kernel libraries: kept
        logging.getLogger("torch.utils._pytree").warning(
            "%s is an Enum subclass and is now natively supported by torch.compile as an opaque value type.",
            "<enum 'KernelPreference'>")
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already `pip "
            "install kernels` and the kernels >= 0.11.1", "No module named 'kernels'")
    assert [r.getMessage() for r in caplog.records] == ["Failed to load the quantization config"]


def test_an_update_inside_backward_is_skipped_under_parallel_and_lomo_runs_under_trainer(planned):
    plan = planned("--optimizers", "galore_adamw_layerwise,lomo", "--parallel", "ddp")
    reasons = {spec.optimizer: why for spec, why in plan.unavailable}
    assert not plan.specs and "single-process only" in reasons["galore_adamw_layerwise"]
    assert "--engine trainer" in reasons["lomo"]
    assert [s.optimizer for s in planned("--optimizers", "lomo,galore_adamw_layerwise", "--engine", "trainer").specs] \
        == ["lomo", "galore_adamw_layerwise"]
