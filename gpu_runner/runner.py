"""The reference generation loop: a causal LM with a KV cache, every sequence streamed.

This loop is the ground truth the integrations are compared with. It does only what every
serving stack does, in the plainest form:

1. encode B prompts (a ``str`` through the chat template when the tokenizer has one, or
   ready token ids), left-pad them into one ``(B, L)`` batch with an attention mask and
   position ids that start at 0 on each row's first real token;
2. prefill once, then feed one new token per row per step through the KV cache;
3. pick each row's next token: greedy (``temperature=0``) or sampled from a seeded
   ``torch.Generator`` (same seed, same batch: same tokens);
4. push each unfinished row's token into its own :class:`~detok_plugin.DetokenizerState`
   (``prompt_ids`` = that row's unpadded prompt) and forward the Delta;
5. a row ends when its state says so: at EOS, a ``--stop`` string, or ``max_new_tokens``.

EOS, as vLLM does it: the runner gives each state the model's EOS ids (the tokenizer's and
the generation config's), the state ends the stream there and leaves the EOS token's text
out even when special tokens are kept. ``SequenceResult.token_ids`` keeps the EOS id (it was
generated); ``SequenceResult.text_ids`` drops it. The invariant every test and ``verify``
checks is therefore, for a row that no stop string cut::

    result.text == decode(prompt + text_ids)[len(decode(prompt)):]   # same skip flag

Timing keeps the model and the detokenizer apart (``clocks.py``); callbacks run outside both
timers. The settings and results are plain data in ``settings.py`` and ``results.py``, the
memory check in ``memory.py``; their names are importable from here too.
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from detok_plugin import Delta, DetokenizerState, ToolCall

from ._deps import torch
from .clocks import StepClock, clock_for, synchronize
from .errors import BatchTooLargeError, PromptError, PromptTypeError
from .memory import check_batch_fits, estimate_batch_bytes
from .model import ModelSource, load_model
from .results import RunResult, RunStats, SequenceResult
from .settings import GenerationSettings

__all__ = [
    "GenerationSettings",
    "OnToken",
    "Prompt",
    "RunResult",
    "RunStats",
    "Runner",
    "SequenceResult",
    "estimate_batch_bytes",
]

Prompt = str | Sequence[int]
OnToken = Callable[[int, int, Delta], None]
_DEFAULTS = GenerationSettings()


class Runner:
    """A causal LM, its tokenizer and a device: ``generate(prompts) -> RunResult``.

    >>> runner = Runner.load()                       # doctest: +SKIP
    >>> result = runner.generate(["Say hi in Japanese."], GenerationSettings(max_new_tokens=20))  # doctest: +SKIP
    >>> result.sequences[0].text                     # doctest: +SKIP
    'こんにちは！'
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "",
        source: ModelSource | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        """Wrap a loaded causal LM. ``eos_token_ids`` defaults to the tokenizer's EOS plus the
        model's generation config's; pass ids to end rows elsewhere (``()``: never at EOS)."""
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or type(model).__name__
        self.source = source
        self.device: torch.device = next(model.parameters()).device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        # Models often pad their embedding past the tokenizer (Qwen: 151936 rows, 151669
        # ids). Those rows are never trained, but a sampler can still draw them; no tokenizer
        # can decode them, so the runner never picks them.
        self.usable_vocab = min(self.vocab_size, len(tokenizer))
        self.eos_token_ids = _eos_ids(model, tokenizer) if eos_token_ids is None else tuple(eos_token_ids)
        pad = tokenizer.pad_token_id
        # The pad id only fills positions the attention mask hides: any valid id will do.
        self.pad_token_id: int = pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0)

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        cache_dir: Path | str | None = None,
        progress: IO[str] | None = sys.stderr,
    ) -> Runner:
        """Load ``model`` (a directory, a .gguf file, or ``None`` for the default)."""
        m, tok, source = load_model(model, device=device, dtype=dtype, cache_dir=cache_dir, progress=progress)
        return cls(m, tok, name=source.label, source=source)

    # --- prompts -----------------------------------------------------------------------

    def encode(self, prompt: Prompt, *, index: int = 0, chat_template: bool = True) -> list[int]:
        """A prompt's token ids: a ``str`` through the chat template, or checked ids as given."""
        tok = self.tokenizer
        if isinstance(prompt, str):
            if chat_template and getattr(tok, "chat_template", None):
                text = tok.apply_chat_template(
                    [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
                )
                ids = list(tok.encode(text, add_special_tokens=False))
            else:
                ids = list(tok.encode(prompt))
        else:
            ids = _as_ids(prompt, index)
            for pos, tid in enumerate(ids):
                if not 0 <= tid < self.usable_vocab:
                    raise PromptError(
                        index, f"token id {tid} at position {pos} is outside the vocabulary 0..{self.usable_vocab - 1}"
                    )
        if not ids:
            raise PromptError(index, "is empty; the model needs at least one token to continue from")
        return ids

    # --- generation --------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        settings: GenerationSettings = _DEFAULTS,
        *,
        on_token: OnToken | None = None,
    ) -> RunResult:
        """Generate for every prompt at once; stream each row through its own state.

        ``on_token(row, token_id, delta)`` runs after every push, outside the timers.
        Raises :class:`PromptTypeError`/:class:`PromptError` for bad prompts and
        :class:`BatchTooLargeError` when the batch cannot fit.
        """
        batch = _as_batch(prompts)
        prompt_ids = [self.encode(p, index=i, chat_template=settings.chat_template) for i, p in enumerate(batch)]
        if not prompt_ids:
            raise ValueError("generate() needs at least one prompt")
        n, longest = len(prompt_ids), max(len(p) for p in prompt_ids)
        check_batch_fits(self.model, self.device, n, longest, settings.max_new_tokens)
        states = [
            DetokenizerState.from_tokenizer(
                self.tokenizer,
                prompt_ids=ids,
                skip_special_tokens=settings.skip_special_tokens,
                stop=settings.stop,
                eos_token_ids=self.eos_token_ids,
                max_tokens=settings.max_new_tokens,
                tags=settings.tags,
                reasoning=settings.reasoning,
                request_id=str(i),
            )
            for i, ids in enumerate(prompt_ids)
        ]
        try:
            return self._loop(prompt_ids, states, settings, on_token)
        except torch.OutOfMemoryError as exc:
            raise BatchTooLargeError(n, longest + settings.max_new_tokens, None, None, str(self.device)) from exc

    def _loop(
        self,
        prompt_ids: list[list[int]],
        states: list[DetokenizerState],
        settings: GenerationSettings,
        on_token: OnToken | None,
    ) -> RunResult:
        """Steps 1-5 of the module docstring, for one batch."""
        dev, n = self.device, len(prompt_ids)
        # 1. Left padding: every row's last prompt token sits in the last column, so one
        # new column per step extends every row at once.
        input_ids, mask, positions = _left_pad(prompt_ids, self.pad_token_id, dev)
        generator = None if settings.greedy else torch.Generator(device=dev).manual_seed(settings.seed)
        clock = clock_for(dev)
        rows = _Rows(states)
        alive = list(range(n))

        synchronize(dev)
        wall0 = time.perf_counter_ns()
        with torch.inference_mode():
            # 2. Prefill; logits_to_keep=1 keeps the (B, L, V) logits tensor out of memory.
            out, next_ids = self._step(clock, settings, generator, input_ids=input_ids, attention_mask=mask,
                                       position_ids=positions, use_cache=True, logits_to_keep=1)
            while True:
                # 4. Push each live row's token, then 5. the states decide who is done.
                alive = rows.push(alive, next_ids.tolist(), on_token)
                if not alive:
                    break
                # Finished rows keep decoding garbage in lockstep: cheaper than reshaping
                # the cache, and nobody reads their tokens.
                mask = torch.cat([mask, mask.new_ones((n, 1))], dim=1)
                positions = positions[:, -1:] + 1
                out, next_ids = self._step(clock, settings, generator, input_ids=next_ids[:, None], attention_mask=mask,
                                           position_ids=positions, past_key_values=out.past_key_values, use_cache=True)
        synchronize(dev)
        wall_ns = time.perf_counter_ns() - wall0
        rows.finish_all()
        stats = RunStats(
            device=str(dev),
            timer=clock.name,
            batch=n,
            tokens=rows.tokens,
            wall_ns=wall_ns,
            model_ns=clock.elapsed_ns(),
            detok_ns=rows.detok_ns,
        )
        return RunResult(rows.results(prompt_ids), stats)

    def _step(
        self, clock: StepClock, settings: GenerationSettings, generator: torch.Generator | None, **inputs: Any
    ) -> tuple[Any, torch.Tensor]:
        """2-3. One forward pass and the next id per row, timed together as the model's step."""
        clock.start()
        out = self.model(**inputs)
        next_ids = _pick(out.logits[:, -1, : self.usable_vocab], settings, generator)
        clock.stop()
        return out, next_ids


