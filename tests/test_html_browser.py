"""The html report in a real headless browser: tables render, every figure decodes, a header click sorts.

Needs chromium (apt-get install -y chromium) and the playwright Python package (pip install playwright;
its own browser download is not used). Skips, saying which is missing, otherwise.
"""

import os
import shutil
from pathlib import Path

import pytest
from _study_fixture import study_records

from optbench.report.render import write_report

CHROMIUM = os.environ.get("OPTBENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def page():
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    if CHROMIUM is None:
        pytest.skip("no chromium here (apt-get install -y chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser.new_page(viewport={"width": 1400, "height": 1000})
        browser.close()


def test_html_report_renders_sorts_and_shows_every_figure(page, tmp_path):
    _, paths = write_report(study_records(), tmp_path, fmt="html")
    report = tmp_path / "report.html"
    assert report in paths
    page.goto(report.as_uri())
    assert page.locator("#verdict li").count() == 2
    assert page.locator("table.sortable tbody tr").count() == 6  # 2 jobs x 3 optimizers
    widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
    assert len(widths) == len([p for p in paths if p.suffix == ".png"]) >= 5
    assert all(width > 0 for width in widths)

    table = page.locator("table.sortable").first
    column = table.locator("th").all_inner_texts().index("step ms")
    values = f"rows => rows.map(r => parseFloat(r.cells[{column}].textContent.replace(/,/g, '')))"
    table.locator("th").nth(column).click()
    ascending = table.locator("tbody tr").evaluate_all(values)
    assert ascending == sorted(ascending) and ascending != ascending[::-1]
    table.locator("th").nth(column).click()
    assert table.locator("tbody tr").evaluate_all(values) == sorted(ascending, reverse=True)
    shot = Path(os.environ.get("OPTBENCH_SCREENSHOT", tmp_path / "report.png"))
    page.screenshot(path=str(shot), full_page=False)
    assert shot.read_bytes().startswith(b"\x89PNG")
