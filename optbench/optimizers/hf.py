"""What HF Trainer passes to the optimizer it builds for an `optim=` name, with TrainingArguments' defaults.

`Trainer.create_optimizer` puts every parameter in a group with `weight_decay=args.weight_decay` (0.0 by default;
biases and LayerNorm weights get 0.0 whatever it is), hands AdamW-like classes `betas=(adam_beta1, adam_beta2)`
and `eps=adam_epsilon`, and, for the low-rank names, projects the `nn.Linear` weights `optim_target_modules`
selects, which it requires. An entry named after an HF name reproduces exactly that (tests/test_registry_hf.py
builds both and compares class, hyper-parameters, state and update); these are its settings.
"""

from __future__ import annotations

HF_WEIGHT_DECAY = 0.0  # TrainingArguments.weight_decay
HF_ADAM = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": HF_WEIGHT_DECAY}  # adam_beta1/2, adam_epsilon
# HF requires `optim_target_modules` for GaLore and APOLLO; optbench passes "all-linear" (every nn.Linear weight).
HF_TARGET_MODULES = "all-linear"
HF_GALORE = {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"}  # Trainer's optim_args defaults
HF_APOLLO = {"rank": 128, "proj": "random", "scale_type": "channel", "update_proj_gap": 200, "scale": 1.0,
             "proj_type": "std"}
