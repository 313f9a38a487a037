"""TGI: put the core into ``text-generation-server`` (TGI's Python shard), behind a flag.

Stock TGI turns ids into text in two places, both wrong in ways users have reported:

* each step, ``Model.decode_token`` re-decodes a prefix/read window and ships text only when
  it grew and does not end in U+FFFD, and ``utils.tokens.StoppingCriteria`` matches the
  regex ``stop + "$"`` over that streamed text: a stop that ends inside a token is missed
  (TGI #1039), the stop's text is streamed and kept (#1254, #1724), special-token text
  (``<|im_end|>``) is streamed;
* when a request ends, ``GeneratedText.text`` is ``decode_token`` over the last prompt id
  and the outputs, ``""`` when the output ends inside a character (#1235).

With the shim on, per request, a :class:`~detok_plugin.integrations.tgi.request.RequestText`
(over a :class:`detok_plugin.ServingStream`) does both. How it rides in TGI:

1. ``StoppingCriteria.from_pb`` is replaced by one that returns a subclass of TGI's
   ``StoppingCriteria`` (:func:`criteria_class`) with TGI's counters kept exact
   (``current_tokens``, ``max_new_tokens``, ``eos_token_ids``, ``ignore_eos_token``). TGI's
   batches carry it through ``filter`` and ``concatenate`` as they carry stock's, so the
   request's state moves and is freed with the request: there is no registry to leak.
2. ``generate_token`` of every ``Model`` class that defines it is wrapped: before the
   step, each new request's state is built from its prompt ids (a request whose state
   cannot be built stays stock, logged); during the step TGI calls the criteria once per
   id, which asks the core whether the id ends the request; after it, each ``Generation``
   gets the core's text per kept id (``tokens.texts``), ``is_special`` true only for a
   special id whose text is ``""``, and ``generated_text.text`` = the joined texts.
3. Nothing raises inside TGI's loop (a RuntimeError there kills the shard): unknown ids are
   logged and render as the tokenizer renders them; an unexpected error in a request's
   state is logged and that request goes on stock.

The switch: ``DETOK_PLUGIN=1`` in TGI's environment, through a one-line ``.pth`` start-up
hook that a regular install ships (editable installs: ``python -m
detok_plugin.integrations.tgi install-pth``). It imports nothing at start; it patches when
``text_generation_server.server`` (the serving module) is first imported, after TGI's CLI
has set up its logging, and says so in one line that TGI's launcher shows.
``DETOK_TGI_STOP`` and ``DETOK_TGI_STRIP_REASONING`` are the settings
(:class:`~detok_plugin.integrations.tgi.request.Settings`); :func:`install` and
:func:`uninstall` do it by hand.

The contract is private TGI API, checked by ``_framework`` (the package's one module that
imports TGI): :func:`install` patches only when :func:`contract_problems` finds nothing; a
contract whose source fingerprint (:func:`contract_fingerprint`) is not in
:data:`VERIFIED_CONTRACTS` is logged as unverified. The package: ``request`` (one request's
text, no TGI), ``step`` (the criteria and the ``generate_token`` wrapper), ``patching`` (switching it on).

>>> Settings.from_env({"DETOK_PLUGIN": "1"}).enabled
True
"""

from __future__ import annotations

from collections.abc import Sequence

from ..common.startup import pth_command, pth_line
from ..common.switch import ENV_FLAG
from ._framework import SERVER_MODULE, VERIFIED_CONTRACTS, contract_fingerprint, contract_problems
from .patching import install, installed, startup, uninstall
from .request import Settings
from .step import criteria_class

__all__ = [
    "ENV_FLAG",
    "PTH_LINE",
    "PTH_NAME",
    "SERVER_MODULE",
    "VERIFIED_CONTRACTS",
    "Settings",
    "contract_fingerprint",
    "contract_problems",
    "criteria_class",
    "install",
    "installed",
    "uninstall",
]

#: The ``.pth`` file and its one line: a dict lookup at interpreter start unless the flag is set.
PTH_NAME = "detok_plugin_tgi.pth"
PTH_LINE = pth_line("detok_plugin.integrations.tgi")

#: What the ``.pth`` line calls.
_startup = startup


def _check() -> int:
    problems = contract_problems()
    fingerprint = contract_fingerprint()
    print(f"contract {fingerprint}: {VERIFIED_CONTRACTS.get(fingerprint, 'not verified')}")
    print("\n".join(problems) if problems else "no problems: the shim can switch on")
    return 1 if problems else 0


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m detok_plugin.integrations.tgi {install-pth,remove-pth,show-pth,check}``."""
    return pth_command(
        argv, module="detok_plugin.integrations.tgi", pth_name=PTH_NAME,
        what="switches TGI's server to detok-plugin's text", checks={"check": _check},
    )
