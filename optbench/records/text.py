"""How a size and an over-long text read in a sentence or a table cell: one rule for every command's output."""

from __future__ import annotations

MIB = 2**20
GIB = 2**30
ELLIPSIS = "…"


def size_text(n_bytes: float) -> str:
    """Bytes for a sentence, in the unit that keeps 1-3 digits before the point: "89.42 MiB", "2.00 KiB", "0 B" (a
    budget of 1 MiB in fixed GiB read "0.00 GiB"). A table column keeps one unit for every row instead."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if abs(n_bytes) >= scale:
            return f"{n_bytes / scale:,.2f} {unit}"
    return f"{n_bytes:.0f} B"


def clip(text: str, width: int, *, left: bool = False) -> str:
    """`text` cut to `width` characters, an ellipsis marking the cut: at the end, or with `left` at the start (a
    parameter's long dotted name keeps its informative tail). The record, or the list under a table, keeps it all."""
    if len(text) <= width:
        return text
    return ELLIPSIS + text[len(text) - width + 1:] if left else text[: width - 1] + ELLIPSIS
