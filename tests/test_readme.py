"""The results tables and figures of README.md and docs/ are what the committed records give (no training: the
records are read, summarised and rendered with the report's own code)."""

import importlib.util
import re
import sys
from pathlib import Path

from optbench.probes import HOST_SYNCED
from optbench.records.record import append_record, read_records

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("readme_tables", ROOT / "scripts" / "readme_tables.py")
readme_tables = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = readme_tables  # dataclasses look their module up while the class is built
SPEC.loader.exec_module(readme_tables)


def test_every_block_of_readme_and_docs_is_what_the_records_give():
    for path in readme_tables.DOCUMENTS:
        _, changed = readme_tables.rewrite(path.read_text(encoding="utf-8"))
        assert changed == [], f"{path.name}: {changed} differ from the records: run scripts/readme_tables.py"


def test_a_figure_changed_by_hand_in_a_table_fails_the_check():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(m for m in readme_tables.BLOCK.finditer(text) if m.group(2) == "table")
    digit = re.search(r"\d", block.group(4))
    start = block.start(4) + digit.start()
    edited = text[:start] + str((int(text[start]) + 1) % 10) + text[start + 1:]
    _, changed = readme_tables.rewrite(edited)
    assert changed == [f"table {block.group(3)}"]


def test_every_block_names_a_renderer():
    names = {(m.group(2), m.group(3)) for path in readme_tables.DOCUMENTS
             for m in readme_tables.BLOCK.finditer(path.read_text(encoding="utf-8"))}
    known = {("table", n) for n in readme_tables.TABLES} | {("value", n) for n in readme_tables.VALUES}
    assert names <= known, sorted(names - known)
    assert ("table", "default") in names and ("table", "study") in names


def test_a_gpu_folder_renders_its_own_section(tmp_path):
    """What scripts/gpu-check writes (here: the CPU records restamped as if timed on a GPU) becomes a README part,
    with bitsandbytes' host-synced step named beside its roofline; no GPU folder: a line saying how to make one."""
    from readme_gpu import NONE_YET, gpu_section

    (tmp_path / "cpu-2core").mkdir()
    (tmp_path / "cpu-2core" / "lm.jsonl").write_text("")  # the CPU machines' folders are not GPU sections
    assert gpu_section(tmp_path) == NONE_YET
    gpu = tmp_path / "nvidia-h200"
    gpu.mkdir()
    for name in ("smoke-all.jsonl", "lm.jsonl"):
        for record in read_records(ROOT / "results" / "cpu-2core" / name):
            record.device, record.device_name = "cuda:0", "NVIDIA H200"
            record.env = {**record.env, "gpu": "NVIDIA H200", "gpu_driver": "580.159.04", "cuda": "13.0"}
            record.device_bandwidth_calibrated_bytes_per_s = 4.0e12  # gpu-check calibrates the GPU first
            if record.optimizer_step_traffic_bytes and record.optimizer_step_median_s:
                record.roofline_fraction = record.optimizer_step_traffic_bytes / record.optimizer_step_median_s / 4e12
            if record.optimizer == "adamw8bit" and name == "lm.jsonl":
                record.optimizer_impl, record.roofline_fraction = HOST_SYNCED, 0.05
            append_record(gpu / name, record)
    text = gpu_section(tmp_path)
    assert text.startswith("#### `results/nvidia-h200/`: NVIDIA H200, driver 580.159.04, torch ")
    assert text.count("| optimizer ") == 2 and text.count("roofline %") >= 3 and "galore_adamw_r8 " in text
    assert f"`{HOST_SYNCED}`: bitsandbytes synchronises the GPU after every parameter" in text


def test_every_table_of_the_readme_is_rendered_from_records():
    assert readme_tables.unrendered_tables(readme_tables.README.read_text(encoding="utf-8")) == []


def test_a_table_typed_by_hand_into_the_readme_is_found():
    text = readme_tables.README.read_text(encoding="utf-8")
    typed = text + "\n| optimizer | largest batch |\n|---|---|\n| adamw | 120 |\n"
    fenced = text + "\n```\n| not | a table |\n```\n"
    lines = len(text.splitlines())
    assert readme_tables.unrendered_tables(typed) == [lines + 2, lines + 3, lines + 4]
    assert readme_tables.unrendered_tables(fenced) == []
