"""The table: every entry by name, name and alias look-up, and per-optimizer kwargs from the command line."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from typing import Any

from optbench.optimizers.base import OptimizerSpec, UnknownOptimizerError
from optbench.optimizers.bnb import BNB_ENTRIES
from optbench.optimizers.extras import EXTRA_ENTRIES
from optbench.optimizers.low_rank import LOW_RANK_ENTRIES
from optbench.optimizers.torch_optim import TORCH_ENTRIES
from optbench.optimizers.torchao_optim import TORCHAO_ENTRIES
from optbench.optimizers.transformers_optim import TRANSFORMERS_ENTRIES

REGISTRY: dict[str, OptimizerSpec] = {
    spec.name: spec for spec in [*TORCH_ENTRIES, *TRANSFORMERS_ENTRIES, *BNB_ENTRIES, *TORCHAO_ENTRIES,
                                 *LOW_RANK_ENTRIES, *EXTRA_ENTRIES]
}

DEFAULT_OPTIMIZERS: tuple[str, ...] = ("adamw", "adafactor", "adamw8bit")


def state_precision(label: str, bf16_weights: bool, fp32_state_numel: int) -> str:
    """An entry's state label over weights of one dtype: torch's optimizers keep their state in the parameters'
    dtype, so an "fp32" entry over bf16 weights that keeps no full-size fp32 state holds bf16 state."""
    if bf16_weights and fp32_state_numel == 0 and label.startswith("fp32"):
        return "bf16" + label.removeprefix("fp32")
    return label

# Printed under `optbench list`: the one distinction the table cannot show.
LIST_NOTES = """\
adamw8bit vs adamw8bit_hf: both are bitsandbytes' blockwise 8-bit AdamW. adamw8bit is the library
optimizer as shipped: every tensor of at least 4096 elements gets uint8 moments, embeddings included.
adamw8bit_hf is what HF Trainer builds for optim="adamw_bnb_8bit" (or "adamw_8bit"): it overrides every
nn.Embedding weight to 32-bit state, so embeddings keep fp32 moments (8 bytes/param instead of ~2), and
it uses the Trainer's default weight decay of 0. Where embeddings are a big share of the model (about
half of MiniLM's 22.7 M parameters) the two differ a lot in state size: compare the one your training
code really uses. HF's other 8-bit names (paged_adamw_8bit, lion_8bit, ademamix_8bit, rmsprop_bnb_8bit)
apply the same override, so they are not aliases of the pure entries here.
An entry named after an HF Trainer `optim` name builds what Trainer builds for it (class, defaults, weight decay 0,
the 8-bit embedding override; GaLore/APOLLO on "all-linear" at rank 128); adamw, sgd_momentum, lion,
galore_adamw_r8, ... are optbench's own settings of the same libraries."""

_BY_NAME = {alias: spec for spec in REGISTRY.values() for alias in spec.names}
if len(_BY_NAME) != sum(len(spec.names) for spec in REGISTRY.values()):
    raise RuntimeError("two registry entries share a name or an alias")


def resolve(name: str) -> OptimizerSpec:
    """Look a name or an HF Trainer alias up; unknown names fail with the list of known ones."""
    spec = _BY_NAME.get(name.strip().lower())
    if spec is None:
        known = ", ".join(f"{s.name} ({'/'.join(s.names[1:])})" if s.names[1:] else s.name for s in REGISTRY.values())
        raise UnknownOptimizerError(f"unknown optimizer '{name}'; known: {known}")
    return spec


def available_names() -> list[str]:
    """`--optimizers all`: every entry that can run here, in registry order."""
    return [spec.name for spec in REGISTRY.values() if spec.available]


def representatives() -> list[str]:
    """The default optimizers, then the first entry of each other library family, in registry order: one of each
    kind of state for the benchmark suite's default, which grows with the families rather than with the entries."""
    chosen = [resolve(name) for name in DEFAULT_OPTIMIZERS]
    families = {spec.library for spec in chosen}
    for spec in REGISTRY.values():
        if spec.library not in families:
            families.add(spec.library)
            chosen.append(spec)
    return [spec.name for spec in chosen]


