"""CanIToolCall's fixtures through vLLM 0.33's chat path, in three configurations.

=========  ===========================  ==========================================
config     detokenizer                  chat parsers
=========  ===========================  ==========================================
detok      the plugin's (DETOK_PLUGIN=1) ``detok_*`` (``conformance_models.DETOK_PARSERS``)
stock      vLLM's own                   vLLM's own, as CanIToolCall's vLLM adapter names them
pairing    the plugin's                 vLLM's own (what many users run first)
=========  ===========================  ==========================================

Each fixture is replayed without streaming and once per chunking strategy
(``conformance_replay``), and CanIToolCall's own runner code judges the parses
(``canitoolcall.runner.evaluate``: its checks, its statuses). A fixture whose tokenizer
cannot be built here is ``no_tokenizer`` and is not run; one whose family or model has no
parser in a configuration is ``unsupported`` there.

>>> CONFIGS["pairing"]
Config(name='pairing', plugin=True, parsers='stock')
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from canitoolcall.adapters.base import ReplayInput
from canitoolcall.adapters.vllm import chat_template_kwargs_for, resolve_parsers
from canitoolcall.checks import NONSTREAM
from canitoolcall.chunking import DEFAULT_STRATEGIES, ChunkStrategy, split
from canitoolcall.fixtures import Family, Fixture, load_fixtures
from canitoolcall.results import CaseResult, ParseResult, Status
from canitoolcall.runner import evaluate, family_for
from conformance_models import (
    STOP_TOKENS,
    StopRule,
    TokenizerChoice,
    detok_parsers_for,
    prompt_head,
    tokenizer_for,
    zoo_tokenizer,
)
from conformance_replay import Replay, plugin_switch, registered_names, replay_nonstream, replay_stream, with_stop
from detok_plugin.integrations.vllm.parser_names import detok_names
from vllm.tokenizers.hf import get_cached_tokenizer

__all__ = [
    "CONFIGS",
    "NO_TOKENIZER",
    "STATUSES",
    "Config",
    "FixtureResult",
    "chunkings",
    "fixtures",
    "local_tokenizer",
    "non_passes",
    "parses",
    "replay_for",
    "replays",
    "run_case",
]

#: Not one of CanIToolCall's statuses: the fixture was not run.
NO_TOKENIZER = "no_tokenizer"
#: Every status a fixture can have here, best first.
STATUSES = ("pass", "soft_pass", "fail", "error", "unsupported", NO_TOKENIZER)


def chunkings(named: str) -> tuple[str, ...]:
    """Strategy ids from ``DETOK_CONFORMANCE_CHUNKINGS``'s value: ``all`` (CanIToolCall's
    eight defaults) or a comma-separated list (``one,token,rand:3:8``).

    >>> chunkings("one, rand:2")
    ('one', 'rand:2:8')
    """
    if named.strip() == "all":
        return tuple(s.id for s in DEFAULT_STRATEGIES)
    return tuple(ChunkStrategy.parse(s).id for s in named.split(","))


@dataclass(frozen=True, slots=True)
class Config:
    """A configuration: the plugin's detokenizer on or off, and whose chat parsers."""

    name: str
    plugin: bool
    parsers: Literal["detok", "stock"]


CONFIGS: dict[str, Config] = {
    "detok": Config("detok", True, "detok"),
    "stock": Config("stock", False, "stock"),
    "pairing": Config("pairing", True, "stock"),
}


@dataclass(frozen=True)
class FixtureResult:
    """One fixture under one configuration."""

    fixture_id: str
    family: str
    model: str
    config: str
    status: str  # a CanIToolCall Status value, or NO_TOKENIZER
    reason: str | None  # why not run / unsupported, or the failing checks
    case: CaseResult | None
    wall_s: float  # one pass of the replays (non-streaming and every strategy), not the setup


@functools.cache
def _corpus() -> dict[str, Fixture]:
    return {f.id: f for f in load_fixtures(None)}


def fixtures(families: Iterable[str] = ()) -> list[Fixture]:
    """The bundled corpus (CanIToolCall's own loader), optionally only some families."""
    wanted = set(families)
    return [f for f in _corpus().values() if not wanted or f.family in wanted]


_FAMILIES: dict[Any, Family | None] = {}


def family_of(fixture: Fixture) -> Family | None:
    return family_for(fixture, _FAMILIES)


