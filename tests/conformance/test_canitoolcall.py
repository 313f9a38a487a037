"""CanIToolCall's conformance suite (PyPI ``canitoolcall`` 0.1.1) on vLLM 0.33's chat path.

Through CanIToolCall's own pytest plugin (entry point ``pytest11``, loaded by pytest): its
``canitoolcall_fixture`` and ``canitoolcall_strategy`` parametrize the tests over every
fixture of its corpus and every default chunking (``one``, ``special``, ``token``,
``rand:1:8`` ... ``rand:5:8``), each test id naming the fixture and the strategy. The replay
is the one vLLM's OpenAI server runs (``tests/support/conformance_replay.py``): ids through
vLLM's real ``OutputProcessor``, then ``ChatStreamProcessor.step`` per step, or ``parse``
without streaming; CanIToolCall's ``assert_conforms`` / ``assert_equivalent`` judge it.

1. ``detok`` (``DETOK_PLUGIN=1``, the ``detok_*`` parsers): every parse of every supported
   fixture with a local tokenizer conforms **strictly** (a soft pass fails), and every
   stream equals the non-streamed parse; at four of the eight default chunkings unless
   ``DETOK_CONFORMANCE_CHUNKINGS=all`` (:data:`CHUNKINGS`). What fails today for a known cause is listed in
   ``known_failures.py`` and marked ``xfail(strict=True)``: a fix shows as XPASS, which
   fails until its entry is removed.
2. ``pairing`` (the plugin's detokenizer under vLLM's own parsers): every fixture's status
   equals ``stock``'s (vLLM's own detokenizer and parsers), under CanIToolCall's runner,
   on the non-streamed parse and the ``one`` and ``token`` streams.

Fixtures whose tokenizer cannot be built here, or that a configuration has no parser for,
are skipped with the reason (``benchmarks/bench_conformance.py`` counts them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

pytest.importorskip("vllm.parser.abstract_parser", reason="vLLM 0.32+ is not installed")

import conformance as C  # noqa: E402
from canitoolcall.checks import NONSTREAM  # noqa: E402
from canitoolcall.chunking import DEFAULT_STRATEGIES, ChunkStrategy  # noqa: E402
from canitoolcall.fixtures import Fixture  # noqa: E402
from canitoolcall.pytest_plugin import assert_conforms, assert_equivalent  # noqa: E402
from canitoolcall.results import ParseResult  # noqa: E402
from known_failures import CAUSES, KNOWN_FAILURES  # noqa: E402

#: The chunkings this run replays (``DETOK_CONFORMANCE_CHUNKINGS``, read here only): by
#: default the three fixed ones and the first seeded random one, so that the module takes a
#: few minutes on a 2-core machine; ``all`` runs CanIToolCall's eight (as
#: ``benchmarks/bench_conformance.py`` always does), or name them: ``one,token,rand:3:8``.
#: ``tests/conftest.py`` deselects the stream tests of the other chunkings.
CHUNKINGS = C.chunkings(os.environ.get("DETOK_CONFORMANCE_CHUNKINGS", "one,special,token,rand:1:8"))
#: The pairing test's chunkings: its statuses judge the non-streamed parse and these streams.
PAIRING_STRATEGIES = tuple(ChunkStrategy.parse(s) for s in ("one", "token"))


@pytest.fixture(autouse=True, scope="module")
def _quiet_parsers() -> Iterator[None]:
    """vLLM's parsers log every malformed body with a traceback, the plugin's with a line."""
    loggers = [logging.getLogger(n) for n in ("vllm", "vllm.detok_plugin")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


def _ran(parsed: dict[str, ParseResult] | C.FixtureResult) -> dict[str, ParseResult]:
    if isinstance(parsed, C.FixtureResult):
        pytest.skip(f"{parsed.status}: {parsed.reason}")
    return parsed


def _expect_known(request: pytest.FixtureRequest, fixture: Fixture, parse: str) -> None:
    known = KNOWN_FAILURES.get(fixture.id)
    if known is not None and known.covers(parse):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"cause {known.cause}: {known.why}"))


def test_detok_parse_conforms(canitoolcall_fixture: Fixture, request: pytest.FixtureRequest) -> None:
    """The non-streamed reply conforms strictly."""
    parsed = _ran(C.parses(canitoolcall_fixture.id, "detok", CHUNKINGS))[NONSTREAM]
    _expect_known(request, canitoolcall_fixture, "nonstream")
    assert_conforms(canitoolcall_fixture, parsed, family=C.family_of(canitoolcall_fixture))


def test_detok_stream_conforms(
    canitoolcall_fixture: Fixture, canitoolcall_strategy: ChunkStrategy, request: pytest.FixtureRequest
) -> None:
    """The streamed reply, at this chunking, conforms strictly and equals the non-streamed one."""
    parsed = _ran(C.parses(canitoolcall_fixture.id, "detok", CHUNKINGS))
    _expect_known(request, canitoolcall_fixture, canitoolcall_strategy.id)
    assert_conforms(canitoolcall_fixture, parsed[canitoolcall_strategy.id], family=C.family_of(canitoolcall_fixture))
    assert_equivalent(parsed[NONSTREAM], parsed[canitoolcall_strategy.id])


def test_pairing_statuses_equal_stock(canitoolcall_fixture: Fixture) -> None:
    """The plugin's detokenizer under vLLM's own parsers: the status stock vLLM gets."""
    stock = C.run_case(canitoolcall_fixture, "stock", PAIRING_STRATEGIES)
    if stock.case is None:
        pytest.skip(f"{stock.status}: {stock.reason}")
    pairing = C.run_case(canitoolcall_fixture, "pairing", PAIRING_STRATEGIES)
    assert pairing.status == stock.status, f"stock: {stock.reason}; pairing: {pairing.reason}"


def test_every_known_failure_names_a_fixture_and_a_parse() -> None:
    """The list holds fixture ids of the corpus and parse names only (a typo would hide nothing)."""
    ids = {f.id for f in C.fixtures()}
    parses = {"nonstream", "*"} | {s.id for s in DEFAULT_STRATEGIES}
    assert set(KNOWN_FAILURES) <= ids
    assert all(set(k.parses) <= parses and k.cause in CAUSES for k in KNOWN_FAILURES.values())
