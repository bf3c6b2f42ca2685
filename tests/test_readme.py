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
    with bitsandbytes' host-synced step named beside its roofline, what the folder lacks, and why a roofline is
    missing; no GPU folder: a line saying how to make one."""
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
            if record.status == "skipped":  # as on the GPU: a skipped trial's stamp names no device
                record.env = {**record.env, "gpu": None, "gpu_driver": None, "cuda": None}
            record.device_bandwidth_calibrated_bytes_per_s = 4.0e12  # gpu-check calibrates the GPU first
            record.device_bandwidth_kernel = "fused-adamw"  # with the stream kernel (a triad record has no roofline)
            if record.optimizer_step_traffic_bytes and record.optimizer_step_median_s:
                record.roofline_fraction = record.optimizer_step_traffic_bytes / record.optimizer_step_median_s / 4e12
            if record.optimizer == "adamw8bit" and name == "lm.jsonl":
                record.optimizer_impl, record.roofline_fraction = HOST_SYNCED, 0.05
            append_record(gpu / name, record)
    text = gpu_section(tmp_path)
    assert text.startswith("#### `results/nvidia-h200/`: NVIDIA H200, driver 580.159.04, torch ")
    assert text.count("| optimizer ") == 2 and text.count("roofline %") >= 3 and "galore_adamw_r8 " in text
    assert f"`{HOST_SYNCED}`: bitsandbytes synchronises the GPU after every parameter" in text
    assert "not in this folder: ddp, fp16-autocast, bf16-autocast, max-memory, predictor." in text
    assert "No roofline %" not in text
    for record in read_records(gpu / "lm.jsonl"):  # an lm job run before the GPU's bandwidth was calibrated
        record.device_bandwidth_calibrated_bytes_per_s = record.roofline_fraction = None
        append_record(tmp_path / "nvidia-h100" / "lm.jsonl", record)
    text = gpu_section(tmp_path)
    assert "No roofline %: these trials ran where no bandwidth calibration was cached" in text


def test_every_table_of_the_readme_is_rendered_from_records():
    assert readme_tables.unrendered_tables(readme_tables.README.read_text(encoding="utf-8")) == []


def test_a_table_typed_by_hand_into_the_readme_is_found():
    text = readme_tables.README.read_text(encoding="utf-8")
    typed = text + "\n| optimizer | largest batch |\n|---|---|\n| adamw | 120 |\n"
    fenced = text + "\n```\n| not | a table |\n```\n"
    lines = len(text.splitlines())
    assert readme_tables.unrendered_tables(typed) == [lines + 2, lines + 3, lines + 4]
    assert readme_tables.unrendered_tables(fenced) == []


def _bracket(folder: Path, after_ceiling_bytes_per_s: float, after_slowest_bytes_per_s: float) -> None:
    """A roofline-bracketed set: a calibration (ceiling 50 GB/s, 5-95 % 46-50), five trials at 80-82 %, and a
    calibration after them with the ceiling and 5 % quantile given."""
    from optbench.probes import bandwidth, stream
    from optbench.records.record import Record

    folder.mkdir(parents=True)

    def calibration(ceiling: float, slowest: float) -> bandwidth.BandwidthCalibration:
        quantiles = {"0.05": slowest, "0.25": slowest, "0.5": slowest, "0.75": ceiling, "0.95": ceiling}
        return bandwidth.BandwidthCalibration(machine="m", device_name="cpu", threads=2, ceiling_bytes_per_s=ceiling,
                                              quantiles_bytes_per_s=quantiles, passes=200, buffer_bytes=2**26,
                                              kernel=stream.KERNEL)

    bandwidth.save(calibration(5e10, 4.6e10), folder / "before.json")
    bandwidth.save(calibration(after_ceiling_bytes_per_s, after_slowest_bytes_per_s), folder / "after.json")
    for seed, fraction in enumerate((0.80, 0.81, 0.81, 0.82, 0.80)):
        append_record(folder / "roofline.jsonl", Record(
            trial_id=str(seed), status="ok", seed=seed, optimizer="adamw_fused", roofline_fraction=fraction,
            optimizer_step_traffic_bytes=636_000_000, optimizer_step_median_s=636e6 / fraction / 5e10,
            device_bandwidth_calibrated_bytes_per_s=5e10, device_bandwidth_calibrated_spread_bytes_per_s=4e9,
            device_bandwidth_working_set_bytes=2**28, device_bandwidth_kernel="fused-adamw"))


def test_a_bracketed_set_says_whether_the_machine_held_its_speed(tmp_path, monkeypatch):
    """The second calibration's ceiling inside the first's 5-95 % range: held; outside it: did not hold; a second
    calibration that was itself unsteady says so, whether kept as a file or refused and kept as what it printed."""
    monkeypatch.setattr(readme_tables, "RESULTS", tmp_path)
    _bracket(tmp_path / "held", 4.8e10, 4.4e10)
    _bracket(tmp_path / "moved", 4.0e10, 2.4e10)
    held, moved = readme_tables.roofline_bracketed("held"), readme_tables.roofline_bracketed("moved")
    assert "80.0–82.0 % over 5 trials, each within ±1.2 % of their median (within the ±5 %" in held
    assert held.endswith("48.0 GB/s, against 50.0 before (5–95 % 46.0–50.0): the machine held its speed over the set "
                         "by that rule")
    assert moved.endswith("40.0 GB/s, against 50.0 before (5–95 % 46.0–50.0): the machine did not hold its speed "
                          "over the set by that rule; that calibration was itself unsteady (its slowest passes ran at "
                          "60 % of its fastest)")
    (tmp_path / "moved" / "after.json").unlink()
    (tmp_path / "moved" / "after-unsteady.txt").write_text(
        "m: the 95% quantile of the fused-adamw kernel's passes per working set (4 operands):\n"
        "       256 MiB: ceiling 47.0 GB/s (200 passes; 5-95 % 30.6-47.0 GB/s, median 40.0); unsteady: its slowest "
        "passes ran at 65% of its fastest (a steady machine's >= 70%)\n")
    assert readme_tables.roofline_bracketed("moved").endswith(
        "47.0 GB/s, against 50.0 before (5–95 % 46.0–50.0): the machine held its speed over the set by that rule; "
        "that calibration was itself unsteady (its slowest passes ran at 65 % of its fastest) and calibrate-bandwidth "
        "refused to write it: after-unsteady.txt is what it printed")
    assert readme_tables.roofline_bracketed("absent") == "not measured yet"
