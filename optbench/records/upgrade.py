"""A record's upgrade steps: what an older schema's fields meant, said in this schema's terms.

Schema 2 added the lr `schedule` (schema-1 records trained at a constant lr after the warm-up, and read back as
`constant`), `workload_options` (schema 1 named a tiny BERT's width in the workload, `tiny-w128`; it reads back as
workload `tiny` with `{"hidden_size": 128}`) and the `job_key` every reader groups by. Schema 3 gave HF Trainer's
`optim` names the semantics Trainer gives them: the entries that held three of those names before are renamed
(`RENAMED_OPTIMIZERS`: `sgd` with momentum 0.9 is now `sgd_momentum`, the rank-8 `galore_adamw` and `apollo_adamw`
are `galore_adamw_r8` and `apollo_adamw_r8`), and older records read back under the new names. It also added the
sharding check (`sharding_state_changes`). Schema 4 made `roofline_fraction` a share of the stream kernel's ceiling
(torch's fused AdamW update over four operands, `device_bandwidth_kernel`): a record without that kernel divided by a
triad `a += s*b` (calibrated, or its own per-trial probe), which the fused AdamW step it measured streams faster than
(docs/roofline.md): its ratio reads back as `triad_roofline_fraction`, and its roofline as none. Schema 5 keeps
`roofline_fraction` at or below 1: a ratio above 1 is a step that outran its calibrated ceiling (the ceiling was
mis-measured for that trial), and reads back as `ceiling_outrun_fraction`, with no roofline.

Adding a step: bump record.SCHEMA_VERSION, translate here what the older fields meant, and rewrite the committed
results in the new schema (`python scripts/upgrade_records.py`; tests/test_rewrite.py fails until it ran).
"""

from __future__ import annotations

from typing import Any

RENAMED_OPTIMIZERS = {"sgd": "sgd_momentum", "galore_adamw": "galore_adamw_r8", "apollo_adamw": "apollo_adamw_r8"}


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: a constant lr after warm-up, and the tiny BERT's width out of the workload name.
    Schema 2 -> 3: the entries renamed to free HF Trainer's names (`RENAMED_OPTIMIZERS`).
    Schema 3 -> 4: a roofline over a triad's bandwidth is no roofline; its ratio moves to `triad_roofline_fraction`.
    Schema 4 -> 5: a ratio above 1 over the stream kernel's ceiling is no roofline; it moves to
    `ceiling_outrun_fraction`."""
    version = int(data.get("schema_version") or 1)
    if version < 2:
        data.setdefault("schedule", "constant")
        workload = str(data.get("workload") or "")
        if workload.startswith("tiny-w") and workload[6:].isdigit():
            data["workload"], data["workload_options"] = "tiny", {"hidden_size": int(workload[6:])}
    if version < 3 and data.get("optimizer") in RENAMED_OPTIMIZERS:
        data["optimizer"] = RENAMED_OPTIMIZERS[data["optimizer"]]
    if version < 4 and not data.get("device_bandwidth_kernel") and data.get("roofline_fraction") is not None:
        data["triad_roofline_fraction"] = data.pop("roofline_fraction")
    if version < 5 and (data.get("roofline_fraction") or 0) > 1:
        data["ceiling_outrun_fraction"] = data.pop("roofline_fraction")
    return data
