"""The report as one self-contained HTML page: sortable tables (a click on a header sorts by it), the verdict in
words, figures embedded as base64 PNGs. render.py decides what goes on it; this module only lays it out.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

# Click a header to sort its table by that column (numbers by their leading value), click again to reverse.
SORT_JS = """
document.querySelectorAll('table.sortable th').forEach((th, col) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
  const key = r => { const t = r.cells[col].textContent.trim(), n = parseFloat(t.replace(/,/g, ''));
                     return isNaN(n) ? t : n; };
  const dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
  rows.sort((a, b) => { const x = key(a), y = key(b);
    return (typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === 'number' ? -1 : 1)) * dir; });
  rows.forEach(r => body.appendChild(r));
}));
"""
STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:85%}"
         "td,th{padding:3px 8px;border-bottom:1px solid #ddd;text-align:right}th{cursor:pointer;"
         "background:#f4f4f4}th:hover{background:#e4e4f4}img{max-width:100%}.error{color:#a00}"
         ".note{color:#555;font-size:85%}#verdict{background:#f6f8fa;padding:.5em 1em;border-radius:6px}")


def render_html(verdicts: list[str], tables: list[tuple[str, pd.DataFrame, str, list[str]]],
                figures: Iterable[Path] = (), extra: str = "") -> str:
    """One self-contained page: the verdict lines (already HTML), the job tables made sortable (each with its note
    and error lines), then each figure embedded as a base64 PNG (mail it, open it offline)."""
    parts = ["<section id=verdict><h2>Verdict</h2><ul>"
             + "".join(f"<li>{line}</li>" for line in verdicts) + "</ul></section>"]
    for job, table, said, errors in tables:
        parts.append(f"<h2>{html.escape(job)}</h2>\n" + table.to_html(index=False, border=0, escape=True,
                                                                       classes="sortable"))
        parts.append(f"<p class=note>{html.escape(said)}</p>")
        parts.extend(f"<p class=error>{html.escape(e)}</p>" for e in errors)
    if extra:
        parts.append(f"<pre>{html.escape(extra)}</pre>")
    for figure in figures:
        data = base64.b64encode(figure.read_bytes()).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{figure.stem}">'
                     f"<figcaption>{figure.name}</figcaption></figure>")
    return (f"<!doctype html>\n<html><head><meta charset=utf-8><title>optbench report</title>"
            f"<style>{STYLE}</style></head><body>\n<h1>optbench report</h1>\n" + "\n".join(parts)
            + f"\n<script>{SORT_JS}</script>\n</body></html>\n")
