"""The page of ``detok-plugin serve`` in a real headless browser: Debian's chromium, driven by
playwright (``scripts/setup.sh`` installs both; pip's playwright cannot download a browser
here, so it is pointed at ``/usr/bin/chromium``).

The page streams the same greedy reply twice and reads each HTTP body with the browser's own
``TextDecoder`` in streaming mode. On a Japanese and emoji reply the naive pane must show
U+FFFD (made by the browser's decoder meeting a split character's bytes, or by the server's
per-token decode) and the plugin pane none, equal to the model's full decode.

The badge's verdict is checked without a model: playwright serves the page and holds or
answers its two requests itself, so the test sees the badge before any event has arrived,
after a complete stream, and after one cut off before its final event.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (scripts/setup.sh installs it)")

from detok_plugin.gpu_runner import GenerationSettings, Runner  # noqa: E402
from detok_plugin.gpu_runner.prompts import DEFAULT_CHAT_PROMPT  # noqa: E402
from detok_plugin.gpu_runner.serve import defaults_for, render_page, running  # noqa: E402
from detok_plugin.gpu_runner.verify import naive_text  # noqa: E402

from detok_plugin import build_table  # noqa: E402

MAX_TOKENS = 40
FFFD = "\ufffd"
ENDED = ", ".join(f"#{{pane}}[data-state={state}]" for state in ("done", "cut", "error"))


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Debian's chromium is not installed: scripts/setup.sh installs it with apt-get when run as root")
    return path


@pytest.fixture(scope="module")
def browser() -> Any:
    path = chromium_path()
    with sync_api.sync_playwright() as p:
        try:
            # --no-sandbox: chromium refuses to start its sandbox as root, as tests here run.
            b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        except sync_api.Error as exc:
            pytest.skip(f"chromium at {path} does not start under playwright: {exc}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(runner: Runner) -> Any:
    with running(runner, defaults_for(runner, GenerationSettings(max_new_tokens=64))) as url:
        yield url


@pytest.fixture(scope="module")
def reply(runner: Runner) -> Any:
    """The model's own reply to the page's default prompt, generated here without the server."""
    tok = runner.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": DEFAULT_CHAT_PROMPT}], add_generation_prompt=True,
                                   tokenize=False)
    prompt = tok.encode(text, add_special_tokens=False)
    return runner.generate([prompt], GenerationSettings(max_new_tokens=MAX_TOKENS, chat_template=False)).sequences[0]


def run_page(browser: Any, url: str, mode: str, shot: Path) -> dict[str, Any]:
    page = browser.new_page(viewport={"width": 1280, "height": 640})
    try:
        page.goto(f"{url}/?autorun=1&mode={mode}&max_tokens={MAX_TOKENS}")
        for pane in ("naive", "plugin"):
            page.wait_for_selector(ENDED.format(pane=pane), timeout=240_000)
        page.screenshot(path=str(shot))
        return {pane: {"state": page.get_attribute(f"#{pane}", "data-state"),
                       "text": page.text_content(f"#{pane}-out"),
                       "fffd": int(page.get_attribute(f"#{pane}", "data-fffd") or -1),
                       "error": page.text_content(f"#{pane}-err")}
                for pane in ("naive", "plugin")}
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bytes", "decode"])
def test_page_shows_fffd_naively_and_none_through_the_plugin(
    browser: Any, server: str, runner: Runner, reply: Any, mode: str, tmp_path: Path
) -> None:
    seen = run_page(browser, server, mode, tmp_path / f"page-{mode}.png")
    naive, ours = seen["naive"], seen["plugin"]
    assert naive["state"] == ours["state"] == "done", (naive["error"], ours["error"])
    # Through the plugin: the model's full decode, no U+FFFD.
    assert ours["text"] == reply.text and FFFD not in ours["text"] and ours["fffd"] == 0
    # Naively: the same tokens, U+FFFD where a character was split. In the byte mode the
    # browser's decoder made them, one per broken run of bytes, as it does for each token's
    # bytes decoded alone; in the decode mode the server's per-token decode did.
    if mode == "bytes":
        pieces = build_table(runner.tokenizer)[0].pieces
        want = "".join(pieces[i].decode("utf-8", errors="replace") for i in reply.text_ids)
    else:
        want = naive_text(runner.tokenizer, reply.text_ids, skip_special_tokens=True)
    assert naive["text"] == want
    assert naive["fffd"] == want.count(FFFD) > 0


# --- the badge waits for the stream's final event ----------------------------------------

PAGE_URL = "http://detok.test/"


def sse_body(*events: Any, done: bool = True) -> str:
    """An SSE body of chat chunks, each ``(content, finish_reason)``, then ``[DONE]`` if ``done``."""
    out = []
    for content, finish in events:
        delta = {"content": content} if content else {}
        out.append("data: " + json.dumps({"object": "chat.completion.chunk",
                                          "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
    if done:
        out.append("data: [DONE]")
    return "".join(e + "\n\n" for e in out)


def badge(page: Any, pane: str) -> tuple[str | None, str | None, str | None]:
    """The pane's state, its badge's class and its badge's text."""
    return (page.get_attribute(f"#{pane}", "data-state"), page.get_attribute(f"#{pane}-count", "class"),
            page.text_content(f"#{pane}-count"))


