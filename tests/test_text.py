"""How sizes and clipped text read (optbench/records/text.py): every table and listing cuts text by one rule."""

from __future__ import annotations

import pytest

from optbench.records.text import clip, size_text


@pytest.mark.parametrize(("text", "width", "left", "shown"), [
    ("abc", 4, False, "abc"),  # fits: unchanged
    ("abcd", 4, False, "abcd"),
    ("abcdef", 4, False, "abc…"),  # the end cut, the width kept
    ("bert.encoder.layer.0.attention", 10, True, "…attention"),  # a dotted name keeps its tail
])
def test_clip_keeps_the_width_and_marks_the_cut(text, width, left, shown):
    assert clip(text, width, left=left) == shown
    assert len(clip(text, width, left=left)) <= width


@pytest.mark.parametrize(("n_bytes", "shown"), [(0, "0 B"), (2048, "2.00 KiB"), (89.42 * 2**20, "89.42 MiB"),
                                                (-3 * 2**30, "-3.00 GiB")])
def test_size_text_keeps_one_to_three_digits_before_the_point(n_bytes, shown):
    assert size_text(n_bytes) == shown


def test_a_field_of_the_wrong_kind_is_shown_clipped_by_the_same_rule():
    from dataclasses import dataclass

    from optbench.records.fields import field_problem

    @dataclass
    class Row:
        steps: int | None = None

    said = field_problem(Row, {"steps": "x" * 100})
    shown = said.removeprefix("field steps is ").split(", not")[0]
    assert len(shown) == 40 and shown.endswith("…") and shown.startswith("'xxx")
