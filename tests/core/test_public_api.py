"""The public surface and the import boundary."""

from __future__ import annotations

import inspect
import subprocess
import sys

import detok_plugin
from detok_plugin import _errors

PUBLIC = {
    "ChatParts",
    "ChatStream",
    "Delta",
    "Edge",
    "DetokError",
    "DetokenizerState",
    "IncrementalDetokenizer",
    "Segment",
    "ServingStream",
    "StreamFinishedError",
    "TagSet",
    "TaggedServingStream",
    "TokenIdError",
    "TokenTable",
    "TokenTypeError",
    "ToolCall",
    "UnsupportedTokenizerError",
    "build_table",
    "decode_with_table",
    "families",
    "forget",
    "live_tags",
    "parse_tool_body",
}


def test_all_is_sorted_and_exactly_the_public_names():
    assert detok_plugin.__all__ == sorted(detok_plugin.__all__)
    assert set(detok_plugin.__all__) == PUBLIC
    for name in detok_plugin.__all__:
        assert getattr(detok_plugin, name) is not None


def test_every_exception_is_exported_and_derives_from_the_base():
    errors = {n for n, o in vars(_errors).items() if inspect.isclass(o) and issubclass(o, Exception)}
    assert errors <= set(detok_plugin.__all__)
    for n in errors:
        assert issubclass(getattr(detok_plugin, n), detok_plugin.DetokError)


def test_core_imports_no_framework():
    """Import the core with torch, transformers, tokenizers and vllm blocked, and use it."""
    code = (
        "import sys\n"
        "for m in ('torch', 'transformers', 'tokenizers', 'vllm', 'numpy'):\n"
        "    sys.modules[m] = None\n"
        "import detok_plugin\n"
        "from detok_plugin import TokenTable, IncrementalDetokenizer\n"
        "t = TokenTable('byte_level', (b'\\xf0\\x9f', b'\\xab', b'\\xa8'), frozenset())\n"
        "d = IncrementalDetokenizer(t, [])\n"
        "assert [d.push(0), d.push(1), d.push(2)] == ['', '', '\\U0001fae8']\n"
        "assert not any(m in sys.modules and sys.modules[m] is not None for m in ('torch', 'transformers', 'vllm'))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_unsupported_tokenizer_is_a_typed_error():
    import pytest

    with pytest.raises(detok_plugin.UnsupportedTokenizerError):
        detok_plugin.DetokenizerState.from_tokenizer(object())


def test_py_typed_ships():
    from importlib import resources

    assert resources.files("detok_plugin").joinpath("py.typed").is_file()
