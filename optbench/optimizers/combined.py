"""Several optimizers over disjoint parameters, stepped as one (Muon's hidden matrices + AdamW for the rest), or
each from its own parameter's gradient hook (layer-wise GaLore and APOLLO)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch


class _StateView(Mapping):
    """The parts' states read as one mapping. (A ChainMap would not do: looking a key up in a part's
    defaultdict state that lacks it inserts an empty entry there.)"""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts

    def __getitem__(self, key: Any) -> Any:
        for part in self.parts:
            if key in part.state:
                return part.state[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        for part in self.parts:
            yield from part.state

    def __len__(self) -> int:
        return sum(len(part.state) for part in self.parts)


class CombinedOptimizer(torch.optim.Optimizer):
    """Steps each part in turn.

    `param_groups` are the parts' own group dicts, so an lr scheduler drives every part; `state` is a
    read-only view of the parts' states, so state is measured for all of them at once.
    """

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = list(parts)
        super().__init__([{"params": g["params"]} for part in self.parts for g in part.param_groups], {})
        self.param_groups = [g for part in self.parts for g in part.param_groups]
        self.state = _StateView(self.parts)

    def state_dict(self) -> dict[str, Any]:
        """Each part's own state dict: a checkpoint must restore the parts, not the read-only view of them."""
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load each part; the parts replace their group dicts when they load, so the shared list is rebuilt
        (an lr scheduler reads `param_groups` at every step and must reach the parts' new groups)."""
        for part, state in zip(self.parts, state_dict["parts"], strict=True):
            part.load_state_dict(state)
        self.param_groups = [g for part in self.parts for g in part.param_groups]

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts:
            part.step()
        return loss


class LayerwiseOptimizer(CombinedOptimizer):
    """One optimizer per parameter, each stepped by its parameter's post-accumulate-grad hook inside backward (as
    transformers' LayerWiseDummyOptimizer does): `step()` and `zero_grad()` have nothing left to do. The parts'
    state and param groups are read (and scheduled, and checkpointed) through the combined view."""

    def step(self, closure: Any = None) -> Any:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None