def _pin(fixture: Fixture) -> str:
    return fixture.tokenizer.repo if fixture.tokenizer is not None else fixture.reference_model


@functools.cache
def _choice(pin: str) -> TokenizerChoice:
    return tokenizer_for(pin, [f for f in _corpus().values() if _pin(f) == pin])


def local_tokenizer(fixture: Fixture) -> TokenizerChoice:
    """The zoo tokenizer of the fixture's pin, verified on every fixture of that pin."""
    return _choice(_pin(fixture))


@functools.cache
def _vllm_tokenizer(name: str, eos: str | None) -> Any:
    return get_cached_tokenizer(zoo_tokenizer(name, eos))


@functools.cache
def _special_ids(name: str) -> frozenset[int]:
    """``all_special_ids`` plus added tokens flagged special (CanIToolCall's vLLM adapter's rule)."""
    tok = zoo_tokenizer(name)
    ids = {int(i) for i in tok.all_special_ids}
    ids.update(int(i) for i, t in tok.added_tokens_decoder.items() if getattr(t, "special", False))
    return frozenset(ids)


def _parser_names(fixture: Fixture, config: Config) -> tuple[str | None, str] | str:
    """``(reasoning, tool)`` parser names, or why the configuration has none for the fixture."""
    family, model = fixture.family, fixture.reference_model
    if config.parsers == "detok":
        rule = detok_parsers_for(family, model)
        if rule is None:
            return f"no detok parser is mapped to {family} / {model}"
        reasoning_known, tools_known = detok_names()
        names: tuple[str | None, str] = (rule.reasoning, rule.tool)
    else:
        stock = resolve_parsers(family, model)
        if stock is None or stock.choice is None:
            return f"CanIToolCall's vLLM map has no parser for {family} / {model}"
        reasoning_known, tools_known = registered_names()
        names = (stock.choice.reasoning_parser, stock.choice.tool_parser)
    missing = [n for n, known in zip(names, (reasoning_known, tools_known), strict=True) if n and n not in known]
    if missing:
        return f"{', '.join(missing)} not registered"
    return names


def _stop_ids(tok: Any, fixture: Fixture, family: Family | None) -> tuple[tuple[int, ...], int | None]:
    """The family's stop ids, and the one that ended this output (None: max_tokens cut it)."""
    vocab = tok.get_vocab()
    ref = family.reference_for(fixture.reference_model) if family is not None else None
    tokens = list(ref.stop_tokens) if ref is not None else []
    stop_ids = tuple(vocab[t] for t in tokens if t in vocab)
    if fixture.truncated:
        return stop_ids, None
    rule = STOP_TOKENS.get(fixture.family, StopRule(tuple(tokens)))
    ended = next((vocab[t] for t in [*rule.for_output(fixture.raw_output), *tokens] if t in vocab), None)
    return stop_ids, ended


def replay_for(fixture: Fixture, config: Config) -> Replay | FixtureResult:
    """What replays ``fixture`` under ``config``, or its result when it cannot be run."""
    choice = local_tokenizer(fixture)
    if choice.name is None:
        return _not_run(fixture, config, NO_TOKENIZER, choice.why)
    names = _parser_names(fixture, config)
    if isinstance(names, str):
        return _not_run(fixture, config, Status.UNSUPPORTED.value, names)
    tok = _vllm_tokenizer(choice.name, choice.eos)
    family = family_of(fixture)
    raw = ReplayInput.from_fixture(fixture, family)
    prompt = prompt_head(fixture.family, fixture.reference_model) + (raw.generation_prompt or "")
    stop_ids, stop_id = _stop_ids(tok, fixture, family)
    return Replay(
        tokenizer=tok,
        model=fixture.reference_model,
        reasoning_parser=names[0],
        tool_parser=names[1],
        is_harmony=fixture.family == "gpt-oss",
        tools=tuple(dict(t) for t in fixture.tools),
        chat_template_kwargs=chat_template_kwargs_for(fixture.thinking),
        prompt_ids=tuple(tok.encode(prompt, add_special_tokens=False)),
        stop_ids=stop_ids,
        stop_id=stop_id,
    )


def _not_run(fixture: Fixture, config: Config, status: str, reason: str) -> FixtureResult:
    return FixtureResult(fixture.id, fixture.family, fixture.reference_model, config.name, status, reason, None, 0.0)


