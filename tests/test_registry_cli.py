"""The registry on the command line: `list`, `--optimizers all` and `--optimizer-kwargs`."""

import pytest
from _tiny import optbench

from optbench import optimizers
from optbench.cli import main as cli
from optbench.job import planner
from optbench.job.spec import PRESETS


def test_list_shows_every_entry_with_alias_lr_range_install_and_availability(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(optimizers.REGISTRY) <= set(rows)
    for spec in optimizers.REGISTRY.values():
        row = rows[spec.name]
        assert (spec.hf_alias or "-") in row and spec.precision in row
        assert f"{spec.lr_range[0]:g}-{spec.lr_range[1]:g}" in row
        assert (f"optbench[{spec.extra}]" if spec.extra else "core") in row
        reason = spec.unavailable_reason()
        assert ("| yes" in row) if reason is None else (f"no: {reason}" in row)
    assert "adamw8bit vs adamw8bit_hf" in out


@pytest.fixture
def planned():
    """Parse an `optbench run` command line and hand back the trial specs the planner makes of it."""

    def plan(*args):
        parsed = cli.build_parser().parse_args(["run", "--workload", "tiny", "--device", "cpu", "--seeds", "0",
                                              *args])
        return planner.plan_run(vars(parsed), PRESETS[parsed.preset], parsed.optimizers, parsed.seeds).specs

    return plan


def test_optimizers_all_plans_every_available_entry(planned):
    specs = planned("--optimizers", "all")
    assert [s.optimizer for s in specs] == optimizers.available_names()
    assert "adam_mini" not in optimizers.available_names()  # unavailable entries are left out of `all`


def test_optimizer_kwargs_reach_their_trials_only_and_change_the_trial_id(planned):
    plain = {s.optimizer: s for s in planned("--optimizers", "adamw,adamw8bit")}
    tuned = {s.optimizer: s for s in planned("--optimizers", "adamw,adamw8bit", "--optimizer-kwargs",
                                             'adamw8bit={"betas": [0.9, 0.95]}')}
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
])
def test_malformed_optimizer_kwargs_are_a_usage_error(args, message, capsys):
    assert cli.main(["run", "--workload", "tiny", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("optbench: error:") and message in err[0]


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
    assert [r.getMessage() for r in caplog.records] == ["Failed to load the quantization config"]