@pytest.mark.parametrize(
    ("cut_body", "why"),
    [
        pytest.param(sse_body(("こん", None), done=False), "before its final event", id="no-finish-no-done"),
        pytest.param(sse_body(("こん", None)), "before its final event", id="done-without-finish"),
        pytest.param(sse_body(("こん", None), ("", "stop"), done=False), "without data: [DONE]", id="finish-without-done"),
    ],
)
def test_badge_gives_no_verdict_before_the_stream_ends(browser: Any, cut_body: str, why: str) -> None:
    """The report: the badge turned green ("U+FFFD: 0") before any event had arrived, so a run
    cut off early looked like a pass. Both requests are held here until the badges are read."""
    page = browser.new_page()
    held: dict[str, Any] = {}

    def handle(route: Any) -> None:
        url = route.request.url
        if url == PAGE_URL or url.startswith(PAGE_URL + "?"):
            route.fulfill(status=200, content_type="text/html; charset=utf-8", body=render_page("test-model"))
        else:
            held["naive" if "/naive/" in url else "plugin"] = route

    try:
        page.route(f"{PAGE_URL}**", handle)
        page.goto(f"{PAGE_URL}?autorun=1&mode=decode")
        page.wait_for_function("document.getElementById('naive').dataset.state === 'running'"
                               " && document.getElementById('plugin').dataset.state === 'running'")
        while len(held) < 2:
            page.wait_for_timeout(20)
        # Before any event: no verdict, neither green nor red.
        for pane in ("naive", "plugin"):
            state, cls, text = badge(page, pane)
            assert state == "running" and cls is not None and cls.split() == ["count"], (pane, cls, text)
            assert text == "U+FFFD: 0 so far…"
        # A complete stream: its final event, then [DONE]: green.
        held["plugin"].fulfill(status=200, content_type="text/event-stream",
                               body=sse_body(("こん", None), ("にちは", None), ("", "stop")))
        page.wait_for_selector(ENDED.format(pane="plugin"))
        assert badge(page, "plugin") == ("done", "count good", "U+FFFD: 0")
        assert page.text_content("#plugin-out") == "こんにちは"
        # A stream that ends short of its final event: its own state, amber, never green.
        held["naive"].fulfill(status=200, content_type="text/event-stream", body=cut_body)
        page.wait_for_selector(ENDED.format(pane="naive"))
        assert badge(page, "naive") == ("cut", "count cut", "U+FFFD: 0 · cut off")
        assert why in (page.text_content("#naive-err") or "")
    finally:
        page.close()
