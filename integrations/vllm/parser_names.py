"""The ``detok_*`` parser names, checked where vLLM checks its own: before the model loads.

vLLM checks ``--tool-call-parser`` (and, from its arguments, ``--reasoning-parser``) in
``validate_api_server_args``, which ``setup_server`` calls in the API-server process before
it builds the engine, that is before the model loads (``_framework.LAUNCHER_MODULE``).
:func:`guard` wraps that function, through the shared patch registry, whether the plugin is
on or not (vLLM calls ``register`` in every process, the switch off included). A server
that names a detok parser then stops there, with one line that says why:

1. the plugin cannot act in this server (the switch off or mistaken, vLLM's Rust frontend,
   a vLLM whose chat layer it does not fit): the line names the parser, the reason and
   what to pass instead (``DETOK_PLUGIN=1``), where vLLM would say "invalid tool call
   parser" and nothing about the switch;
2. a detok parser paired with one of vLLM's (or ``detok_gpt_oss`` with any other): refused
   here, not when vLLM composes the parser after the model has loaded (``chat_registry``
   keeps the same rule, :func:`pair_problem`, for servers started another way);
3. a detok name that no family registers.

Otherwise vLLM's own checks run, unchanged. Nothing here imports vLLM's chat layer: with
the switch off, a process pays for a string comparison.

>>> pair_problem("detok_qwen3", "hermes")
'--reasoning-parser detok_qwen3 and --tool-call-parser hermes: a detok parser pairs only with another detok parser (e.g. --reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3)'
>>> pair_problem("detok_qwen3", "detok_hermes") is None
True
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, NamedTuple

from detok_plugin import TagSet

from ..common.patches import PATCHES
from ..common.startup import ImportHook
from . import _framework

__all__ = [
    "HARMONY", "PREFIX", "Refusal", "detok_names", "guard", "is_detok", "names_problem", "pair_problem", "unguard",
]

logger = logging.getLogger("vllm.detok_plugin")

#: Every parser name the chat layer registers begins with it.
PREFIX = "detok_"

#: gpt-oss's parser name: harmony, read by ``harmony.HarmonyChannels`` (not a core preset).
HARMONY = PREFIX + "gpt_oss"


def is_detok(name: str | None) -> bool:
    return bool(name) and str(name).startswith(PREFIX)


def detok_names() -> tuple[frozenset[str], frozenset[str]]:
    """The detok reasoning-parser names and tool-parser names: one per family preset that
    has reasoning tags, one per preset that has tool tags, and ``detok_gpt_oss`` in both."""
    reasoning, tools = {HARMONY}, {HARMONY}
    for name in TagSet.presets():
        tags = TagSet.preset(name)
        if tags.reasoning_open and tags.reasoning_close:
            reasoning.add(PREFIX + name)
        if tags.tool_open:
            tools.add(PREFIX + name)
    return frozenset(reasoning), frozenset(tools)


def pair_problem(reasoning: str | None, tool: str | None) -> str | None:
    """Why ``--reasoning-parser reasoning --tool-call-parser tool`` cannot go together, or
    None: a detok parser pairs only with detok parsers, and ``detok_gpt_oss`` only with itself."""
    named = [n for n in (reasoning, tool) if n]
    if not any(is_detok(n) for n in named):
        return None
    if HARMONY in named and any(n != HARMONY for n in named):
        return f"{HARMONY} pairs only with itself (--reasoning-parser {HARMONY} --tool-call-parser {HARMONY})"
    if not all(is_detok(n) for n in named):
        return (
            f"--reasoning-parser {reasoning} and --tool-call-parser {tool}: a detok parser pairs only "
            f"with another detok parser (e.g. --reasoning-parser detok_qwen3 --tool-call-parser detok_qwen3)"
        )
    return None


class Refusal(NamedTuple):
    """Why detok parsers cannot run in a server, and what to pass instead."""

    reason: str
    remedy: str


def names_problem(reasoning: str | None, tool: str | None, refusal: Refusal | None) -> str | None:
    """What is wrong with these parser names for this server, or None. ``refusal``: why the
    plugin cannot act in this server (None when it can).

    >>> names_problem(None, "detok_hermes", Refusal("detok-plugin is off (DETOK_PLUGIN=0)", "start vLLM with DETOK_PLUGIN=1"))
    "--tool-call-parser detok_hermes names a detok-plugin parser, which cannot run in this server because detok-plugin is off (DETOK_PLUGIN=0): start vLLM with DETOK_PLUGIN=1, or name one of vLLM's own parsers"
    """
    flags = [(f, n) for f, n in (("--reasoning-parser", reasoning), ("--tool-call-parser", tool)) if is_detok(n)]
    if not flags:
        return None
    if refusal is not None:
        named = " and ".join(f"{flag} {name}" for flag, name in flags)
        return (
            f"{named} name{'s' if len(flags) == 1 else ''} a detok-plugin parser, which cannot run in this server "
            f"because {refusal.reason}: {refusal.remedy}, or name one of vLLM's own parsers"
        )
    known_reasoning, known_tools = detok_names()
    for flag, name, known in (("--reasoning-parser", reasoning, known_reasoning), ("--tool-call-parser", tool, known_tools)):
        if is_detok(name) and name not in known:
            return f"{flag} {name}: no detok parser has that name (these do: {', '.join(sorted(known))})"
    return pair_problem(reasoning, tool)


# --- the hook at vLLM's validation ------------------------------------------------------


class _Guard:
    """Why detok parsers cannot run in this process (None: they can); one per process."""

    refusal: Refusal | None = None


def _checked(args: Any) -> Any:
    """vLLM's ``validate_api_server_args``, with the detok names checked first."""
    problem = names_problem(*_framework.parser_names(args), _Guard.refusal)
    if problem is not None:
        raise ValueError(problem)
    launcher = _framework.launcher_module()
    assert launcher is not None  # this function is installed in it
    return PATCHES.stock(launcher, _framework.VALIDATOR)(args)


def _install(launcher: ModuleType) -> None:
    """Put :func:`_checked` in front of vLLM's validator (the hook's work); never raises
    into vLLM's import of its launcher."""
    try:
        with PATCHES.lock:
            if PATCHES.is_ours(launcher, _framework.VALIDATOR):
                return
            problems = _framework.validator_problems(launcher)
            if problems:
                logger.warning(
                    "detok-plugin: detok_* parser names are checked when vLLM composes the parser, "
                    "not at argument validation: %s", "; ".join(problems),
                )
                return
            PATCHES.install(launcher, _framework.VALIDATOR, _checked)
    except Exception as exc:
        logger.warning("detok-plugin: detok_* parser names not checked at argument validation: %r", exc)


#: Waits, costing one string comparison per import, for vLLM's launcher module.
_HOOK = ImportHook(_framework.LAUNCHER_MODULE, _install)


def guard(refusal: Refusal | None) -> None:
    """Check detok parser names at vLLM's argument validation, from now on (or as soon as
    vLLM's launcher module is imported). ``refusal``: why the plugin cannot act in this
    process, said to a server that names a detok parser (None: it can)."""
    with PATCHES.lock:
        _Guard.refusal = refusal
        _HOOK.arm()


def unguard() -> None:
    """Put vLLM's validator back (and stop waiting for its module)."""
    with PATCHES.lock:
        _HOOK.disarm()
        launcher = _framework.launcher_module()
        if launcher is not None:
            PATCHES.uninstall(launcher, _framework.VALIDATOR)
