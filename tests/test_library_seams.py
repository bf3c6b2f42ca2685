"""Every private name optbench uses in a library, checked against the installed version: when a library renames or
reshapes one, this file fails and names the seam and the optbench code that relies on it (rather than a trial
failing later with an AttributeError, or worse, measuring something else without a word).

The seams, and why no public API does the job:
- transformers `Trainer._save_checkpoint(model, trial)`: the Trainer resume check saves its checkpoint through
  Trainer's own code at one step (trial/engines/trainer.py, `WorkloadTrainer`).
- transformers `TrainingArguments._setup_devices` (a cached property) and `_n_gpu`: a trial's Trainer is pinned
  to the trial's one GPU and never wraps the model in DataParallel (trial/engines/trainer.py, `pin_device`).
- torch `GradScaler._found_inf_per_device(optimizer)`: the inf/NaN check read before the optimizer-step mark, so
  optimizer.step() is timed alone under fp16 (trial/precision.py, `unscale_and_check`).
- argparse `ArgumentParser._actions`: `nightly` hands `optbench run` the job flags that differ from their defaults,
  read from the parser's own actions (cli/options.py, `job_argv`).
- torch `torch.optim._muon._zeropower_via_newtonschulz(grad, ns_coefficients, ns_steps, eps)`: `muon_torch` runs
  torch's Muon with its Newton-Schulz iteration in fp32 on the CPU, swapped in for the step (optimizers/torch_optim.py).
- torch's LR schedulers mark the optimizer step they wrap with `_wrapped_by_lr_sched`: the slowdown knob keeps the
  mark on the step it wraps, or the scheduler warns that `optimizer.step()` never ran (probes/slowdown.py).
- transformers `PretrainedConfig._attn_implementation` (eager or SDPA attention: whether backward keeps the attention
  probabilities, memory/predict.py) and `_name_or_path` (the model a user's Trainer run names, trial/callback.py).
Former seams now on public API: DTensor's local shard (`to_local()`, trial/engines/parallel.py) and tqdm's lock
(`tqdm.set_lock`, sweep/child.py).
"""

from __future__ import annotations

import argparse
import functools
import inspect

import torch
from transformers import Trainer, TrainingArguments

from optbench.cli.options import Parser, add_job_arguments


def test_trainer_save_checkpoint_takes_model_and_trial_and_trainer_calls_it():
    seam = "transformers Trainer._save_checkpoint(model, trial), overridden by trial/engines/trainer.py"
    assert hasattr(Trainer, "_save_checkpoint"), f"{seam}: gone"
    assert list(inspect.signature(Trainer._save_checkpoint).parameters) == ["self", "model", "trial"], \
        f"{seam}: its parameters changed to {inspect.signature(Trainer._save_checkpoint)}"
    assert "self._save_checkpoint(" in inspect.getsource(Trainer), f"{seam}: Trainer no longer calls it"


def test_training_arguments_cache_their_device_and_count_gpus_in_n_gpu(tmp_path):
    seam = "transformers TrainingArguments._setup_devices / _n_gpu, set by trial/engines/trainer.pin_device"
    assert isinstance(inspect.getattr_static(TrainingArguments, "_setup_devices", None), functools.cached_property), \
        f"{seam}: _setup_devices is no longer a functools.cached_property"
    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[])
    args.__dict__["_setup_devices"] = torch.device("cpu")  # what pin_device writes (a GPU there)
    assert args.device == torch.device("cpu"), f"{seam}: `device` no longer reads _setup_devices"
    args._n_gpu = 1
    assert args.n_gpu == 1, f"{seam}: `n_gpu` no longer reads _n_gpu"


def test_grad_scaler_reports_its_inf_check_per_device_after_unscale():
    seam = "torch GradScaler._found_inf_per_device(optimizer), read by trial/precision.unscale_and_check"
    assert hasattr(torch.amp.GradScaler, "_found_inf_per_device"), f"{seam}: gone"
    assert list(inspect.signature(torch.amp.GradScaler._found_inf_per_device).parameters) == ["self", "optimizer"], \
        f"{seam}: its parameters changed"
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(optimizer)
    found = scaler._found_inf_per_device(optimizer)
    assert isinstance(found, dict) and found and all(isinstance(flag, torch.Tensor) for flag in found.values()), \
        f"{seam}: no longer a dict of one flag tensor per device after unscale_ ({found!r})"
    assert not any(flag.item() for flag in found.values()), f"{seam}: finite gradients read as inf/NaN"


def test_argparse_keeps_every_added_action_in_actions():
    seam = "argparse ArgumentParser._actions, read by cli/options.job_argv"
    parser = Parser()
    add_job_arguments(parser)
    actions = getattr(parser, "_actions", None)
    assert isinstance(actions, list), f"{seam}: gone"
    flags = {flag for action in actions for flag in action.option_strings}
    assert {"--steps", "--device", "--jobs", "--max-memory"} <= flags, f"{seam}: the job flags are not all there"
    for action in actions:
        assert isinstance(action, argparse.Action) and all(
            hasattr(action, name) for name in ("option_strings", "dest", "default", "nargs", "type")), \
            f"{seam}: an action lost one of option_strings, dest, default, nargs, type"


def test_torch_muon_orthogonalises_through_the_function_muon_torch_swaps():
    seam = "torch.optim._muon._zeropower_via_newtonschulz, swapped for fp32 by optimizers/torch_optim.py (muon_torch)"
    from torch.optim import _muon

    function = getattr(_muon, "_zeropower_via_newtonschulz", None)
    assert callable(function), f"{seam}: gone"
    assert list(inspect.signature(function).parameters)[:1] == ["grad"], f"{seam}: {inspect.signature(function)}"
    assert "_zeropower_via_newtonschulz(" in inspect.getsource(_muon.Muon.step) + inspect.getsource(_muon), \
        f"{seam}: Muon no longer calls it"
    from optbench import optimizers

    model = torch.nn.Linear(8, 8, bias=False)
    optimizer = optimizers.resolve("muon_torch").build(list(model.parameters()), lr=0.02)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()  # the swapped function ran, and torch's own is back in place
    assert _muon._zeropower_via_newtonschulz is function, f"{seam}: the swap was not undone"


def test_lr_schedulers_mark_the_step_they_wrap_and_accept_a_marked_replacement(monkeypatch):
    seam = "torch LR scheduler's `_wrapped_by_lr_sched` mark on optimizer.step, kept by probes/slowdown.py"
    import warnings

    from optbench.probes import slowdown

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    assert getattr(optimizer.step, "_wrapped_by_lr_sched", False), f"{seam}: schedulers no longer mark the step"
    monkeypatch.setenv(slowdown.SLOWDOWN_ENV, "0.01")
    slowdown.slow_down_if_asked(optimizer)
    assert getattr(optimizer.step, "_wrapped_by_lr_sched", False), f"{seam}: the knob's step lost the mark"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Detected call of lr_scheduler.step() before optimizer.step()"
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()


def test_hf_configs_name_their_attention_kernel_and_their_source():
    seam = "transformers PretrainedConfig._attn_implementation / _name_or_path, read by memory/predict.py and " \
           "trial/callback.py"
    from transformers import BertConfig

    config = BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=1, intermediate_size=64)
    assert getattr(config, "_attn_implementation", None) in {"eager", "sdpa", None}, f"{seam}: {config}"
    assert hasattr(config, "_name_or_path"), f"{seam}: _name_or_path gone"
