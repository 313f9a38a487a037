"""The differential fuzz's CI slice (``benchmarks/fuzz.py --ci``): 250 streams from a fixed
seed over the core tests' tokenizers and WordPiece, through every layer a server uses
(``ServingStream``, ``TaggedServingStream``, ``ChatStream``, the vLLM adapter in vLLM's real
``OutputProcessor``, the TGI shim's ``RequestText``), each checked against the tokenizer's
decode. The full run (100,000 streams) and its figures are in docs/benchmarks.md."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz  # noqa: E402
from _fuzz_cases import BODIES, formats_without_bodies  # noqa: E402
from _fuzz_hosts import vllm_missing  # noqa: E402
from _fuzz_layers import LAYERS  # noqa: E402


def test_the_ci_slice_of_the_fuzz_finds_no_failure():
    layers = [layer for layer in LAYERS if layer != "vllm" or vllm_missing() is None]
    ci = fuzz.CI
    summary = fuzz.run(ci["streams"], ci["seed"], layers, ci["tokenizers"])
    assert summary.streams == ci["streams"] and sum(summary.by_layer.values()) == ci["streams"]
    assert not summary.failures, "\n".join(summary.lines(layers, ci["tokenizers"]))


def test_every_registered_tool_format_has_bodies_to_draw():
    """A chat layer draws any registered preset: its format's bodies must be there (a draw
    without them raises KeyError), and at least one of them must parse."""
    from detok_plugin import families

    assert formats_without_bodies() == []
    for fmt, bodies in BODIES.items():
        parsed = []
        for body in bodies:
            try:
                parsed.append(families.parse_tool_body(body.strip(), fmt))
            except (ValueError, TypeError):
                continue
        assert parsed, f"no body of {fmt!r} parses"
