"""The README's GPU section: one part per `results/<gpu>/` folder that `scripts/gpu-check` wrote, rendered with the
report's own code like every other README table (scripts/readme_tables.py calls `gpu_section`).

A GPU folder is any folder under results/ but the CPU machines' (`cpu-*`) that holds a record file gpu-check writes.
Each part: which GPU, driver and torch; the smoke sweep of every entry (status, state, optimizer step, what ran,
roofline, resume); the `lm` job's roofline, bitsandbytes' host-synced step named beside it; the predictor's error.
"""

from __future__ import annotations

from pathlib import Path

from optbench.probes import HOST_SYNCED
from optbench.records.record import Record, read_records
from optbench.report import render
from optbench.report.frame import summarize, trials_frame

GPU_FILES = ("smoke-all.jsonl", "lm.jsonl", "ddp.jsonl", "fp16-autocast.jsonl", "bf16-autocast.jsonl",
             "max-memory.jsonl")
SMOKE_COLUMNS = ("optimizer", "state precision", "status", "state MiB", "opt step ms", "impl", "roofline %", "resume")
LM_COLUMNS = ("optimizer", "step ms", "opt step ms", "impl", "roofline %", "bandwidth GB/s", "train mem MiB",
              "pred. peak MiB", "pred. err %")
NONE_YET = ("No GPU run is committed yet. On a GPU machine: `scripts/gpu-bundle` here (the wheels it lacks), then "
            "`scripts/gpu-check part1` and `scripts/gpu-check part2` there; each writes `results/<gpu>/`, and this "
            "section renders from it.")


def gpu_folders(results: Path) -> list[Path]:
    return sorted(folder for folder in results.iterdir() if folder.is_dir() and not folder.name.startswith("cpu-")
                  and any((folder / name).is_file() for name in GPU_FILES))


def _table(records: list[Record], columns: tuple[str, ...]) -> str:
    """The report's job table for `records`, cut to `columns` (those it has)."""
    summary = summarize(trials_frame(records))
    _, frame, _, _ = render.display_tables(summary)[0]
    return frame[[c for c in columns if c in frame.columns]].to_markdown(index=False)


def _machine(records: list[Record]) -> str:
    # a skipped trial's stamp names no device: the first that does
    env = next((r.env for r in records if r.env and r.env.get("gpu")), next((r.env for r in records if r.env), {}))
    driver = f", driver {env['gpu_driver']}" if env.get("gpu_driver") else ""
    return f"{env.get('gpu') or 'unknown GPU'}{driver}, torch {env.get('torch')}, CUDA {env.get('cuda')}"


def gpu_part(folder: Path) -> str:
    records = {name: read_records(folder / name) for name in GPU_FILES if (folder / name).is_file()}
    every = [r for rs in records.values() for r in rs]
    lines = [f"#### `results/{folder.name}/`: {_machine(every)}", ""]
    ran = ", ".join(f"{name.removesuffix('.jsonl')} ({len(rs)})" for name, rs in records.items())
    missing = [name.removesuffix(".jsonl") for name in GPU_FILES if name not in records]
    if not (folder / "predictor" / "held-out.md").is_file():
        missing.append("predictor")
    lines += [f"Record files (trials): {ran}; not in this folder: {', '.join(missing) or 'none'}.", ""]
    if records.get("smoke-all.jsonl"):
        lines += ["Every available entry at smoke size on `tiny`, checkpointed and resumed:", "",
                  _table(records["smoke-all.jsonl"], SMOKE_COLUMNS), ""]
    if records.get("lm.jsonl"):
        lines += ["The causal LM's optimizer steps against the GPU's measured bandwidth (the stream probe's fused "
                  "AdamW kernel):", "",
                  _table(records["lm.jsonl"], LM_COLUMNS), ""]
        if not any(r.device_bandwidth_calibrated_bytes_per_s for r in records["lm.jsonl"]):
            lines += ["No roofline %: these trials ran where no bandwidth calibration was cached "
                      "(`optbench calibrate-bandwidth --device cuda` first).", ""]
        if any(r.optimizer_impl == HOST_SYNCED for r in records["lm.jsonl"]):
            lines += [f"`{HOST_SYNCED}`: bitsandbytes synchronises the GPU after every parameter's update, so its "
                      "step is host-serialised; its roofline % is bound by launches and waits, not bandwidth.", ""]
    held = folder / "predictor" / "held-out.md"
    if held.is_file():
        band = next((line.strip() for line in held.read_text(encoding="utf-8").splitlines()
                     if line.startswith("predictor error")), "")
        if band:
            lines += [f"Peak predictor on this GPU: {band}", ""]
    return "\n".join(lines).strip()


def gpu_section(results: Path) -> str:
    folders = gpu_folders(results)
    return "\n\n".join(gpu_part(folder) for folder in folders) if folders else NONE_YET
