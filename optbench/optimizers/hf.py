"""What HF Trainer passes to the optimizer it builds for an `optim=` name, with TrainingArguments' defaults.

`Trainer.create_optimizer` puts every parameter in a group with `weight_decay=args.weight_decay` (0.0 by default;
biases and LayerNorm weights get 0.0 whatever it is), hands AdamW-like classes `betas=(adam_beta1, adam_beta2)`
and `eps=adam_epsilon`, and, for the low-rank names, projects the `nn.Linear` weights `optim_target_modules`
selects, which it requires. An entry named after an HF name reproduces exactly that (tests/test_registry_hf.py
builds both and compares class, hyper-parameters, state and update); these are its settings.
"""

from __future__ import annotations

import re
from typing import Any

HF_WEIGHT_DECAY = 0.0  # TrainingArguments.weight_decay
HF_ADAM = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": HF_WEIGHT_DECAY}  # adam_beta1/2, adam_epsilon
# HF requires `optim_target_modules` for GaLore and APOLLO; optbench passes "all-linear" (every nn.Linear weight).
HF_TARGET_MODULES = "all-linear"
HF_GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}  # Trainer's optim_args defaults
HF_APOLLO = {"rank": 128, "proj": "random", "scale_type": "channel", "update_proj_gap": 200, "scale": 1.0,
             "proj_type": "std"}

# Trainer.get_decay_parameter_names (transformers 5.24): parameters of nn.LayerNorm modules and names matching these
# (lower-cased) go to the group without weight decay; tests/test_registry_hf.py holds the two equal.
NO_DECAY_PATTERNS = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")


def trainer_groups(pairs: list[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Trainer's two parameter groups, decayed then not, in parameter order (empty ones left out): an optimizer
    whose update depends on a parameter's place in its group (GrokAdamW's per-layer beta1) needs the same ones."""
    no_decay = [p.layer_norm or any(re.search(pattern, p.name.lower()) for pattern in NO_DECAY_PATTERNS)
                for p, _ in pairs]
    groups = [[t for (_, t), skip in zip(pairs, no_decay, strict=True) if skip == wanted] for wanted in (False, True)]
    return [{"params": group} for group in groups if group]
