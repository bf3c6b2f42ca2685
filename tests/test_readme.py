"""The results tables and figures of README.md and docs/ are what the committed records give (no training: the
records are read, summarised and rendered with the report's own code)."""

import importlib.util
import re
import sys
from pathlib import Path

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


def test_every_table_of_the_readme_is_rendered_from_records():
    assert readme_tables.unrendered_tables(readme_tables.README.read_text(encoding="utf-8")) == []


def test_a_table_typed_by_hand_into_the_readme_is_found():
    text = readme_tables.README.read_text(encoding="utf-8")
    typed = text + "\n| optimizer | largest batch |\n|---|---|\n| adamw | 120 |\n"
    fenced = text + "\n```\n| not | a table |\n```\n"
    lines = len(text.splitlines())
    assert readme_tables.unrendered_tables(typed) == [lines + 2, lines + 3, lines + 4]
    assert readme_tables.unrendered_tables(fenced) == []
