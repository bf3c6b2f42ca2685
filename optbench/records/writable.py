"""Whether a file can be written where a command was told to write it, asked before the command's work (minutes
of measuring) rather than after: one rule for every file optbench writes (results, a calibration, an export)."""

from __future__ import annotations

import errno
from pathlib import Path


def output_fault(path: Path) -> str | None:
    """Why no file could be written at `path`, asked without making anything: a folder there, or a file where a
    folder must be (mkdir would say only "File exists"); None when neither."""
    existing = next(part for part in (path, *path.parents) if part.exists())
    if existing == path and path.is_dir():
        return "it is a folder"
    if existing != path and not existing.is_dir():
        return f"{existing} is a file, not a folder"
    return None


def check_writable(path: Path) -> None:
    """Fail fast (OSError) when records could not be appended to `path`: before any trial runs, not after.

    Creates the folder if missing; opens the file for appending (as the store will) and removes it
    again if this check created it, so a refused run leaves nothing behind.
    """
    if fault := output_fault(path):
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, fault, str(path))
        raise NotADirectoryError(errno.ENOTDIR, fault, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    with open(path, "ab"):
        pass
    if not existed:
        path.unlink()