def parse_optimizer_kwargs(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`NAME={json object}` items (from repeated --optimizer-kwargs) -> {registry name: kwargs}.

    Names may be aliases; JSON lists become tuples (torch wants `betas` as a tuple, and tuples keep
    the kwargs hashable for trial ids). A later item for the same optimizer updates the earlier one.
    Raises ValueError with a one-line reason on malformed input.
    """
    parsed: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--optimizer-kwargs expects NAME={{json}}, e.g. 'adamw={{\"betas\": [0.9, 0.95]}}'; "
                             f"got '{item}'")
        spec = resolve(name)
        try:
            value = json.loads(text, parse_constant=_refuse_constant)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--optimizer-kwargs for {name.strip()}: not valid JSON ({exc.msg} at column "
                             f"{exc.colno}): {text}") from None
        except _NonFinite as exc:  # NaN ran, and the record said null: not the setting that ran
            raise ValueError(f"--optimizer-kwargs for {name.strip()}: {exc}: a setting must be a finite number"
                             ) from None
        if not isinstance(value, dict):
            raise ValueError(f"--optimizer-kwargs for {name.strip()}: expected a JSON object, got {text}")
        if "lr" in value:  # the trial passes its lr itself: the build failed on a second one, in every trial
            raise ValueError(f"--optimizer-kwargs for {name.strip()}: give the learning rate with --lr, not as "
                             "\"lr\" (the lr is the trial's, recorded and tuned apart from the kwargs)")
        parsed.setdefault(spec.name, {}).update({key: _tuples(v) for key, v in value.items()})
    return parsed


PROBE_STEPS = 2  # the second step is the first to read state the first one made (SGD's dampening, a moment)


def kwargs_refusal(name: str, kwargs: dict[str, Any]) -> str | None:
    """Why `kwargs` cannot build `name` or take its first steps, found on a small model, or None.

    A misspelt keyword or an out-of-range setting (momentum -5) otherwise fails every trial of the sweep, each
    after loading the model; some fail only when stepping (SGD's dampening given as a string, at its second step).
    Where the kwargs fail, the entry is built and stepped again without them: where that fails at the same stage or
    earlier (the probe model does not suit the entry, or its step needs what a trial sets up) the check cannot tell
    and refuses nothing, so a sound setting is never refused. Sound kwargs cost one build and two steps."""
    spec = resolve(name)
    if not kwargs or spec.trainer_optim or not spec.available:
        return None
    import torch

    def attempt(settings: dict[str, Any]) -> tuple[str, Exception] | None:
        """Build and step the entry on the probe: None, or the stage that failed ("build", "step") and why."""
        torch.manual_seed(0)
        probe = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 2))
        stage = "build"
        try:
            with warnings.catch_warnings():  # a library's deprecation notice belongs to the trial, not the check
                warnings.simplefilter("ignore")
                optimizer = spec.build_for(probe, **settings)
                stage = "step"
                for _ in range(PROBE_STEPS):
                    probe(torch.arange(8)).square().mean().backward()
                    optimizer.step()
                    optimizer.zero_grad()
        except Exception as exc:  # noqa: BLE001 - any failure of the library's code is the answer
            return stage, exc
        return None

    failure = attempt(kwargs)
    if failure is None:
        return None
    done, exc = failure
    bare = attempt({})  # the same stage failing without the kwargs: the check cannot tell, and refuses nothing
    if bare is not None and (bare[0] == "build" or done == "step"):
        return None
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return f"--optimizer-kwargs for {spec.name}: {json.dumps(kwargs)} does not {done} it: {reason}"


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    """json's hook for NaN, Infinity and -Infinity, which Python's json reads though JSON has none of them."""
    raise _NonFinite(name)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
