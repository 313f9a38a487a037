"""``detok-plugin check``: what a server's streamed text gets wrong, measured from outside.

A fixed battery of streamed requests (CJK, emoji, ``n=2``, a prompt of ids that ends inside
a character, stop strings long and non-ASCII, a ``max_tokens`` that cuts a character) goes
to any OpenAI-compatible server that returns token ids (vLLM's ``return_token_ids``). Each
choice is checked against the tokenizer's own decode of the ids the server returned:

``exact``
    the joined deltas equal ``decode(prompt + out)[len(decode(prompt)):]`` (same
    ``skip_special_tokens`` as the server's default, True), cut before the stop string
    that ended it; a last character that ``max_tokens`` cut may be left out, as every
    stock detokenizer leaves it out.
``late``
    characters that reached the client in a later delta than the one whose ids complete
    them (not counting text a genuine partial stop match may still hold).
``U+FFFD``
    replacement characters sent where the final decode has none.
``stop leaked``
    choices whose text contains one of the request's stop strings.

Run it against a stock server and one with the plugin, side by side, to see what switching
the plugin on buys on your own model and tokenizer (docs/vllm.md). Nothing here imports a
serving stack: stdlib HTTP, and transformers for the tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["Case", "Row", "Streamed", "battery", "format_table", "run_check", "score", "stream"]

_FFFD = "\ufffd"
JAPANESE = "Say hello in Japanese and add an emoji."
CHINESE = "用中文介绍一下你自己。"
SPLIT_PROMPT = "日本語の挨拶は「こんにちは」です🫨"


@dataclasses.dataclass
class Choice:
    """One choice of a streamed response: its deltas, each with the ids it covers."""

    deltas: list[tuple[str, list[int]]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.deltas)

    @property
    def ids(self) -> list[int]:
        return [i for _, ids in self.deltas for i in ids]


@dataclasses.dataclass
class Streamed:
    prompt_ids: list[int]
    choices: dict[int, Choice]


@dataclasses.dataclass(frozen=True)
class Case:
    """One request of the battery."""

    name: str
    chat: bool
    prompt: str | tuple[int, ...]
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def stops(self) -> list[str]:
        stop = dict(self.params).get("stop") or []
        return [stop] if isinstance(stop, str) else list(stop)


@dataclasses.dataclass
class Row:
    """One request's figures, over its choices."""

    name: str
    choices: int = 0
    exact: int = 0
    late: int = 0
    fffd: int = 0
    leaked: int = 0


