"""The OpenAI request and response shapes ``detok-plugin serve`` speaks: checked in, built out.

A request body becomes one :class:`GenerationRequest` (prompt ids, ``n``, ``max_tokens``,
stops, sampling) or a :class:`RequestError` that names the offending field, which the server
turns into a 4xx JSON body in OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": null}}

Fields are checked, not coerced: ``"n": "2"`` is an error, as is a field the runner cannot
honour and that would change the output (``logprobs``, ``top_p`` below 1, penalties, tools,
images). Fields that change nothing here (``user``, ``metadata``, ...) are ignored, as
OpenAI clients send them freely.

Two extensions vLLM also accepts: ``top_k``, ``skip_special_tokens`` and
``return_token_ids`` (each choice's chunk carries the ids it consumed, so a client can check
the text against the tokenizer's own decode).

>>> sse({"a": "こんにちは"})
b'data: {"a":"\\xe3\\x81\\x93\\xe3\\x82\\x93\\xe3\\x81\\xab\\xe3\\x81\\xa1\\xe3\\x81\\xaf"}\\n\\n'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .errors import PromptError, PromptTypeError

if TYPE_CHECKING:
    from .runner import Runner

__all__ = [
    "Envelope",
    "GenerationRequest",
    "RequestError",
    "ServeDefaults",
    "parse_request",
    "sse",
    "usage",
]

Kind = Literal["chat", "completion"]

#: Fields whose presence (with a value other than the neutral one) would change the output
#: in a way the reference runner does not implement: refused rather than silently ignored.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "top_p": (None, 1, 1.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None,),
    "tools": (None,),
    "functions": (None,),
    "response_format": (None,),
}
_ROLES = frozenset({"system", "developer", "user", "assistant"})


class RequestError(ValueError):
    """A request the server refuses, with the HTTP status and the field to fix."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, kind: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True, slots=True)
class ServeDefaults:
    """What the server fills in for a field a request leaves out, and its limits."""

    model: str
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    skip_special_tokens: bool = True
    context: int = 2048
    max_n: int = 16


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One checked request: everything the scheduler and the response writer need."""

    kind: Kind
    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int
    temperature: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    skip_special_tokens: bool
    return_token_ids: bool

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def parse_request(body: Any, kind: Kind, *, runner: Runner, defaults: ServeDefaults) -> GenerationRequest:
    """Check a decoded JSON body against ``kind``'s schema and encode its prompt.

    Raises :class:`RequestError` (status 400, or 404 for an unknown model) naming the field.
    """
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != defaults.model:
        raise RequestError(f"the model {model!r} does not exist; this server has {defaults.model!r}",
                           param="model", status=404, kind="not_found_error")
    for name, neutral in _NEUTRAL.items():
        if name in body and body[name] not in neutral:
            raise RequestError(f"{name!r} is not supported by this server", param=name)
    prompt_ids = _chat_prompt(body, runner) if kind == "chat" else _completion_prompt(body, runner)
    stream, include_usage = _streaming(body)
    return GenerationRequest(
        kind=kind,
        prompt_ids=tuple(prompt_ids),
        n=_int(body, "n", 1, 1, defaults.max_n),
        max_tokens=_max_tokens(body, kind, len(prompt_ids), defaults),
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
        top_k=_top_k(body, defaults.top_k),
        seed=_seed(body),
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        skip_special_tokens=_bool(body, "skip_special_tokens", defaults.skip_special_tokens),
        return_token_ids=_bool(body, "return_token_ids", False),
    )


def sse(obj: Any) -> bytes:
    """One Server-Sent Event carrying ``obj`` as compact JSON, non-ASCII as raw UTF-8."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


# --- prompts --------------------------------------------------------------------------


def _chat_prompt(body: Mapping[str, Any], runner: Runner) -> list[int]:
    """``messages`` through the tokenizer's chat template, with the assistant's turn opened."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    clean = [_message(m, i) for i, m in enumerate(messages)]
    tok = runner.tokenizer
    if not getattr(tok, "chat_template", None):
        raise RequestError("this model has no chat template; send a prompt to /v1/completions", param="messages")
    text = tok.apply_chat_template(clean, add_generation_prompt=True, tokenize=False)
    return _encode(runner, tok.encode(text, add_special_tokens=False), "messages")


def _message(m: Any, i: int) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, Mapping) or m.get("role") not in _ROLES:
        raise RequestError(f"{where} must be an object with 'role' one of {sorted(_ROLES)}", param=where)
    content = m.get("content")
    if isinstance(content, list):  # the parts form: only text parts can reach this model
        if not all(isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RequestError(f"{where}.content: only text parts are supported", param=f"{where}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    role = "system" if m["role"] == "developer" else m["role"]
    return {"role": role, "content": content}


def _completion_prompt(body: Mapping[str, Any], runner: Runner) -> list[int]:
    """``prompt``: a string (encoded as is, no chat template) or a list of token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise RequestError("one prompt per request: send each string in its own request", param="prompt")
    if not isinstance(prompt, (str, list)):
        raise RequestError("'prompt' must be a string or a list of token ids", param="prompt")
    return _encode(runner, prompt, "prompt")


