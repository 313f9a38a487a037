"""The differential fuzz's inputs (``fuzz.py``): the tokenizers, and one random case per seed.

Every tokenizer ``tokenizer_zoo`` builds (its ``NAMES``, the two it builds for vLLM's
tests, ``llama3`` and ``gpt_oss``, and the newer families' of ``tokenizer_zoo_more``:
Llama 4's ``<|python_start|>``, DeepSeek V3.2's DSML, Gemma 4's tool markers as special
tokens, ...), and the WordPiece tokenizer ``tests/core/test_wordpiece.py``
builds (BERT's normalizer, pre-tokenizer and decoder over a small vocabulary, wrapped in
``BertTokenizerFast``: the generic path). A case is drawn from its seed alone: prompt and
output ids (real multilingual text cut anywhere, so prompts and pieces end inside
characters; random ids, special ids, lone byte pieces; for the chat layers, tags, partial
tags and tool-call bodies of a preset), and the request's options.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, NamedTuple

import _common
import tokenizer_zoo_more
from _common import tokenizer_zoo
from helpers import MULTILINGUAL, probe_ids

from detok_plugin import TagSet, build_table

#: Every tokenizer the tests build, by name (tokenizer_zoo's, then WordPiece).
TOKENIZERS = (*tokenizer_zoo.NAMES, "llama3", "gpt_oss", *tokenizer_zoo_more.BUILDERS, "wordpiece")
#: The tokenizers of ``--ci`` (loaded by the core's tests anyway).
CI_TOKENIZERS = (*tokenizer_zoo.NAMES, "wordpiece")

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = ("hi", "there", "hello", "world", "do", "a", "n", "t", "##s", "##ing", ".", ",", "?", "!", "'")

WORDPIECE_TEXTS = ("hi there, hello world!", "do n't a t?", "hellos hiing . there", "world's a hi")
TEXTS = (*MULTILINGUAL, *_common.PARAGRAPHS.values(), "\n\nUser: ok", "###", "STOP", " a b  c ", "…é€", "hi there hello world")

_P4 = '<｜DSML｜parameter name="{}" string="{}">{}</｜DSML｜parameter>'
_P41 = '<｜DSML｜ parameter name="{}" string="{}">{}</｜DSML｜ parameter>'

#: Tool-call bodies per format (the text between its open and close tags): well formed, one
#: with a marker written inside a value (text of the value, ``ToolFormat.marker_is_text``),
#: several calls where a format takes them (``ToolFormat.call_close``: a reply cut between
#: them keeps the first), and a few that are not well formed. Taken from each family's module
#: docstring and tests (tests/families/); ``formats_without_bodies()`` must be empty.
BODIES = {
    "hermes": (
        '\n{"name": "get_time", "arguments": {"city": "東京", "n": [1, 2]}}\n',
        '{"name": "f", "arguments": {}}',
        '{"name": "echo", "arguments": {"text": "end with </tool_call> 東京"}}',
        "{not json",
    ),
    "llama3": ('{"name": "search", "parameters": {"q": "東京 🫨"}}', "plain text", '{"answer": 42}'),
    "llama4_pythonic": (
        "[get_weather(city=\"San Francisco\", days=3), get_time(tz='東京')]",
        "[echo(text='a)] b( [c] <|python_end|>', n=1), ping.now()]",
        "[ping()]<|python_end|>",
        "[f('positional')]",
        "[f(v=1)] and more",
        "[1, 2]",
    ),
    "mistral": ('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]', "[1, 2]"),
    "deepseek": (
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"北京\"}\n```<｜tool▁call▁end｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": \"<｜tool▁calls▁end｜>\"}\n```<｜tool▁call▁end｜>\n"
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>b\n```json\n{}\n```<｜tool▁call▁end｜>",
        "no calls",
    ),
    "deepseek_v31": (
        '<｜tool▁call▁begin｜>write<｜tool▁sep｜>{"path": "a.py"}<｜tool▁call▁end｜>',
        '<｜tool▁call▁begin｜>a<｜tool▁sep｜>{"s": "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"}<｜tool▁call▁end｜>'
        '<｜tool▁call▁begin｜>b<｜tool▁sep｜>{}<｜tool▁call▁end｜>',
    ),
    "deepseek_v4": (
        '\n<｜DSML｜invoke name="get_weather">\n' + _P4.format("city", "true", "東京") + "\n"
        + _P4.format("days", "false", "3") + "\n</｜DSML｜invoke>\n",
        '\n<｜DSML｜invoke name="echo">\n'
        + _P4.format("text", "true", "end with </｜DSML｜tool_calls></｜DSML｜function_calls> and </｜DSML｜invoke>")
        + "\n</｜DSML｜invoke>\n",
        '\n<｜DSML｜invoke name="ping"/>\n',
        '<｜DSML｜invoke name="f">\nstray' + _P4.format("a", "true", "1") + "\n</｜DSML｜invoke>",
        '<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1\n</｜DSML｜invoke>',
    ),
    "deepseek_v41": (
        '\n<｜DSML｜ invoke name="get_weather">\n' + _P41.format("city", "true", "東京") + "\n"
        + _P41.format("days", "false", "[1, 2]") + "\n</｜DSML｜ invoke>\n",
        '\n<｜DSML｜ invoke name="echo">\n' + _P41.format("text", "true", "a</｜DSML｜ calls> b</｜DSML｜parameter>")
        + "\n</｜DSML｜ invoke>\n",
        '<｜DSML｜invoke name="v4_spelling">\n</｜DSML｜invoke>',
    ),
    "kimi_k2": (
        '<|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{"path": "a.py"}<|tool_call_end|>',
        '<|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{"s": "<|tool_calls_section_end|>"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|>',
    ),
    "qwen3_xml": (
        "<function=read_file>\n<parameter=path>\n東京/a.txt\n</parameter>\n</function>\n",
        "<function=echo>\n<parameter=text>\nsay </function></tool_call> twice\n</parameter>\n</function>\n",
        "<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n<function=b>\n<parameter=y>\n2\n</parameter>\n</function>\n",
        "<function=x",
    ),
    "glm45": (
        "write_file\n<arg_key>path</arg_key>\n<arg_value>src/a.py</arg_value>\n",
        "echo\n<arg_key>text</arg_key>\n<arg_value>say </tool_call> twice</arg_value>\n",
    ),
    "gemma4": (
        'call:write{path:<|"|>東京/a.py<|"|>,n:[1,2.5],ok:true}',
        'call:echo{text:<|"|>say <tool_call|> twice<|"|>}',
        "call:bad no brace",
    ),
    "kimi_k3": (
        '<|open|>call tool="write" index="1"<|sep|><|open|>argument key="path" type="string"<|sep|>a.py'
        '<|close|>argument<|sep|><|open|>argument key="n" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>',
        '<|open|>call tool="echo" index="1"<|sep|><|open|>argument key="text" type="string"<|sep|>say '
        "<|close|>tools<|sep|> twice<|close|>argument<|sep|><|close|>call<|sep|>",
    ),
}


def formats_without_bodies() -> list[str]:
    """The tool formats some registered preset writes that ``BODIES`` has no bodies for
    (a chat draw of such a preset would raise ``KeyError``)."""
    formats = {TagSet.preset(name).tool_format for name in TagSet.presets()}
    return sorted(f for f in formats if not BODIES.get(f))


class Tok(NamedTuple):
    """One tokenizer and what cases draw from it."""

    name: str
    tok: Any
    probes: list[list[int]]  # continuations that between them change any unsettled tail
    valid: Sequence[int]  # ids the tokenizer knows
    special: list[int]
    byte_ids: list[int]  # single-byte pieces (byte-level) or <0xNN> pieces (SentencePiece)
    eos: tuple[int, ...]
    id_tags: dict[str, int]  # special added tokens by text: tags the decode skips
    texts: tuple[str, ...]  # real text to cut ids from


def bert_wordpiece() -> Any:
    """tests/core/test_wordpiece.py's tokenizer: specials 0-4, then WORDS."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import BertTokenizerFast

    backend = Tokenizer(models.WordPiece({w: i for i, w in enumerate(SPECIALS + WORDS)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    return BertTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)


def load(name: str) -> Tok:
    tok = bert_wordpiece() if name == "wordpiece" else tokenizer_zoo.load(name)
    table, _ = build_table(tok)
    special = sorted(set(getattr(tok, "all_special_ids", None) or ()))
    if table is None:
        probes = [[], *([i] for i in range(len(tok)))]  # a small vocabulary: every next id
        sep = tok.convert_tokens_to_ids("[SEP]")  # BERT has no EOS: [SEP] stands in for one
        return Tok(name, tok, probes, range(len(tok)), special, [], (sep,), {}, WORDPIECE_TEXTS)
    valid = [i for i, p in enumerate(table.pieces) if p is not None]
    special = sorted(set(special) | {i for i, _, sp in table.added_tokens if sp})
    if table.family == "byte_level":
        byte_ids = [i for i, p in enumerate(table.pieces) if p is not None and len(p) == 1]
    else:
        byte_ids = [i for i, b in enumerate(table.byte_values) if b >= 0]
    eos = tuple(table.eos_token_ids) or ((tok.eos_token_id,) if tok.eos_token_id is not None else ())
    id_tags = {content: i for i, content, sp in table.added_tokens if sp}
    return Tok(name, tok, probe_ids(tok), valid, special, byte_ids, eos, id_tags, TEXTS)


class Case(NamedTuple):
    """One stream's input: ids and the request's options (``layer`` reads what it needs)."""

    seed: int
    layer: str
    tok: str
    prompt: list[int]
    out: list[int]
    skip: bool
    spaces: bool
    stops: tuple[str, ...]
    stop_ids: tuple[int, ...]
    eos: tuple[int, ...]
    include: bool
    min_tokens: int
    max_tokens: int | None
    preset: str | None  # the chat layers' tags
    halves: tuple[bool, bool]  # ChatStream: reasoning and tool halves live
    stop_in_reasoning: bool
    chunks: tuple[int, ...]  # ids per push (1: push_text / a one-id step)
    extra: int  # a layer's own draw (vLLM's output kind, TGI's stop on a special token)


_ENCODED: dict[tuple[int, str], list[int]] = {}  # the pool's texts, encoded once per tokenizer


def _encode(tok: Any, text: str) -> list[int]:
    key = (id(tok), text)
    ids = _ENCODED.get(key)
    if ids is None:
        ids = _ENCODED[key] = list(tok.encode(text, add_special_tokens=False))
    return list(ids)


def _ids(rng: random.Random, t: Tok, n: int, tags: TagSet | None) -> list[int]:
    """About ``n`` ids: slices of real text (cut anywhere), random ids, special ids, lone
    byte pieces; with ``tags``, the preset's tags, pieces of them and its tool bodies."""
    ids: list[int] = []
    while len(ids) < n:
        r = rng.random()
        if tags is not None and r < 0.35:
            marks = [m for m in (tags.reasoning_open, tags.reasoning_close, tags.tool_open, tags.tool_close) if m]
            pick = rng.random()
            if pick < 0.5 and marks:
                mark = rng.choice(marks)
                text = mark if rng.random() < 0.7 else mark[: rng.randint(1, len(mark))]
                if mark in t.id_tags and rng.random() < 0.5:
                    ids.append(t.id_tags[mark])
                    continue
            elif pick < 0.85:
                text = rng.choice(BODIES[tags.tool_format])
            else:
                text = rng.choice(("<", "/", ">", "[", "]", "|", "\n", "think", "tool"))
            ids += _encode(t.tok, text)
        elif r < 0.7:
            whole = _encode(t.tok, rng.choice(t.texts))
            a = rng.randrange(len(whole))
            ids += whole[a : a + rng.randint(1, 12)]
        elif r < 0.8:
            ids.append(rng.choice(t.valid))
        elif r < 0.87 and t.special:
            ids.append(rng.choice(t.special))
        elif t.byte_ids:
            ids += [rng.choice(t.byte_ids) for _ in range(rng.randint(1, 4))]
    return ids[:n]


def _reply(rng: random.Random, t: Tok, tags: TagSet) -> list[int]:
    """A chat reply as a model writes one: reasoning, an answer and tool calls in the
    preset's markers (or opened by its bare opener), blanks or a word between and after
    them, encoded whole; then, sometimes, a few random ids."""
    parts = []
    if tags.reasoning_open and rng.random() < 0.6:
        parts += [tags.reasoning_open, rng.choice(t.texts)[:40], tags.reasoning_close or ""]
    parts.append(rng.choice(t.texts)[: rng.randint(0, 40)])
    for _ in range(rng.choice((0, 1, 1, 2)) if tags.tool_open else 0):
        body = rng.choice(BODIES[tags.tool_format])
        bare = tags.tool_bare
        if bare and rng.random() < 0.4:  # opened without the tool tag (Preset.bare_open)
            parts += [body if body.startswith(bare) else bare + body, tags.tool_close or ""]
        else:
            parts += [tags.tool_open or "", body, tags.tool_close or ""]
        if tags.tool_close is None:
            break  # the body runs to the end of the reply
        parts.append(rng.choice(("", "", "\n", " \n", "\n\n", "ok")))  # between and after calls
    ids = _encode(t.tok, "".join(parts))
    if rng.random() < 0.3:
        ids += _ids(rng, t, rng.randint(1, 6), None)
    return ids[:96] or [rng.choice(t.valid)]


def draw(seed: int, layer: str, t: Tok, final_text: Any) -> Case:
    """The case of ``seed`` on ``layer`` and ``t``. ``final_text(prompt, out, skip, spaces)``
    is the decode oracle's text: stop strings are cut from it, so they start and end inside
    tokens and characters."""
    rng = random.Random(seed)
    chat = layer in ("tagged", "chat")
    preset = rng.choice(TagSet.presets()) if chat else None
    tags = TagSet.preset(preset) if preset is not None else None
    prompt = [] if rng.random() < 0.25 else _ids(rng, t, rng.randint(1, 12), None)
    if tags is not None and tags.reasoning_open and rng.random() < 0.3:
        prompt += _encode(t.tok, tags.reasoning_open + "\n")  # a template that opens reasoning
    if tags is not None and rng.random() < 0.5:
        out = _reply(rng, t, tags)
    else:
        out = _ids(rng, t, rng.randint(1, 32), tags)
    eos = t.eos if rng.random() < 0.5 else ()
    if eos and rng.random() < 0.3:
        out.insert(rng.randrange(len(out) + 1), eos[0])
    skip = rng.random() < 0.5 if layer != "tgi" else True
    spaces = rng.random() < 0.8
    final = final_text(prompt, out, skip, spaces)
    stops: list[str] = []
    for _ in range(rng.choice((0, 0, 0, 1, 2, 4) if chat else (0, 1, 1, 2, 3, 4))):
        if final:
            a = rng.randrange(len(final))
            stops.append(final[a : a + rng.randint(1, 6)])
        else:
            stops.append(rng.choice(("\n\nUser:", "###", "\ufffd")))
    stop_ids = tuple(rng.sample(out, rng.randint(1, min(2, len(out))))) if rng.random() < 0.3 else ()
    min_tokens = 0 if rng.random() < 0.5 else rng.randint(1, 4)
    max_tokens = None if rng.random() < 0.6 else rng.randint(1, len(out) + 2)
    chunks = tuple(rng.choice((1, 1, 2, 3)) for _ in out) if rng.random() < 0.5 else (1,) * len(out)
    return Case(
        seed, layer, t.name, prompt, out, skip, spaces, tuple(dict.fromkeys(stops)), stop_ids, eos,
        rng.random() < 0.5, min_tokens, max_tokens, preset, (rng.random() < 0.85, rng.random() < 0.85),
        rng.random() < 0.3, chunks, rng.randrange(1 << 30),
    )
