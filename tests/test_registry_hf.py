"""Every HF Trainer `optim` name builds here what Trainer builds for it: the same class, the same hyper-parameters for
every parameter (defaults, weight decay, GaLore/APOLLO groups), the same state dtypes after a step (bitsandbytes'
embedding override) and the same update, bit for bit. One table: transformers' `OptimizerNames`, each name either
checked against `Trainer.create_optimizer` (which calls `Trainer.get_optimizer_cls_and_kwargs`) or skipped with the
registry's reason it cannot run here."""

import copy
import importlib.util

import pytest
import torch
import transformers
from transformers.training_args import OptimizerNames

from optbench import optimizers
from optbench.optimizers.hf import HF_TARGET_MODULES
from optbench.probes.measure import optimizer_state_bytes
from tests._tiny import entry_step, skip_unavailable, tiny_bert_models

LR = 1e-3
HF_NAMES = [name.value for name in OptimizerNames]
# Group entries that are bookkeeping rather than settings: schedule-free's running sums, optimi's step counter.
VOLATILE = {"params", "train_mode", "weight_sum", "lr_max", "scheduled_lr", "k", "step", "setup", "state"}


@pytest.fixture(scope="module")
def tiny_bert():
    return tiny_bert_models([torch.float32])[torch.float32]


@pytest.fixture
def clean_global_manager():
    """The Trainer registers its 8-bit overrides with bitsandbytes' process-wide manager: start and end clean."""
    bnb = pytest.importorskip("bitsandbytes")
    bnb.optim.GlobalOptimManager._instance = None
    yield
    bnb.optim.GlobalOptimManager._instance = None


def _trainers_optimizer(name, model, tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, optim=name, learning_rate=LR,
                                          report_to=[], optim_target_modules=HF_TARGET_MODULES)
    optimizer = transformers.Trainer(model=model, args=args).create_optimizer()
    return optimizer, transformers.Trainer.get_optimizer_cls_and_kwargs(args, model)


def _parts(optimizer):
    """(parameter, the optimizer that updates it) for a plain optimizer, Trainer's layer-wise dummy (optimizer_dict)
    or optbench's combined/layer-wise ones (parts)."""
    if getattr(optimizer, "optimizer_dict", None):
        return list(optimizer.optimizer_dict.items())
    owners = getattr(optimizer, "parts", None) or [optimizer]
    return [(p, part) for part in owners for group in part.param_groups for p in group["params"]]


def _settings(value):
    return value.tolist() if isinstance(value, torch.Tensor) else value


def _by_name(optimizer, model):
    """name -> (class name, base classes, its group's settings) for every parameter the optimizer updates."""
    names = {id(p): n for n, p in model.named_parameters()}
    table = {}
    for param, part in _parts(optimizer):
        group = next(g for g in part.param_groups if any(p is param for p in g["params"]))
        settings = {k: _settings(v) for k, v in group.items() if k not in VOLATILE}
        table[names[id(param)]] = (type(part).__name__, type(part), settings)
    return table


def _state_dtypes(optimizer, model):
    """name -> {state key: dtype} after a step, wherever the optimizer keeps its state (GrokAdamW: in its groups)."""
    names = {id(p): n for n, p in model.named_parameters()}
    table = {}
    for param, part in _parts(optimizer):
        state = part.state.get(param) or next((g["state"][param] for g in part.param_groups
                                               if param in g.get("state", {})), {})
        table[names[id(param)]] = {k: v.dtype for k, v in state.items() if isinstance(v, torch.Tensor)
                                   and k != "projection"}
    return table


def _one_step(spec, model, optimizer):
    torch.manual_seed(0)  # the same dropout masks for both models
    if hasattr(optimizer, "train"):
        optimizer.train()  # schedule-free: Trainer switches it to train mode in its loop
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    entry_step(spec, optimizer, model(input_ids=ids, labels=torch.tensor([0, 1])).loss, LR)


# Where an entry deliberately differs from Trainer's build, with why (the entry's factory says it too): off the GPU,
# torch-optimi 0.3.3 decides Triton before it gathers the parameters and, with Triton installed, takes its Triton
# kernel for CPU tensors, which fails there; the entry turns Triton off on the CPU.
DEVIATIONS = {"stable_adamw": {"triton": False}}


