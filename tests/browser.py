"""Render an HTML page in a real headless browser (Debian's chromium) and report what loaded:
every image's ``naturalWidth`` (0 = broken) and every table's body rows.

A copy of the page with a small script is written beside it (so relative image paths resolve);
the script runs on the load event, after every image has loaded or failed, and writes its
findings into the DOM, which ``chromium --headless --dump-dom`` prints.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = "bash tests/install_browser.sh (apt-get install -y chromium, as root)"

_CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({src: i.getAttribute("src"), width: i.naturalWidth,
                                                  loaded: i.complete && i.naturalWidth > 0}));
  const heading = el => {  // the section heading above a table names it in failures
    while (el && el.tagName !== "H2") el = el.previousElementSibling;
    return el ? el.textContent : "";
  };
  const tables = [...document.querySelectorAll("table")].map(t => ({
    caption: heading(t),
    rows: [...t.tBodies].reduce((n, b) => n + b.rows.length, 0)}));
  const out = document.createElement("pre");
  out.id = "browser-check";
  out.textContent = JSON.stringify({images, tables});
  document.body.appendChild(out);
});
</script>"""


def chromium() -> str:
    """The chromium binary; fails the test (never skips it) when it is not installed."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(f"chromium is not installed; install it with: {INSTALL}", pytrace=False)
    return path


def render(page: Path, timeout_s: float = 90) -> dict:
    """{"images": [{src, width, loaded}], "tables": [{caption, rows}]} as chromium saw ``page``."""
    page = Path(page).resolve()
    probe = page.with_name(page.stem + ".browser-check.html")
    text = page.read_text()
    probe.write_text(text.replace("</body>", _CHECK + "</body>") if "</body>" in text else text + _CHECK)
    try:
        proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                               "--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom",
                               probe.as_uri()], capture_output=True, text=True, timeout=timeout_s)
    finally:
        probe.unlink(missing_ok=True)
    found = re.search(r'<pre id="browser-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"chromium printed no check (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return json.loads(html.unescape(found.group(1)))


def assert_renders(page: Path) -> dict:
    """Every image of ``page`` loads in the browser and every table has rows."""
    seen = render(page)
    broken = [i["src"] for i in seen["images"] if not i["loaded"]]
    assert not broken, f"images that did not load in chromium: {broken}"
    empty = [t["caption"] for t in seen["tables"] if t["rows"] == 0]
    assert not empty, f"tables without rows: {empty}"
    return seen