@dataclass(slots=True)
class _Rows:
    """Every row's state and what it has released so far, and the pushes' own time."""

    states: list[DetokenizerState]
    chunks: list[list[str]] = field(init=False)
    reasoning: list[list[str]] = field(init=False)
    tools: list[list[ToolCall]] = field(init=False)
    detok_ns: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        n = len(self.states)
        self.chunks = [[] for _ in range(n)]
        self.reasoning = [[] for _ in range(n)]
        self.tools = [[] for _ in range(n)]

    def push(self, alive: list[int], host: list[int], on_token: OnToken | None) -> list[int]:
        """4. Push each live row's token (only the pushes are timed), record and forward each
        delta, and 5. return the rows still alive."""
        t0 = time.perf_counter_ns()
        deltas = [(row, self.states[row].push(host[row])) for row in alive]
        self.detok_ns += time.perf_counter_ns() - t0
        self.tokens += len(deltas)
        for row, delta in deltas:
            self._record(row, delta)
            if on_token is not None:
                on_token(row, host[row], delta)
        return [row for row in alive if not self.states[row].finished]

    def finish_all(self) -> None:
        """Finish any unfinished state (unreachable while max_tokens is set; kept for safety)."""
        for row, state in enumerate(self.states):
            if not state.finished:
                t0 = time.perf_counter_ns()
                self._record(row, state.finish())
                self.detok_ns += time.perf_counter_ns() - t0

    def results(self, prompt_ids: list[list[int]]) -> tuple[SequenceResult, ...]:
        return tuple(
            SequenceResult(
                index=row,
                prompt_ids=tuple(prompt_ids[row]),
                token_ids=tuple(state.token_ids),
                chunks=tuple(self.chunks[row]),
                reasoning="".join(self.reasoning[row]),
                tool_calls=tuple(self.tools[row]),
                finish_reason=state.finish_reason or "length",
                stop_reason=state.stop_reason,
            )
            for row, state in enumerate(self.states)
        )

    def _record(self, row: int, delta: Delta) -> None:
        self.chunks[row].append(delta.text)
        if delta.reasoning:
            self.reasoning[row].append(delta.reasoning)
        self.tools[row].extend(delta.tool_calls)