def _events(reply: Any) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream, up to ``[DONE]``."""
    for raw in reply:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _request(base_url: str, model: str, case: Case) -> urllib.request.Request:
    params = {"temperature": 0.0, **dict(case.params)}
    body: dict[str, Any] = {"model": model, "stream": True, "return_token_ids": True, **params}
    if case.chat:
        body["messages"] = [{"role": "user", "content": case.prompt}]
    else:
        body["prompt"] = list(case.prompt) if isinstance(case.prompt, tuple) else case.prompt
    path = "/chat/completions" if case.chat else "/completions"
    return urllib.request.Request(
        base_url.rstrip("/") + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
    )


def _take(out: Streamed, event: dict[str, Any], chat: bool) -> None:
    """One event's choices into ``out`` (the prompt's ids come with the first)."""
    out.prompt_ids = out.prompt_ids or list(event.get("prompt_token_ids") or [])
    for c in event.get("choices") or []:
        out.prompt_ids = out.prompt_ids or list(c.get("prompt_token_ids") or [])
        text = ((c.get("delta") or {}).get("content") or "") if chat else (c.get("text") or "")
        choice = out.choices.setdefault(c["index"], Choice())
        choice.deltas.append((text, list(c.get("token_ids") or [])))
        if c.get("finish_reason") is not None:
            choice.finish_reason, choice.stop_reason = c["finish_reason"], c.get("stop_reason")


def stream(base_url: str, model: str, case: Case, timeout: float = 300.0) -> Streamed:
    """One streamed request with the token ids of every delta."""
    out = Streamed([], {})
    with urllib.request.urlopen(_request(base_url, model, case), timeout=timeout) as reply:
        for event in _events(reply):
            _take(out, event, case.chat)
    if not out.prompt_ids or not any(c.ids for c in out.choices.values()):
        raise ValueError(f"{base_url} returned no token ids: detok-plugin check needs a server that "
                         "honours return_token_ids (vLLM 0.10.2 or later)")
    return out


def _text(tok: Any, prompt: Sequence[int], out: Sequence[int]) -> str:
    full = tok.decode(list(prompt) + list(out), skip_special_tokens=True)
    return str(full[len(tok.decode(list(prompt), skip_special_tokens=True)) :])


def _wanted(tok: Any, prompt: Sequence[int], choice: Choice) -> list[str]:
    """The texts an exact server may send: the decode cut at its stop string; without a
    stop, also without a last character no id completed (left out by stock servers)."""
    text = _text(tok, prompt, choice.ids)
    if isinstance(choice.stop_reason, str) and choice.stop_reason in text:
        return [text[: text.index(choice.stop_reason)]]
    if not text.endswith(_FFFD):
        return [text]
    ids = choice.ids
    return [text, text.rstrip(_FFFD), *(_text(tok, prompt, ids[: len(ids) - j]) for j in (1, 2, 3) if j < len(ids))]


def _partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:k]):
                best = k
                break
    return best


def _late(tok: Any, prompt: Sequence[int], choice: Choice, final: str, stops: Sequence[str]) -> int:
    """Characters sent in a later delta than the one whose ids complete them."""
    ids, late = choice.ids, set[int]()
    sent = seen = 0
    for k, (text, step) in enumerate(choice.deltas):
        sent, seen = sent + len(text), seen + len(step)
        now = _text(tok, prompt, ids[:seen])
        due = len(os.path.commonprefix([now, final]))
        if k < len(choice.deltas) - 1:  # a later id may still complete these bytes or a stop
            due = len(final[:due].rstrip(_FFFD))
            due -= _partial_stop(final[:due], stops)
        late.update(range(sent, due))
    return len(late)


def score(tok: Any, case: Case, got: Streamed) -> Row:
    """The figures of one streamed request."""
    row = Row(case.name)
    for choice in got.choices.values():
        wanted = _wanted(tok, got.prompt_ids, choice)
        text = choice.text
        row.choices += 1
        final = text if text in wanted else wanted[0]  # a cut character left out is not late
        row.exact += text in wanted
        row.late += _late(tok, got.prompt_ids, choice, final, case.stops)
        row.fffd += sum(1 for i, ch in enumerate(text) if ch == _FFFD and final[i : i + 1] != _FFFD)
        row.leaked += any(stop in text for stop in case.stops)
    return row


def _cut_inside_a_character(tok: Any, got: Streamed) -> int | None:
    ids = got.choices[0].ids
    return next((k for k in range(2, len(ids)) if _text(tok, got.prompt_ids, ids[:k]).endswith(_FFFD)), None)


def battery(tok: Any, probe: Streamed) -> list[Case]:
    """The requests after the probe (greedy Japanese chat): stops and cuts are taken from the
    probe's reply, so they really occur in what the model writes."""
    reply = _text(tok, probe.prompt_ids, probe.choices[0].ids)
    third = len(reply) // 3
    cases = [
        Case("chat, Chinese", True, CHINESE, (("max_tokens", 48),)),
        Case("chat, n=2 sampled", True, JAPANESE, (("max_tokens", 32), ("n", 2), ("temperature", 0.8), ("seed", 7))),
    ]
    ids = tok.encode(SPLIT_PROMPT, add_special_tokens=False)
    cut = next((k for k in range(len(ids) - 1, 0, -1) if tok.decode(ids[:k]).endswith(_FFFD)), None)
    if cut is not None:
        cases.append(Case("prompt ids end inside a character", False, tuple(ids[:cut]), (("max_tokens", 24),)))
    long_stop = reply[third : third + 32].rstrip(_FFFD)
    if len(long_stop) >= 12:
        cases.append(Case("long stop", True, JAPANESE, (("max_tokens", 64), ("stop", [long_stop, "zzzz-never"]))))
    wide = [i for i in range(third, len(reply) - 1) if not reply[i].isascii() and not reply[i + 1].isascii()]
    if wide:
        cases.append(Case("non-ASCII stop", True, JAPANESE, (("max_tokens", 64), ("stop", [reply[wide[0] : wide[0] + 2]]))))
    k = _cut_inside_a_character(tok, probe)
    if k is not None:
        cases.append(Case("max_tokens cuts a character", True, JAPANESE, (("max_tokens", k),)))
    return cases


def run_check(base_url: str, model: str, tok: Any) -> list[Row]:
    """The whole battery against one server."""
    first = Case("chat, Japanese + emoji", True, JAPANESE, (("max_tokens", 64),))
    probe = stream(base_url, model, first)
    rows = [score(tok, first, probe)]
    for case in battery(tok, probe):
        rows.append(score(tok, case, stream(base_url, model, case)))
    return rows


def format_table(rows: Sequence[Row], title: str = "") -> str:
    """The rows as a table an operator reads in seconds, with a total line."""
    head = ("request", "exact", "late chars", "U+FFFD sent", "stop leaked")
    body = [(r.name, f"{r.exact}/{r.choices}", str(r.late), str(r.fffd), f"{r.leaked}/{r.choices}") for r in rows]
    total = Row("total", *(sum(getattr(r, f) for r in rows) for f in ("choices", "exact", "late", "fffd", "leaked")))
    body.append((total.name, f"{total.exact}/{total.choices}", str(total.late), str(total.fffd), f"{total.leaked}/{total.choices}"))
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    fmt = "  ".join(("{:<%d}" if i == 0 else "{:>%d}") % widths[i] for i in range(len(head)))
    lines = [title] if title else []
    lines += [fmt.format(*head), *(fmt.format(*line) for line in body)]
    return "\n".join(lines)
