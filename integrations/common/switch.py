"""``DETOK_PLUGIN``: the one switch of every stack, read in one place.

Values, whatever the stack: ``1``/``true``/``yes``/``on`` (any case) switch it on;
``0``/``false``/``no``/``off`` switch it off; unset or empty leave the stack's own default
(off, except where the stack's own plugin list names the plugin: vLLM's ``VLLM_PLUGINS``);
any other value is a mistake: the stack stays stock. Each stack says what the switch did
(on, off, refused and why) in one line per process, and only in a process that imports its
framework (``common.startup``, ``vllm.plugin``); :attr:`Switch.source` is what that line
names.

>>> Switch.from_env({"DETOK_PLUGIN": "Yes"}).state
'on'
>>> Switch.from_env({"DETOK_PLUGIN": "maybe"}).problem
"DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored"
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Literal

__all__ = ["ENV_FLAG", "Switch"]

#: The environment variable every stack reads.
ENV_FLAG = "DETOK_PLUGIN"

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


@dataclasses.dataclass(frozen=True, slots=True)
class Switch:
    """What ``DETOK_PLUGIN`` says: ``on``, ``off``, ``unset`` (unset or empty) or
    ``invalid``; ``source`` names the setting for a log line; ``problem`` says what was
    wrong with an invalid value (else None)."""

    state: Literal["on", "off", "unset", "invalid"]
    source: str
    problem: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Switch:
        env = os.environ if environ is None else environ
        raw = env.get(ENV_FLAG, "")
        value = raw.strip().lower()
        if value in _ON:
            return cls("on", f"{ENV_FLAG}={raw}")
        if value in _OFF:
            return cls("off", f"{ENV_FLAG}={raw}")
        if not value:
            return cls("unset", f"{ENV_FLAG} is not set")
        problem = f"{ENV_FLAG}={raw!r} is not one of 1/0/true/false/yes/no/on/off; ignored"
        return cls("invalid", problem, problem)

    @property
    def on(self) -> bool:
        return self.state == "on"