# --- helpers --------------------------------------------------------------------------


def _left_pad(
    prompt_ids: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1. ``(input_ids, attention_mask, position_ids)``: rows padded on the left, positions
    starting at 0 on each row's first real token, so a row does not depend on its neighbours."""
    n, longest = len(prompt_ids), max(len(p) for p in prompt_ids)
    input_ids = torch.full((n, longest), pad_token_id, dtype=torch.long)
    mask = torch.zeros((n, longest), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        mask[row, longest - len(ids) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _as_batch(prompts: object) -> list[Prompt]:
    """A lone ``str`` is a batch of one; otherwise a sequence of prompts (never of bare ids:
    ``[1, 2, 3]`` could mean one tokenized prompt or three, so it is refused)."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
        raise PromptTypeError(0, prompts)
    for i, p in enumerate(prompts):
        if isinstance(p, int) or (hasattr(p, "__index__") and getattr(p, "ndim", 0) == 0):
            raise PromptTypeError(i, p)
    return list(prompts)


def _as_ids(prompt: object, index: int) -> list[int]:
    """Checked token ids from a sequence of ints or a 1-D tensor/array (never ``bool``)."""
    if hasattr(prompt, "tolist") and getattr(prompt, "ndim", 1) == 1:  # a 1-D tensor / array
        prompt = prompt.tolist()
    if isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise PromptTypeError(index, prompt)
    ids = []
    for v in prompt:
        if isinstance(v, bool):
            raise PromptTypeError(index, prompt)
        try:
            ids.append(operator.index(v))
        except TypeError:
            raise PromptTypeError(index, prompt) from None
    return ids


def _eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's EOS and the generation config's (chat models often add ``<|im_end|>``)."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(gen, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return tuple(sorted(ids))


def _pick(logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> torch.Tensor:
    """3. The next id per row: argmax, or a draw from softmax(logits / T) over the top k."""
    if generator is None:
        return logits.argmax(dim=-1)
    scores = logits.float() / settings.temperature
    if settings.top_k:
        kth = torch.topk(scores, min(settings.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
