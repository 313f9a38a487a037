"""What the differential fuzz (``benchmarks/fuzz.py``) found in the core, one golden each,
named after what it pins. Each failed before its fix; the fuzz's seed that found it is named."""

from __future__ import annotations

import pytest

from detok_plugin import DetokenizerState, ServingStream, TokenTable


def _table(*pieces: str) -> TokenTable:
    return TokenTable("byte_level", tuple(p.encode() for p in pieces), frozenset(), eos_token_ids=())


@pytest.mark.parametrize("cls", [DetokenizerState, ServingStream])
def test_a_stop_completed_by_min_tokens_holds_nothing_after_it(cls):
    """A stop that completes by token ``min_tokens`` never counts (vLLM's rule), so its
    characters are no partial match: they leave with the token that completes them. The
    stream held the whole stop until the next token (fuzz seeds 60, 68, 76, 80: ``"llo"``
    in ``" hello"`` at token 1 with ``min_tokens=1`` left as ``" he"``)."""
    t = _table(" hello", "s", " hi", "llo")
    s = cls.from_tokenizer(t, stop=["llo"], min_tokens=1, eos_token_ids=())
    assert [s.push_text(i) for i in (0, 1, 2)] == [" hello", "s", " hi"]
    assert s.finish_reason is None
    assert s.push_text(3) == "" and (s.finish_reason, s.stop_reason) == ("stop", "llo")


@pytest.mark.parametrize("cls", [DetokenizerState, ServingStream])
def test_a_stop_completed_by_min_tokens_still_holds_what_a_longer_stop_may_become(cls):
    """The same early stop, when it is the start of a longer one: that may still complete
    after ``min_tokens``, so its characters are a genuine partial match and stay held."""
    t = _table(" hello", "s", " hi")
    s = cls.from_tokenizer(t, stop=["llo", "llos!"], min_tokens=1, eos_token_ids=())
    assert [s.push_text(i) for i in (0, 1, 2)] == [" he", "", "llos hi"]
    s = cls.from_tokenizer(t, stop=["llo", "los"], min_tokens=1, eos_token_ids=())
    assert s.push_text(0) == " hel"  # "lo" may become "los": held
    assert s.push_text(1) == "" and (s.finish_reason, s.stop_reason) == ("stop", "los")


@pytest.mark.parametrize("min_tokens", [2, 5])
def test_a_tag_ending_where_a_stop_too_early_to_count_ends_still_switches_the_channel(min_tokens):
    """A stop and a tag that end at the same character: the stop, listed first, wins when it
    counts; when it is too early to count (``min_tokens``) the tag must still act. The
    stream passed over both: ``<think>`` stayed in the content, the reasoning with it, and
    a later ``</think>`` stopped the stream with ``think>`` (fuzz seeds 109 and 513, chat
    layer, stop ``think>``)."""
    t = _table("<think>", "why", "</think>", "ok", " more")
    s = DetokenizerState.from_tokenizer(t, tags="qwen3", stop=["think>"], min_tokens=min_tokens, eos_token_ids=())
    deltas = [s.push(i) for i in range(5)] + [s.finish()]
    assert ("".join(d.text for d in deltas), "".join(d.reasoning for d in deltas)) == ("ok more", "why")
    assert s.finish_reason is None
    # Counting (min_tokens 0), the stop wins the tie at the first tag.
    s = DetokenizerState.from_tokenizer(t, tags="qwen3", stop=["think>"], eos_token_ids=())
    d = s.push(0)
    assert (d.text, d.reasoning, s.stop_reason) == ("<", "", "think>")


@pytest.mark.parametrize("steps", [[[0, 1, 2, 3, 4]], [[0], [1], [2], [5]], [[0, 1], [2, 5]]], ids=["one-step", "close-and-text-in-one-id", "two-steps"])
def test_a_malformed_tool_call_is_sent_as_content_where_it_stood(steps):
    """A malformed body goes out as content, its raw text (tags included) where the body
    stood: before the content that followed its close tag. The chat layer put that content
    first when it came in the same step as the close (fuzz seed 191: ``" ."`` and then
    ``"<tool_call>{...</tool_call>"`` for ``" <tool_call>{...</tool_call>."``)."""
    from detok_plugin import ChatStream, TagSet

    t = _table("A", "<tool_call>", "{bad", "</tool_call>", ".", "</tool_call>.")
    chat = ChatStream(t, TagSet.preset("hermes"), new_call_id=lambda name, fmt: "call_0")
    content = "".join(
        (chat.message(ids, finished=n == len(steps) - 1) or {}).get("content", "") for n, ids in enumerate(steps)
    )
    assert content == "A<tool_call>{bad</tool_call>."


def test_a_glm45_value_whose_close_tag_never_comes_streams_nothing_the_parse_drops():
    """Fuzz seeds 38412, 40892, 90132 (chat layer, ``skip_special_tokens=False``): an EOS
    token's text inside ``</arg_value>`` left the value unterminated; the chat layer had sent
    ``{"path": "src/a.py</arg_<|im_end|>value>\\n`` and the parse said ``{}``. The parse now
    keeps such a value to the body's end, and the reader holds a value's trailing blanks
    (the body is stripped at its close), so what was sent is a prefix of the parse."""
    from detok_plugin import parse_tool_body
    from detok_plugin.families import tool_format

    body = "write_file\n<arg_key>path</arg_key>\n<arg_value>src/a.py</arg_<|im_end|>value>\n"
    sent = "".join(args for _, _, args in tool_format("glm45").reader(None).feed(body))
    [(name, arguments)] = parse_tool_body(body.strip(), "glm45")
    assert name == "write_file" and arguments.startswith(sent)
    assert arguments == '{"path": "src/a.py</arg_<|im_end|>value>"}'
    reader = tool_format("glm45").reader(None)
    assert "".join(args for ch in body for _, _, args in reader.feed(ch)) == sent  # one character per piece


