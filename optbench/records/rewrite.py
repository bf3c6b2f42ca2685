"""A results file rewritten in the schema written now, so that its raw lines say what the reader reads.

The reader puts every older line through the upgrade steps (upgrade.py) on each read, so a file never needs
rewriting to be read right. Its raw JSON keeps the older names, though: a schema-3 line's `roofline_fraction` is a
triad's ratio the reader calls `triad_roofline_fraction`, a schema-4 ratio above 1 is a ceiling the step outran
(`ceiling_outrun_fraction`). Whoever reads the line itself (grep, jq, a notebook) sees a roofline above its ceiling.

`rewrite_file` puts each older line through the same steps and stamps the schema it was written in
(`upgraded_from_schema`). Every other key keeps its value and its place, fields this version does not know
included (`Record.from_dict` would drop those), and a line whose rewrite would read back as anything else is
refused, not written. What is no record (a torn or corrupt line, a blank one) and what is current already is kept
byte for byte. The file is replaced whole (a temporary file, fsynced, renamed over it): a crash leaves the old
file or the new one, never half of each. It is for files at rest: a line a running sweep appends during the
rewrite would land in the replaced file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from optbench.records.fields import RecordFieldError
from optbench.records.record import SCHEMA_VERSION, Record, is_record_data
from optbench.records.upgrade import upgrade


class RewriteError(ValueError):
    """A rewritten line that would read back differently from the line it replaces (a bug in an upgrade step)."""


def upgraded_line(line: str) -> str:
    """`line` in the current schema, or `line` itself when it is current already, unreadable or no record."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not is_record_data(data):
        return line
    version = int(data.get("schema_version") or 1)
    if version >= SCHEMA_VERSION:
        return line
    try:
        before = Record.from_dict(data)
    except RecordFieldError:  # the reader skips it; rewriting it would hide what was stored
        return line
    rest = {key: value for key, value in upgrade(dict(data)).items() if key != "schema_version"}
    rewritten = {"schema_version": SCHEMA_VERSION, "upgraded_from_schema": version, **rest}
    after = Record.from_dict(rewritten)
    if dataclasses.replace(after, schema_version=before.schema_version, upgraded_from_schema=None) != before:
        raise RewriteError(f"trial {data['trial_id']!r} would read back differently in schema {SCHEMA_VERSION}")
    return json.dumps(rewritten)


def rewritten_text(text: str) -> tuple[str, int]:
    """`text` (a results file's contents) with its older lines in the current schema (`upgraded_line`), and how many
    lines that changed; every line keeps its own line ending."""
    lines, count = [], 0
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        new = upgraded_line(body)
        count += new != body
        lines.append(new + line[len(body):])
    return "".join(lines), count


def rewrite_file(path: Path) -> int:
    """Rewrite `path`'s older lines in the current schema (`rewritten_text`); returns how many it rewrote.

    Nothing is written when no line needs it; a RewriteError leaves the file as it was."""
    text, count = rewritten_text(path.read_text(encoding="utf-8"))
    if not count:
        return 0
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return count
