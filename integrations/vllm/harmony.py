"""gpt-oss's harmony format in vLLM's chat API: reasoning, content and tool calls by token id.

A gpt-oss reply is a run of messages, each a header then a body, delimited by special
tokens of the o200k_harmony vocabulary (the prompt ends in ``<|start|>assistant``)::

    <|channel|>analysis<|message|>Let me think.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "東京"}<|call|>
    <|start|>assistant<|channel|>final<|message|>Sure.<|return|>

The header (role, ``<|channel|>`` and its name, ``to=`` recipient, content type) is never
text. Its body goes where vLLM's own harmony parser (``vllm/parser/harmony.py``) sends it:
a ``functions.*`` recipient makes a tool call; channel ``analysis`` is reasoning; ``final``,
and ``commentary`` with no recipient, are content; anything else (built-in tools) is dropped.
A tool call is sent once the model has finished it, whole, as ``detok_plugin.ChatStream``
sends one: at its message's end marker (``<|call|>``), or at the end of the reply when its
body is complete (a JSON body that parses; ``<|call|>`` is a stop token, so a finished reply
often ends without it). A reply cut inside a call's JSON has no call, streamed or not.
``stream_arguments=True`` (the request's ``detok_stream_arguments``) sends the name at
``<|message|>`` and the arguments as they form instead, with that option's risk.

:class:`HarmonyChannels` keeps the interface of ``detok_plugin.ChatStream`` (``step(ids,
finished) -> ChatParts``, ``complete``). Markers are found by id, so nothing of them reaches a
channel however the detokenizer's ``skip_special_tokens`` is set; each body is decoded by a
:class:`detok_plugin.DetokenizerState` of its own (a character split across tokens waits for
its last byte). Stop strings cut reasoning and content bodies: the detokenizer, which
cannot tell harmony's channels apart, cuts them anywhere (stock's rule), and the engine
then ends the request; the parser cuts at the same place.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from detok_plugin import ChatParts, DetokenizerState, TokenIdError

from . import _framework
from .tool_ids import call_counter, new_call_id

__all__ = ["HarmonyChannels", "Header", "harmony_ids"]

logger = logging.getLogger("vllm.detok_plugin")

_api = _framework.chat_api()

_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]*)")
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")


class Ids(NamedTuple):
    """The harmony markers' ids in one tokenizer."""

    start: int
    channel: int
    message: int
    end: int
    ret: int
    call: int


@functools.lru_cache(maxsize=8)
def harmony_ids(tokenizer: Any) -> Ids:
    """The marker ids; ValueError if the tokenizer is not an o200k_harmony one."""
    names = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
    ids = [tokenizer.convert_tokens_to_ids(n) for n in names]
    unk = getattr(tokenizer, "unk_token_id", None)
    missing = [n for n, i in zip(names, ids, strict=True) if not isinstance(i, int) or i == unk]
    if missing:
        raise ValueError(f"detok_gpt_oss needs gpt-oss's tokenizer (o200k_harmony); this one has no {missing}")
    return Ids(*ids)


class Header(NamedTuple):
    """One message's header: where its body goes."""

    channel: str | None
    recipient: str | None
    content_type: str | None

    @classmethod
    def parse(cls, text: str) -> Header:
        """From the header's text (special tokens kept), e.g. ``assistant<|channel|>commentary
        to=functions.f <|constrain|>json``."""
        channel = _CHANNEL.search(text)
        recipient = _RECIPIENT.search(text)
        rest = text[channel.end() :] if channel else ""
        rest = _RECIPIENT.sub(" ", rest).replace("<|constrain|>", " ").strip()
        return cls(channel.group(1) if channel else None, recipient.group(1) if recipient else None, rest or None)

    def kind(self) -> str:
        """``tool``, ``reasoning``, ``content`` or ``ignore``, as vLLM's harmony parser decides."""
        if self.recipient and _api.is_function_recipient(self.recipient):
            return "tool"
        if self.channel == "analysis":
            return "reasoning"
        if self.channel == "final" or (self.channel == "commentary" and self.recipient is None):
            return "content"
        return "ignore"


