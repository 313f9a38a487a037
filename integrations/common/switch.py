"""``DETOK_PLUGIN``: the one switch of every stack, read in one place.

Values, whatever the stack: ``1``/``true``/``yes``/``on`` (any case) switch it on;
``0``/``false``/``no``/``off`` switch it off; unset or empty leave the stack's own default
(off, except where the stack's own plugin list names the plugin: vLLM's ``VLLM_PLUGINS``);
any other value is a mistake: the stack stays stock and says so once per process
(:func:`problem_once`), however many stacks read the switch in that process.

>>> Switch.from_env({"DETOK_PLUGIN": "Yes"}).state
'on'
>>> Switch.from_env({"DETOK_PLUGIN": "maybe"}).problem
"DETOK_PLUGIN='maybe' is not one of 1/0/true/false/yes/no/on/off; ignored"
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Literal

__all__ = ["ENV_FLAG", "Switch", "problem_once"]

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


_said: set[str] = set()
_lock = threading.Lock()


def problem_once(problem: str | None) -> str | None:
    """``problem`` (a switch's) the first time any stack asks in this process, else None: a
    mistaken value is said once, not once per stack whose hook runs there."""
    if problem is None:
        return None
    with _lock:
        if problem in _said:
            return None
        _said.add(problem)
    return problem
