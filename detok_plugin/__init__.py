"""detok-plugin: exact, prompt, O(1) streaming detokenization for LLM serving stacks.

The core is pure Python and imports no framework. Start with
:class:`IncrementalDetokenizer` (one id in, new text out) or
:meth:`DetokenizerState.from_tokenizer` (stops, tags, channels, several ids per push).
"""

from __future__ import annotations

from . import families
from ._chat import ChatParts, ChatStream, live_tags
from ._delta import Delta, Segment
from ._edges import Edge
from ._errors import (
    DetokError,
    StreamFinishedError,
    TokenIdError,
    TokenTypeError,
    UnsupportedTokenizerError,
)
from ._options import forget
from ._serving import ServingStream
from ._simple import IncrementalDetokenizer
from ._state import DetokenizerState
from ._table_build import build_table
from ._tables import TokenTable, decode_with_table
from ._tagged import TaggedServingStream
from ._tags import TagSet, ToolCall
from .families import parse_tool_body

__version__ = "0.1.0"

__all__ = [
    "ChatParts",
    "ChatStream",
    "Delta",
    "DetokError",
    "DetokenizerState",
    "Edge",
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
]
