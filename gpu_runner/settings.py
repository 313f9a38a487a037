"""What one ``generate`` call is asked to do: :class:`GenerationSettings`.

The CLI's options map one to one onto these fields, and the server builds one per batch.
Plain data, no torch: importing it never loads a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GenerationSettings", "Reasoning"]

Reasoning = Literal["separate", "strip", "inline"]


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """How to generate; the CLI's options map one to one onto these fields.

    ``temperature=0`` is greedy. ``stop``, ``tags`` and ``reasoning`` go to every row's
    :class:`~detok_plugin.DetokenizerState` unchanged. ``chat_template`` wraps ``str`` prompts
    in the tokenizer's chat template (as one user message) when it has one.

    >>> GenerationSettings(stop="###").stop      # a lone string is one stop
    ('###',)
    >>> GenerationSettings(temperature=0).greedy
    True
    """

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    skip_special_tokens: bool = True
    stop: tuple[str, ...] = ()
    tags: str | None = None
    reasoning: Reasoning = "separate"
    chat_template: bool = True

    def __post_init__(self) -> None:
        stop: object = self.stop
        if isinstance(stop, str):  # a lone string is one stop, not one per character
            object.__setattr__(self, "stop", (stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 keeps the whole vocabulary), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
