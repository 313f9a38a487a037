"""Segment edges: the whitespace a chat template writes next to its markup is markup.

A chat reply's text comes in segments: a run of content or of reasoning between two pieces
of markup, the reply's start and end counting as markup (the generation prompt before it,
the end token after it). Templates write whitespace beside their markup: ``<think>\\n`` and
``\\n</think>\\n\\n`` (Qwen3, DeepSeek), a space after ``[/INST]`` (Mistral's SentencePiece
prefix space), a line before ``<tool_call>``; models learn to write it. The one rule of the
chat layer (``ChatStream``, for a request whose reasoning or tool tags are live):
**whitespace at the edges of a reasoning or content segment is markup, not text.**

* Leading whitespace of a segment is dropped as it arrives.
* Trailing whitespace waits: the next character of the same segment shows it was text (it
  then leaves with that character), markup or the reply's end shows it was an edge (it is
  dropped). It is the wait a partial tag already costs (``<`` may begin ``<tool_call>``):
  a token ending in a newline leaves with the token after it.

Whitespace inside a segment is untouched. A tool call is no edge of content: it goes out of
band, and the content on both sides of it is one segment (``Before. <call> After.`` keeps
both spaces; ``Let me check.\n<call>`` at the reply's end drops the newline). A client reads the same reply as stock vLLM's
parsers give it modulo this rule (and CanIToolCall's soft comparison, ``str.strip`` on each
field, becomes a strict one).

>>> edge = Edge()
>>> [edge.take(t) for t in ("\\n", "Let", " me", " see.", "\\n\\n", "Then")]
['', 'Let', ' me', ' see.', '', '\\n\\nThen']
>>> edge.take(".\\n"), edge.held
('.', '\\n')
>>> edge.end(); edge.held, edge.open
('', False)
"""

from __future__ import annotations

__all__ = ["Edge"]


class Edge:
    """One channel's current segment edge (content or reasoning).

    ``open``: the segment has sent text that is not whitespace (then its leading edge is
    behind it); ``held``: its trailing whitespace so far, not yet sent.
    """

    __slots__ = ("open", "held")

    def __init__(self) -> None:
        self.open = False
        self.held = ""

    def passes(self, text: str) -> bool:
        """``text`` (not empty) leaves unchanged: nothing held, not at the segment's start,
        and it does not end in whitespace (the shortcut's test)."""
        return self.open and not self.held and not text[-1].isspace()

    def take(self, text: str) -> str:
        """Text of the segment: what of it (and of what was held) leaves now."""
        if self.open:
            text = self.held + text
        else:
            text = text.lstrip()  # the leading edge
            if not text:
                return ""
            self.open = True
        sent = text.rstrip()
        self.held = text[len(sent) :]
        return sent

    def end(self) -> None:
        """Markup or the reply's end: what was held was the segment's trailing edge."""
        self.open = False
        self.held = ""