def _encode(runner: Runner, prompt: str | list[int], param: str) -> list[int]:
    try:
        return runner.encode(prompt, chat_template=False)
    except (PromptError, PromptTypeError) as exc:
        raise RequestError(f"'{param}' {exc}", param=param) from exc


# --- scalar fields ---------------------------------------------------------------------


def _max_tokens(body: Mapping[str, Any], kind: Kind, prompt_len: int, defaults: ServeDefaults) -> int:
    """``max_tokens`` (chat also takes ``max_completion_tokens``), within the context."""
    room = defaults.context - prompt_len
    if room < 1:
        raise RequestError(f"the prompt has {prompt_len} tokens; this model's context is {defaults.context}",
                           param="messages" if kind == "chat" else "prompt")
    name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get(name) is None:
        return min(defaults.max_tokens, room)
    value = _int(body, name, 0, 1, None)
    if value > room:
        raise RequestError(f"'{name}' is {value}, but the prompt ({prompt_len} tokens) leaves room for {room} "
                           f"in this model's context of {defaults.context}", param=name)
    return value


def _int(body: Mapping[str, Any], name: str, default: int, lo: int, hi: int | None) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name!r} must be an integer, got {value!r}", param=name)
    if value < lo or (hi is not None and value > hi):
        span = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(f"{name!r} must be {span}, got {value}", param=name)
    return value


def _number(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise RequestError(f"{name!r} must be a number between {lo} and {hi}, got {value!r}", param=name)
    return float(value)


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name!r} must be true or false, got {value!r}", param=name)
    return value


def _streaming(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """``stream``, and ``stream_options.include_usage`` (only allowed with ``stream``)."""
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, Mapping):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    if not stream:
        raise RequestError("'stream_options' is only allowed with 'stream': true", param="stream_options")
    return stream, _bool(options, "include_usage", False)


def _seed(body: Mapping[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}", param="seed")
    return seed


def _top_k(body: Mapping[str, Any], default: int) -> int:
    # vLLM's spelling of "no top-k" is -1; the runner's is 0.
    value = _int(body, "top_k", default, -1, None)
    return 0 if value == -1 else value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``stop``: a string or a list of up to 4 non-empty strings (OpenAI's limit)."""
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("'stop' must be a non-empty string or a list of up to 4 of them", param="stop")
    return tuple(stops)


# --- responses ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """What every chunk and response of one request shares: id, creation time, model."""

    kind: Kind
    id: str
    created: int
    model: str

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        """A streaming chunk (``chat.completion.chunk`` or ``text_completion``)."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out: dict[str, Any] = {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                               "choices": choices}
        if usage is not None:
            out["usage"] = usage
        return out

    def choice(self, index: int, text: str, finish_reason: str | None = None, stop_reason: str | int | None = None,
               *, first: bool = False, token_ids: list[int] | None = None) -> dict[str, Any]:
        """One choice of a streaming chunk; ``first`` opens a chat choice with its role."""
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            if finish_reason is not None and not text:
                delta = {}
            out: dict[str, Any] = {"index": index, "delta": delta}
        else:
            out = {"index": index, "text": text}
        out.update(logprobs=None, finish_reason=finish_reason)
        if finish_reason is not None:
            out["stop_reason"] = stop_reason
        if token_ids is not None:
            out["token_ids"] = token_ids
        return out

    def response(self, choices: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
        """The whole, non-streamed answer; ``choices`` as :meth:`whole_choice` builds them."""
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage}

    def whole_choice(self, index: int, text: str, finish_reason: str, stop_reason: str | int | None,
                     token_ids: list[int] | None) -> dict[str, Any]:
        if self.kind == "chat":
            out: dict[str, Any] = {"index": index, "message": {"role": "assistant", "content": text}}
        else:
            out = {"index": index, "text": text}
        out.update(logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
        if token_ids is not None:
            out["token_ids"] = token_ids
        return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