class HarmonyChannels:
    """One request's harmony messages, read by id into reasoning, content and tool calls."""

    def __init__(
        self, parser: Any, request: Any, prompt: Sequence[int], *, streaming: bool = True, stream_arguments: bool = False
    ) -> None:
        self.call_ids = call_counter(parser)  # not the parser, which holds this object
        self.request = request
        self.streaming = streaming
        self.stream_arguments = streaming and stream_arguments
        self.tokenizer = parser.model_tokenizer
        self.ids = harmony_ids(self.tokenizer)
        self.reasoning_on = parser.reasoning_parser is not None
        self.tools_on = parser.tool_parser is not None
        self.header_ids: list[int] = []
        self.header: Header | None = None  # None: reading a header
        self.state: DetokenizerState | None = None
        self.body: list[str] = []
        self.calls = 0
        self.done = False  # a stop string ended the reply
        self.complete: list[tuple[str, str]] = []
        self.messages: list[tuple[str, str]] = []  # (kind, text) of each finished body
        self._resume(prompt)

    def _resume(self, prompt: Sequence[int]) -> None:
        """Start where the prompt leaves off: in a header after its last ``<|start|>`` (the
        template's ``<|start|>assistant``), or inside a body when the prompt ends after a
        header's ``<|message|>`` (a prefilled answer, which the body's stream continues)."""
        ids = self.ids
        markers = (ids.start, ids.message, ids.end, ids.ret, ids.call)
        last = next((i for i in range(len(prompt) - 1, -1, -1) if prompt[i] in markers), -1)
        if last < 0 or prompt[last] != ids.message:
            self.header_ids = list(prompt[last + 1 :]) if last >= 0 and prompt[last] == ids.start else []
            return
        start = next((i for i in range(last - 1, -1, -1) if prompt[i] == ids.start), -1)
        self.header_ids = list(prompt[start + 1 : last])
        self._open(ChatParts(), body_prompt=prompt[last + 1 :])

    def message(self, ids: Sequence[int], finished: bool) -> dict[str, Any] | None:
        """One streamed step's delta fields (or None), as ``ChatStream.message``."""
        return self.step(ids, finished).fields(getattr(self.request, "include_reasoning", True))

    def step(self, ids: Sequence[int], finished: bool) -> ChatParts:
        parts = ChatParts()
        for tid in ids:
            if self.done:
                break
            self._one(tid, parts)
        if finished and self.header is not None:
            self._close(parts, at_end=True)
        return parts

    def _one(self, tid: int, parts: ChatParts) -> None:
        ids = self.ids
        if self.header is None:
            if tid == ids.message:
                self._open(parts)
            elif tid == ids.start:
                self.header_ids = []
            else:
                self.header_ids.append(tid)
            return
        if tid in (ids.end, ids.ret, ids.call, ids.start):
            self._close(parts)
            if tid == ids.start:  # a new message with no end marker before it
                self.header_ids = []
            return
        assert self.state is not None
        try:
            delta = self.state.push(tid)
        except TokenIdError as exc:
            logger.warning("detok-plugin: %s; the chat parser skips it", exc)
            return
        self._route(delta.text, parts)
        if self.state.finished:  # a stop string
            self.done = True

    def _open(self, parts: ChatParts, body_prompt: Sequence[int] = ()) -> None:
        text = self.tokenizer.decode(self.header_ids, skip_special_tokens=False)
        self.header = Header.parse(text)
        self.header_ids = []
        self.body = []
        cut = self.header.kind() in ("content", "reasoning")
        self.state = DetokenizerState.from_tokenizer(
            self.tokenizer,
            prompt_ids=body_prompt,
            skip_special_tokens=True,
            stop=_stops(self.request) if cut else (),
            stop_token_ids=(),
            eos_token_ids=(),
            include_stop_str_in_output=bool(getattr(self.request, "include_stop_str_in_output", False)),
            keep_log=False,
        )
        if self.header.kind() == "tool" and self.tools_on and self.stream_arguments:
            assert self.header.recipient is not None
            name = _api.extract_function_from_recipient(self.header.recipient)
            parts.tool(self.calls, id=self._new_id(name), name=name)

    def _close(self, parts: ChatParts, *, at_end: bool = False) -> None:
        """A message ends: at its end marker, or (``at_end``) with the reply."""
        header, state = self.header, self.state
        assert header is not None and state is not None
        if not state.finished:
            self._route(state.finish().text, parts)
        kind, text = header.kind(), "".join(self.body)
        self.messages.append((kind, text))
        if kind == "tool" and self.tools_on:
            assert header.recipient is not None
            name = _api.extract_function_from_recipient(header.recipient)
            if at_end and not _finished_body(text, header.content_type):
                logger.warning("detok-plugin: the reply ended inside tool call %r; the unfinished call is dropped", name)
            else:
                arguments = _arguments(text, header.content_type)
                self.complete.append((name, arguments))
                if self.streaming and not self.stream_arguments:
                    parts.tool(self.calls, id=self._new_id(name), name=name, args=arguments)
                self.calls += 1
        self.header, self.state = None, None

    def _route(self, text: str, parts: ChatParts) -> None:
        if not text:
            return
        self.body.append(text)
        assert self.header is not None
        kind = self.header.kind()
        if not self.streaming:
            return
        if kind == "reasoning" and self.reasoning_on:
            parts.reasoning.append(text)
        elif kind == "content":
            parts.content.append(text)
        elif kind == "tool" and self.tools_on and self.stream_arguments:
            parts.tool(self.calls, args=text)

    def joined(self) -> tuple[str | None, str | None]:
        """Reasoning and content of a whole reply (non-streaming): message bodies joined by
        newlines, as vLLM's harmony parser joins them."""
        reasoning = "\n".join(t for k, t in self.messages if k == "reasoning" and t) if self.reasoning_on else ""
        content = "\n".join(t for k, t in self.messages if k == "content" and t)
        return reasoning or None, content or None

    def _new_id(self, name: str) -> str:
        return new_call_id(self.call_ids, name)


def _arguments(text: str, content_type: str | None) -> str:
    """A finished call's arguments as vLLM's harmony parser gives them: JSON re-serialized
    when the content type is JSON (or unsaid) and the text parses, else the text."""
    if content_type is not None and "json" not in content_type:
        return text
    try:
        return json.dumps(json.loads(text))
    except json.JSONDecodeError:
        return text


def _finished_body(text: str, content_type: str | None) -> bool:
    """Whether a call's body that the reply ended in is complete: a JSON body (the content
    type JSON, or unsaid) must parse; another body has no end but its marker."""
    if content_type is not None and "json" not in content_type:
        return False
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _stops(request: Any) -> tuple[str, ...]:
    stop = getattr(request, "stop", None)
    return (stop,) if isinstance(stop, str) else tuple(stop or ())