@pytest.mark.parametrize("name", HF_NAMES)
def test_each_hf_name_builds_what_trainer_builds(name, tiny_bert, tmp_path, clean_global_manager, monkeypatch):
    spec = optimizers.resolve(name)
    skip_unavailable(spec)
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)  # torchao: the same update, eagerly
    theirs_model, ours_model = copy.deepcopy(tiny_bert), copy.deepcopy(tiny_bert)
    theirs, (theirs_cls, theirs_kwargs) = _trainers_optimizer(name, theirs_model, tmp_path)
    ours = spec.build_for(ours_model, lr=LR)

    theirs_table, ours_table = _by_name(theirs, theirs_model), _by_name(ours, ours_model)
    assert ours_table.keys() == theirs_table.keys()
    for param, (class_name, cls, settings) in theirs_table.items():
        assert ours_table[param][0] == class_name and issubclass(ours_table[param][1], cls), param
        deviation = {k: v for k, v in DEVIATIONS.get(name, {}).items() if k in settings}
        assert ours_table[param][2] == {**settings, **deviation}, param
    if name in DEVIATIONS and importlib.util.find_spec("triton") is not None:
        pytest.skip(f"Trainer's own {name} fails on CPU tensors where Triton is installed (the entry avoids it)")
    kwargs = {k: v for k, v in theirs_kwargs.items() if k not in ("params", "model", "optimizer_dict", "lr")}
    assert kwargs.items() <= {**spec.default_kwargs, **ours.defaults}.items() or not kwargs, (kwargs, ours.defaults)
    assert isinstance(theirs_cls, type)

    for model, optimizer in ((theirs_model, theirs), (ours_model, ours)):
        _one_step(spec, model, optimizer)
    assert _state_dtypes(ours, ours_model) == _state_dtypes(theirs, theirs_model)
    for (param, mine), (_, trainers) in zip(ours_model.named_parameters(), theirs_model.named_parameters(),
                                            strict=True):
        torch.testing.assert_close(mine, trainers, rtol=0, atol=0, msg=param)


def test_an_hf_8bit_name_keeps_embeddings_fp32_and_does_not_leak_into_the_pure_entry(tiny_bert, tmp_path,
                                                                                      clean_global_manager):
    theirs_model = copy.deepcopy(tiny_bert)
    theirs, _ = _trainers_optimizer("adamw_bnb_8bit", theirs_model, tmp_path)
    ours_model = copy.deepcopy(tiny_bert)
    ours = optimizers.resolve("adamw_bnb_8bit").build_for(ours_model, lr=LR)
    spec = optimizers.resolve("adamw")
    for model, optimizer in ((theirs_model, theirs), (ours_model, ours)):
        _one_step(spec, model, optimizer)
    assert optimizer_state_bytes(ours) == optimizer_state_bytes(theirs)
    assert optimizer_state_bytes(ours)[0] == optimizers.resolve("adamw8bit_hf").analytic_for(ours_model).state_bytes
    # The Trainer's override sits in the global manager; the pure entry built afterwards ignores it.
    pure = optimizers.resolve("adamw8bit").build_for(theirs_model)
    _one_step(spec, theirs_model, pure)
    assert pure.state[theirs_model.bert.embeddings.word_embeddings.weight]["state1"].dtype == torch.uint8


@pytest.mark.parametrize("workload", ["tiny", "lm"])
def test_trainer_groups_are_trainers_decay_split(workload):
    from optbench.job.spec import TrialSpec
    from optbench.optimizers.base import describe_model
    from optbench.optimizers.hf import trainer_groups
    from optbench.workloads import get_workload

    model = get_workload(workload).build(TrialSpec(optimizer="adamw", workload=workload, steps=2, warmup_steps=0,
                                                   batch_size=2, seq_len=8, eval_size=8)).model
    decay = set(transformers.Trainer.get_decay_parameter_names(None, model))
    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names[id(p)] for p in group["params"]] for group in trainer_groups(describe_model(model))]
    assert groups == [[n for n, _ in model.named_parameters() if n in decay],
                      [n for n, _ in model.named_parameters() if n not in decay]]