def _ids(fixture: Fixture) -> list[int]:
    assert fixture.output_token_ids is not None  # local_tokenizer verified it
    return list(fixture.output_token_ids)


def replays(
    fixture: Fixture,
    config: Config,
    strategies: Sequence[ChunkStrategy] = DEFAULT_STRATEGIES,
    spent: list[float] | None = None,
    timings: int = 1,
) -> dict[str, ParseResult] | FixtureResult:
    """The non-streamed parse (key ``nonstream``) and one streamed parse per strategy (its
    id), under one switch of the plugin; or why the fixture was not run.

    ``spent`` given, the replays are timed: one untimed pass, then ``timings`` passes, each
    adding its seconds to ``spent``, all under the one switch. A server switches the plugin
    on and resolves its parser class once, at start-up, so those (and the harness's own
    setup of the fixture) are left out; and it serves one configuration, so each request
    follows requests of its own configuration, not another's: the untimed pass puts the
    fixture's requests after one of their own, as the benchmark's rotation would not
    (docs/conformance.md, "Time")."""
    replay = replay_for(fixture, config)
    if isinstance(replay, FixtureResult):
        return replay
    choice = local_tokenizer(fixture)
    assert choice.name is not None
    special = _special_ids(choice.name)
    ids = _ids(fixture)
    units = with_stop(replay, ids)
    groups = [(s.id, split(units, s, special=special)) for s in strategies]
    with plugin_switch(config.plugin):
        replay.parser_cls  # noqa: B018  (resolved once, as a server does at start-up)
        out = _pass(replay, ids, groups)
        if spent is not None:
            for _ in range(timings):
                t0 = time.perf_counter()
                _pass(replay, ids, groups)
                spent.append(time.perf_counter() - t0)
    return out


def _pass(replay: Replay, ids: list[int], groups: Sequence[tuple[str, Any]]) -> dict[str, ParseResult]:
    out = {NONSTREAM: replay_nonstream(replay, ids)}
    for strategy_id, chunks in groups:
        out[strategy_id] = replay_stream(replay, chunks)
    return out


@functools.cache
def parses(fixture_id: str, config_name: str, strategy_ids: tuple[str, ...]) -> dict[str, ParseResult] | FixtureResult:
    """:func:`replays` of a corpus fixture, once per process for each set of strategies."""
    strategies = [ChunkStrategy.parse(s) for s in strategy_ids]
    return replays(_corpus()[fixture_id], CONFIGS[config_name], strategies)


def run_case(
    fixture: Fixture,
    config_name: str,
    strategies: Sequence[ChunkStrategy] = DEFAULT_STRATEGIES,
    *,
    cached: bool = True,
    timings: int = 1,
) -> FixtureResult:
    """Replay ``fixture`` under a configuration (non-streaming and every strategy) and judge
    it with CanIToolCall's ``evaluate``. ``cached=False`` replays them again and times them
    (the benchmark's timing: ``wall_s`` is the median of ``timings`` timed passes, see
    :func:`replays`), else they are replayed once per process (and ``wall_s`` is 0)."""
    config = CONFIGS[config_name]
    spent: list[float] = []
    if cached:
        parsed = parses(fixture.id, config.name, tuple(s.id for s in strategies))
    else:
        parsed = replays(fixture, config, strategies, spent, timings)
    wall = statistics.median(spent) if spent else 0.0
    if isinstance(parsed, FixtureResult):
        return parsed
    reply = {
        "supported": True,
        "nonstream": parsed[NONSTREAM].to_dict(),
        "streams": {k: v.to_dict() for k, v in parsed.items() if k != NONSTREAM},
        "parser_config": {"config": config.name, "tokenizer": local_tokenizer(fixture).name},
    }
    case = evaluate(fixture, family_of(fixture), reply, include_observed="failures")
    reason = None if case.status is Status.PASS else ", ".join(non_passes(case))
    return FixtureResult(
        fixture.id, fixture.family, fixture.reference_model, config.name, case.status.value, reason, case, wall
    )


def non_passes(case: CaseResult) -> list[str]:
    """The checks that did not pass, each with the parses it failed on: ``check[strategy,...]``."""
    bad: dict[str, list[str]] = defaultdict(list)
    for row in case.checks:
        if row.status is not Status.PASS:
            bad[f"{row.check} ({row.status.value})"].append(row.strategy)
    return [f"{check}[{','.join(strategies)}]" for check, strategies in bad.items()]
