"""Take docs/serve-page.png: the page of ``detok-plugin serve`` after one run, in headless chromium.

    .venv/bin/python scripts/serve_screenshot.py [--mode bytes|decode] [--out docs/serve-page.png]

Starts the server in this process on a free port of 127.0.0.1 (SmolLM2 on CPU), opens the
page in Debian's chromium through playwright with ``autorun``, waits until both panes are
done and saves a screenshot. Japanese and emoji need fonts chromium can find (on Debian:
``apt-get install fonts-ipafont-gothic fonts-noto-color-emoji``); without them the text is
right and the glyphs are boxes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["bytes", "decode"], default="bytes")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "serve-page.png")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")

    from detok_plugin.gpu_runner import GenerationSettings, Runner
    from detok_plugin.gpu_runner.serve import defaults_for, running
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        print("chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 2
    runner = Runner.load(device="cpu")
    with running(runner, defaults_for(runner, GenerationSettings(max_new_tokens=64))) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 440})
        page.goto(f"{url}/?autorun=1&mode={args.mode}&max_tokens={args.max_tokens}")
        for pane in ("naive", "plugin"):
            page.wait_for_selector(f"#{pane}[data-state=done]", timeout=240_000)
        page.screenshot(path=str(args.out), full_page=True)
        counts = {pane: page.get_attribute(f"#{pane}", "data-fffd") for pane in ("naive", "plugin")}
        browser.close()
    print(f"wrote {args.out}: U+FFFD naive {counts['naive']}, detok-plugin {counts['plugin']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
