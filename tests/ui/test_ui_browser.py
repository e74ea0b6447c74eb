"""`yieldstar ui` in a real browser: Debian's headless Chromium loads the real server's pages
(uvicorn in a process of its own, on a free loopback port) and the DOM it builds has the
executions and the lease timeline.

Needs `chromium` on PATH (`apt-get install -y chromium`); skipped, saying so, without it. With
YIELDSTAR_UI_SCREENSHOTS=FOLDER it also saves the screenshots docs/ui.md shows there.
"""

from __future__ import annotations

import os

import pytest
from browser import chromium, needs_chromium
from ui_story import fill, start_ui, stop

pytestmark = needs_chromium


@pytest.mark.timeout(240)
def test_chromium_renders_the_executions_and_the_lease_timeline(sqlite_path, tmp_path):
    fill(sqlite_path)
    process, url = start_ui(sqlite_path, "--addr", "127.0.0.1:0")
    try:
        listing = chromium(tmp_path, "--dump-dom", url)
        for execution_id in ("order-1001", "order-1002", "order-1003", "report-7", "mail-1"):
            assert f'href="/executions/{execution_id}"' in listing
        detail = chromium(tmp_path, "--dump-dom", url + "executions/order-1001")
        svg = detail[detail.index('<svg class="timeline"'):detail.index("</svg>")]
        assert '<g class="delivery superseded" data-token="1">' in svg
        assert '<g class="delivery acknowledged" data-token="2">' in svg
        assert "↻1" in svg and "charge" in detail
        folder = os.environ.get("YIELDSTAR_UI_SCREENSHOTS")
        if folder:
            for name, path in (("list", ""), ("execution", "executions/order-1001"), ("queues", "queues"),
                               ("confirm", "cancel/order-1003")):
                chromium(tmp_path, f"--screenshot={os.path.join(folder, f'ui-{name}.png')}", "--window-size=1280,900",
                         url + path)
    finally:
        assert stop(process) == 0
