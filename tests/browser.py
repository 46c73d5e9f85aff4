"""Renders an HTML file in headless Chromium and reports what loaded.

The reports m4moe writes (``report.html``, ``routing.html``) are meant to be
opened offline, from disk, by a person: every figure inline, no script or
style fetched from anywhere. A copy of the page gets a small inspector
script; Chromium runs it after the load event and its JSON comes back in
the DOM that ``--dump-dom`` prints: each image's natural size (0 when it
failed to decode), each table's rendered rows and height, and every
resource the page fetched (Resource Timing). Name resolution is disabled
(``--host-resolver-rules``), so a page that needs the network also shows
broken figures, not only a logged fetch.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
from typing import Any

_INSPECTOR = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(
      i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth,
             height: i.naturalHeight}));
  const tables = [...document.querySelectorAll("table")].map(
      t => ({rows: t.rows.length,
             cells: t.querySelectorAll("td,th").length,
             height: t.getBoundingClientRect().height}));
  const fetched = performance.getEntriesByType("resource").map(r => r.name);
  const out = document.createElement("pre");
  out.id = "m4moe-inspect";
  out.textContent = JSON.stringify({images, tables, fetched});
  document.body.appendChild(out);
});
</script>"""

_RESULT = re.compile(r'<pre id="m4moe-inspect">(.*?)</pre>', re.S)


def chromium() -> str | None:
  """The Chromium executable on PATH, or None."""
  for name in ("chromium", "chromium-browser", "google-chrome"):
    found = shutil.which(name)
    if found:
      return found
  return None


def inspect(page: pathlib.Path, *, scratch: pathlib.Path) -> dict[str, Any]:
  """What Chromium loaded and rendered of ``page`` (see the module doc)."""
  browser = chromium()
  if browser is None:
    raise FileNotFoundError("no chromium on PATH")
  text = page.read_text(encoding="utf-8")
  scratch.mkdir(parents=True, exist_ok=True)
  probe = scratch / page.name
  probe.write_text(text.replace("</body>", _INSPECTOR + "</body>", 1),
                   encoding="utf-8")
  proc = subprocess.run(
      [browser, "--headless", "--no-sandbox", "--disable-gpu",
       "--disable-dev-shm-usage", "--no-first-run",
       "--disable-background-networking",
       "--host-resolver-rules=MAP * ~NOTFOUND",
       f"--user-data-dir={scratch / 'profile'}",
       "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
      capture_output=True, text=True, timeout=180, check=False)
  found = _RESULT.search(proc.stdout)
  if found is None:
    raise RuntimeError(f"chromium printed no inspection of {page} (exit "
                       f"{proc.returncode}): {proc.stderr[-2000:]}")
  return json.loads(found.group(1).replace("&quot;", '"')
                    .replace("&lt;", "<").replace("&gt;", ">")
                    .replace("&amp;", "&"))
