"""The one module of the TGI shim that imports TGI, and the contract it checks.

The contract is private TGI API, and TGI's package version string says little (a source
build reports ``2.0.5-dev0``). :func:`contract_problems` checks the contract itself, and a
contract whose source fingerprint (:func:`contract_fingerprint`) is not in
:data:`VERIFIED_CONTRACTS` is logged as unverified. TGI is imported lazily, and only here.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
from types import ModuleType
from typing import Any

from ..common.startup import say

__all__ = [
    "FINISH_EOS_TOKEN",
    "FINISH_LENGTH",
    "FINISH_STOP_SEQUENCE",
    "SERVER_MODULE",
    "STOCK_ATTR",
    "VERIFIED_CONTRACTS",
    "contract_fingerprint",
    "contract_problems",
    "generate_token_classes",
    "log",
    "modules",
]

logger = logging.getLogger("detok_plugin.integrations.tgi")

#: TGI's ``FinishReason`` values (``proto/v3/generate.proto``); ``contract_problems`` checks them.
FINISH_LENGTH = 0
FINISH_EOS_TOKEN = 1
FINISH_STOP_SEQUENCE = 2

#: The serving module: importing it is what TGI's ``serve`` does after setting up logging.
SERVER_MODULE = "text_generation_server.server"

#: Contract fingerprints this shim was tested against, and where they come from.
VERIFIED_CONTRACTS = {
    "967a91e4ac09b2d9": "TGI main at db931fcf (v3.3.7 + 1; TGI is in maintenance mode since 2025-12)",
}

#: The attribute of a wrapped ``generate_token`` that holds TGI's own.
STOCK_ATTR = "__detok_stock__"

_HINT = "text-generation-server is not installed: the TGI shim runs inside TGI's Python server"


def modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    """TGI's ``utils.tokens``, ``models.types`` and ``models.model`` modules."""
    try:
        tokens = importlib.import_module("text_generation_server.utils.tokens")
        types = importlib.import_module("text_generation_server.models.types")
        model = importlib.import_module("text_generation_server.models.model")
    except ImportError as exc:
        raise ImportError(f"detok_plugin.integrations.tgi: {_HINT} ({exc})") from exc
    return tokens, types, model


def _params(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def generate_token_classes(base: type) -> list[type]:
    """``base`` and its loaded subclasses that define ``generate_token`` themselves."""
    found, todo, seen = [], [base], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        fn = cls.__dict__.get("generate_token")
        if fn is not None and not getattr(fn, "__isabstractmethod__", False):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def contract_problems() -> list[str]:
    """Every way the installed TGI differs from what the shim relies on; [] if none."""
    tokens, types, model = modules()
    problems: list[str] = []
    criteria = getattr(tokens, "StoppingCriteria", None)
    if criteria is None:
        return ["text_generation_server.utils.tokens.StoppingCriteria is gone"]
    factory = inspect.getattr_static(criteria, "from_pb", None)
    if not isinstance(factory, classmethod) or _params(factory.__func__) != ["cls", "pb", "tokenizer"]:
        problems.append("StoppingCriteria.from_pb is not a classmethod (cls, pb, tokenizer)")
    if _params(criteria.__call__) != ["self", "last_token", "last_output"]:
        problems.append("StoppingCriteria.__call__ is not (self, last_token, last_output)")
    init = _params(criteria.__init__)
    if init[:5] != ["self", "eos_token_ids", "stop_sequence_criterias", "max_new_tokens", "ignore_eos_token"]:
        problems.append(f"StoppingCriteria.__init__ takes {init}")
    for cls_name, fields in (("Tokens", ("token_ids", "logprobs", "texts", "is_special")),
                             ("GeneratedText", ("text", "generated_tokens", "finish_reason", "seed")),
                             ("Generation", ("request_id", "tokens", "generated_text"))):
        cls = getattr(types, cls_name, None)
        missing = [f for f in fields if f not in getattr(cls, "__dataclass_fields__", {})]
        if missing:
            problems.append(f"models.types.{cls_name} has no {', '.join(missing)}")
    pb = getattr(tokens, "FinishReason", None)
    codes = {"FINISH_REASON_LENGTH": FINISH_LENGTH, "FINISH_REASON_EOS_TOKEN": FINISH_EOS_TOKEN,
             "FINISH_REASON_STOP_SEQUENCE": FINISH_STOP_SEQUENCE}
    for name, value in codes.items():
        if getattr(pb, name, None) != value:
            problems.append(f"FinishReason.{name} is not {value}")
    base = getattr(model, "Model", None)
    if base is None:
        return problems + ["models.model.Model is gone"]
    for cls in generate_token_classes(base):
        fn = _stock_of(cls.__dict__["generate_token"])
        if _params(fn)[:2] != ["self", "batch"]:
            problems.append(f"{cls.__qualname__}.generate_token is not (self, batch, ...)")
    return problems


def contract_fingerprint() -> str:
    """A short hash of the source of what the shim relies on in TGI (the criteria, the
    generation records, ``Model.decode_token`` and the non-flash ``CausalLM`` step)."""
    tokens, types, model = modules()
    parts = [tokens.StoppingCriteria, types.Tokens, types.GeneratedText, types.Generation,
             model.Model.decode_token]
    causal = importlib.import_module("text_generation_server.models.causal_lm")
    parts.append(_stock_of(causal.CausalLM.__dict__["generate_token"]))
    digest = hashlib.sha256()
    for part in parts:
        digest.update(inspect.getsource(part).encode())
    return digest.hexdigest()[:16]


def _stock_of(fn: Any) -> Any:
    """The stock function behind ``fn`` (``fn`` itself unless it is our wrapper)."""
    return getattr(fn, STOCK_ATTR, fn)


def log(level: str, message: str) -> None:
    """Say one line where TGI's launcher shows it.

    The launcher shows only what the shard writes to stdout as loguru JSON
    (``text-generation-server serve --json-output``), and the shard's one loguru handler
    passes only records named inside ``text_generation_server``. So the line goes through
    loguru under that name. Without loguru (no TGI), as ``common.startup.say`` says it.
    """
    try:
        from loguru import logger as loguru_logger  # type: ignore[import-not-found]
    except ImportError:
        say(logger.name, logging.getLevelName(level), message)
        return
    loguru_logger.patch(_in_tgi).log(level, message)


def _in_tgi(record: Any) -> None:
    record["name"] = "text_generation_server.detok_plugin"