@pytest.mark.parametrize("include_stop", [False, True])
@pytest.mark.parametrize("tags", ["llama3", "llama4_pythonic"])
def test_a_bare_opener_that_stays_text_is_text_to_the_stop_strings_too(tags, include_stop):
    """A bare opener (Llama 3's ``{``, Llama 4's ``[``) after other text of the reply opens no
    body: it is text, and a stop string that begins with it or spans it must still match.
    The stream restarted its stop matching after the opener, so the stop never completed
    (fuzz seed 12352, Llama 3's tags, stop ``{"``: the decode ends at ``The quick brown
    fox{"``, the stream sent ``The quick brown fox{"name`` and went on)."""
    opener = "{" if tags == "llama3" else "["
    t = _table("The quick brown fox", opener, '"name', '": 1}', " and more")
    stop = opener + '"'
    s = DetokenizerState.from_tokenizer(t, tags=tags, stop=[stop, "fox" + opener + "x"], include_stop_str_in_output=include_stop, eos_token_ids=())
    deltas = []
    for i in range(5):
        deltas.append(s.push(i))
        if s.finish_reason is not None:
            break
    assert (i, s.finish_reason, s.stop_reason) == (2, "stop", stop)
    text = "".join(d.text for d in deltas)
    assert text == "The quick brown fox" + (stop if include_stop else "")
    assert not any(d.tool_calls for d in deltas)


def _specials_table(*pieces: str, special: tuple[str, ...]) -> TokenTable:
    added = tuple((k, p, True) for k, p in enumerate(pieces) if p in special)
    ids = frozenset(k for k, _, _ in added)
    return TokenTable("byte_level", tuple(p.encode() for p in pieces), ids, eos_token_ids=(), added_tokens=added)


def _joined(s: DetokenizerState, ids: list[int]) -> tuple[str, str, list]:
    deltas = [s.push(i) for i in ids] + [s.finish()]
    calls = [c for d in deltas for c in d.tool_calls]
    return "".join(d.text for d in deltas), "".join(d.reasoning for d in deltas), calls


def test_a_skipped_reasoning_close_id_inside_a_tool_body_is_nothing():
    """Inside a tool body only the tool close tag ends it: a reasoning close tag's id there
    (skipped by the decode) is nothing. It switched the stream to content with the body
    left open, and the body's rest went out as content (fuzz seed 16372, Gemma 4's
    ``<channel|>`` inside a call)."""
    t = _specials_table("<tool_call>", '{"name": "f", ', "</think>", '"arguments": {}}', "</tool_call>", " ok", special=("</think>", "<tool_call>", "</tool_call>"))
    s = DetokenizerState.from_tokenizer(t, tags="qwen3", skip_special_tokens=True, eos_token_ids=())
    text, reasoning, calls = _joined(s, [0, 1, 2, 3, 4, 5])
    assert (text, reasoning) == (" ok", "")
    assert [(c.name, c.arguments, c.error) for c in calls if c.complete] == [("f", "{}", None)]


@pytest.mark.parametrize("ids", [[0, 1, 2, 3], [4, 5, 1, 0, 6, 3]], ids=["content", "reasoning"])
def test_a_skipped_tool_close_id_where_no_body_is_open_is_nothing(ids):
    """The same rule for a tool close tag's id where no body is open: nothing. In content it
    was taken as the close of an empty body, and the chat layer then dropped the blanks after
    it as after a call; in reasoning it ended the reasoning (fuzz seeds 15722 and 17607,
    Gemma 4's ``<tool_call|>``: the decode ends ``twice}\\n\\n``, the stream sent ``twice}``)."""
    from detok_plugin import ChatStream, TagSet

    t = _specials_table("twice}", "</tool_call>", "\\n\\n", "end", "<think>", "hm", "</think>", special=("</tool_call>", "<think>", "</think>"))
    s = ChatStream(t, TagSet.preset("qwen3"), skip_special_tokens=True, new_call_id=lambda name, fmt: "call")
    fields = [s.message([i], False) for i in ids] + [s.message([], True)]
    got = {k: "".join(f.get(k, "") for f in fields if f) for k in ("content", "reasoning")}
    want = {"content": "twice}\\n\\nend", "reasoning": ""} if ids[0] == 0 else {"content": "end", "reasoning": "hmtwice}"}
    assert got == want and not any(f and f.get("tool_calls") for f in fields)


def test_a_bare_opener_after_held_text_stays_text_to_the_stop_strings():
    """The same where the text before the opener is still held (the start of a stop): it is
    text of the reply all the same, so the opener opens no body and the stop goes on
    matching (fuzz seed 32206, Llama 3's tags, stop ``な{"nam``: the stream sent ``な{"``
    and went on)."""
    t = _table("な", '{"', "name", " more")
    s = DetokenizerState.from_tokenizer(t, tags="llama3", stop=['な{"nam'], eos_token_ids=())
    got = [s.push(i) for i in range(3)]
    assert "".join(d.text for d in got) == "" and (s.finish_reason, s.stop_reason) == ("stop", 'な{"nam')
