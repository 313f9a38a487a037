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

Timing keeps the model and the detokenizer apart. The model step (forward plus picking) is
timed with CUDA events on CUDA, read after ``torch.cuda.synchronize()``, and with
``perf_counter_ns`` on CPU; the pushes are CPU work and always use ``perf_counter_ns``.
Callbacks run outside both timers.
"""

from __future__ import annotations

import operator
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from detok_plugin import Delta, DetokenizerState, ToolCall

from ._deps import torch
from .errors import BatchTooLargeError, PromptError, PromptTypeError
from .model import ModelSource, load_model

__all__ = [
    "GenerationSettings",
    "RunResult",
    "RunStats",
    "Runner",
    "SequenceResult",
    "estimate_batch_bytes",
]

Prompt = str | Sequence[int]
OnToken = Callable[[int, int, Delta], None]
Reasoning = Literal["separate", "strip", "inline"]


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """How to generate; the CLI's options map one to one onto these fields.

    ``temperature=0`` is greedy. ``stop``, ``tags`` and ``reasoning`` go to every row's
    :class:`DetokenizerState` unchanged. ``chat_template`` wraps ``str`` prompts in the
    tokenizer's chat template (as one user message) when it has one.
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
        if isinstance(self.stop, str):  # a lone string is one stop, not one per character
            object.__setattr__(self, "stop", (self.stop,))
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


@dataclass(frozen=True, slots=True)
class SequenceResult:
    """One row's outcome: its ids, the text each step released, and why it ended."""

    index: int
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    chunks: tuple[str, ...]
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    stop_reason: str | int | None

    @property
    def text(self) -> str:
        """The content stream, joined."""
        return "".join(self.chunks)

    @property
    def stopped_by_token(self) -> bool:
        """True when an EOS (``stop_reason is None``) or stop-token id ended the row."""
        return self.finish_reason == "stop" and not isinstance(self.stop_reason, str)

    @property
    def text_ids(self) -> tuple[int, ...]:
        """The generated ids whose text the stream carries: a final EOS or stop id dropped."""
        return self.token_ids[:-1] if self.stopped_by_token else self.token_ids


@dataclass(frozen=True, slots=True)
class RunStats:
    """Where one ``generate`` call's time went.

    ``model_ns`` holds one entry per forward pass (the prefill first); ``detok_ns`` is the
    total time inside ``DetokenizerState.push``/``finish`` over ``tokens`` pushes.
    """

    device: str
    timer: str
    batch: int
    tokens: int
    wall_ns: int
    model_ns: tuple[int, ...]
    detok_ns: int

    @property
    def steps(self) -> int:
        return len(self.model_ns)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens, all rows together, per second of wall time (prefill included)."""
        return self.tokens / (self.wall_ns / 1e9) if self.wall_ns else 0.0

    @property
    def prefill_ms(self) -> float:
        return self.model_ns[0] / 1e6 if self.model_ns else 0.0

    @property
    def model_ms_per_step(self) -> float:
        """Mean decode-step time (forward through the cache plus picking), prefill excluded."""
        decode = self.model_ns[1:] or self.model_ns
        return sum(decode) / len(decode) / 1e6 if decode else 0.0

    @property
    def detok_us_per_token(self) -> float:
        return self.detok_ns / self.tokens / 1e3 if self.tokens else 0.0

    @property
    def detok_share(self) -> float:
        """The detokenizer's fraction of a decode step: its per-step time over the step's total."""
        if not self.steps:
            return 0.0
        per_step = self.detok_ns / self.steps / 1e6
        return per_step / (per_step + self.model_ms_per_step) if per_step else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "timer": self.timer,
            "batch": self.batch,
            "steps": self.steps,
            "tokens": self.tokens,
            "wall_s": self.wall_ns / 1e9,
            "tokens_per_s": self.tokens_per_s,
            "prefill_ms": self.prefill_ms,
            "model_ms_per_step": self.model_ms_per_step,
            "detok_us_per_token": self.detok_us_per_token,
            "detok_share": self.detok_share,
        }


@dataclass(frozen=True, slots=True)
class RunResult:
    sequences: tuple[SequenceResult, ...]
    stats: RunStats


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
        self.pad_token_id = pad if pad is not None else (min(self.eos_token_ids) if self.eos_token_ids else 0)

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
                ids = tok.encode(text, add_special_tokens=False)
            else:
                ids = tok.encode(prompt)
        else:
            ids = _as_ids(prompt, index)
            for pos, tid in enumerate(ids):
                if not 0 <= tid < self.usable_vocab:
                    raise PromptError(
                        index, f"token id {tid} at position {pos} is outside the vocabulary 0..{self.usable_vocab - 1}"
                    )
        if not ids:
            raise PromptError(index, "is empty; the model needs at least one token to continue from")
        return list(ids)

    # --- generation --------------------------------------------------------------------

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        settings: GenerationSettings = GenerationSettings(),
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
        self._check_memory(n, longest, settings.max_new_tokens)
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
        dev, n = self.device, len(prompt_ids)
        # 1. Left padding: every row's last prompt token sits in the last column, so one
        # new column per step extends every row at once.
        longest = max(len(p) for p in prompt_ids)
        input_ids = torch.full((n, longest), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, longest), dtype=torch.long)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, longest - len(ids) :] = 1
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generator = None if settings.greedy else torch.Generator(device=dev).manual_seed(settings.seed)

        clock = _CudaClock() if dev.type == "cuda" else _CpuClock()
        chunks: list[list[str]] = [[] for _ in range(n)]
        reasoning: list[list[str]] = [[] for _ in range(n)]
        tools: list[list[ToolCall]] = [[] for _ in range(n)]
        alive = list(range(n))
        detok_ns = tokens = 0

        def record(row: int, delta: Delta) -> None:
            chunks[row].append(delta.text)
            if delta.reasoning:
                reasoning[row].append(delta.reasoning)
            tools[row].extend(delta.tool_calls)

        _sync(dev)
        wall0 = time.perf_counter_ns()
        with torch.inference_mode():
            # 2. Prefill; logits_to_keep=1 keeps the (B, L, V) logits tensor out of memory.
            clock.start()
            out = self.model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
            )
            next_ids = _pick(out.logits[:, -1, : self.usable_vocab], settings, generator)
            clock.stop()
            while True:
                host = next_ids.tolist()
                # 4. Push each live row's token; time only the pushes.
                t0 = time.perf_counter_ns()
                deltas = [(row, states[row].push(host[row])) for row in alive]
                detok_ns += time.perf_counter_ns() - t0
                tokens += len(deltas)
                for row, delta in deltas:
                    record(row, delta)
                    if on_token is not None:
                        on_token(row, host[row], delta)
                # 5. The states decide who is done (EOS, stop string, max_new_tokens).
                alive = [row for row in alive if not states[row].finished]
                if not alive:
                    break
                # Finished rows keep decoding garbage in lockstep: cheaper than reshaping
                # the cache, and nobody reads their tokens.
                mask = torch.cat([mask, mask.new_ones((n, 1))], dim=1)
                positions = positions[:, -1:] + 1
                clock.start()
                out = self.model(
                    input_ids=next_ids[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=out.past_key_values,
                    use_cache=True,
                )
                next_ids = _pick(out.logits[:, -1, : self.usable_vocab], settings, generator)
                clock.stop()
        _sync(dev)
        wall_ns = time.perf_counter_ns() - wall0
        for row, state in enumerate(states):
            if not state.finished:  # unreachable while max_tokens is set; kept for safety
                t0 = time.perf_counter_ns()
                record(row, state.finish())
                detok_ns += time.perf_counter_ns() - t0

        sequences = tuple(
            SequenceResult(
                index=row,
                prompt_ids=tuple(prompt_ids[row]),
                token_ids=tuple(states[row].token_ids),
                chunks=tuple(chunks[row]),
                reasoning="".join(reasoning[row]),
                tool_calls=tuple(tools[row]),
                finish_reason=states[row].finish_reason or "length",
                stop_reason=states[row].stop_reason,
            )
            for row in range(n)
        )
        stats = RunStats(
            device=str(dev),
            timer=clock.name,
            batch=n,
            tokens=tokens,
            wall_ns=wall_ns,
            model_ns=clock.elapsed_ns(),
            detok_ns=detok_ns,
        )
        return RunResult(sequences, stats)

    def _check_memory(self, batch: int, prompt_len: int, max_new_tokens: int) -> None:
        """Refuse a batch whose estimate exceeds 90% of the device's free memory, before any
        allocation: on CPU an allocation failure is an untyped RuntimeError (or the OOM killer)."""
        free = _free_bytes(self.device)
        if free is None:
            return
        elem = next(self.model.parameters()).element_size()
        need = estimate_batch_bytes(self.model.config, batch, prompt_len, max_new_tokens, elem)
        budget = int(free * 0.9)
        if need > budget:
            one = estimate_batch_bytes(self.model.config, 1, prompt_len, max_new_tokens, elem)
            raise BatchTooLargeError(
                batch, prompt_len + max_new_tokens, need, free, str(self.device), budget // one if one else None
            )


def estimate_batch_bytes(config: Any, batch: int, prompt_len: int, max_new_tokens: int, elem: int) -> int:
    """Bytes a batch needs beyond the weights: the KV cache at full length, the prefill's
    live activations and attention scores, and float32 logits for sampling. An upper-end
    estimate: good enough to refuse a hopeless batch with a clear message."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = text.num_hidden_layers
    heads = text.num_attention_heads
    hidden = text.hidden_size
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    inter = getattr(text, "intermediate_size", None) or 4 * hidden
    total = prompt_len + max_new_tokens
    kv = 2 * layers * batch * total * kv_heads * head_dim * elem
    activations = batch * prompt_len * (4 * hidden + 3 * inter) * elem
    scores = batch * heads * prompt_len * prompt_len * elem
    logits = 3 * batch * text.vocab_size * 4
    return kv + activations + scores + logits


# --- helpers --------------------------------------------------------------------------


def _as_batch(prompts: Any) -> list[Any]:
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


def _as_ids(prompt: Any, index: int) -> list[int]:
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's own figure, or MemAvailable from /proc/meminfo."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclass(slots=True)
class _CpuClock:
    """Model-step timer on CPU: ``perf_counter_ns`` around each step (CPU work is synchronous)."""

    name: str = "perf_counter_ns"
    _t0: int = 0
    _ns: list[int] = field(default_factory=list)

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        self._ns.append(time.perf_counter_ns() - self._t0)

    def elapsed_ns(self) -> tuple[int, ...]:
        return tuple(self._ns)


@dataclass(slots=True)
class _CudaClock:
    """Model-step timer on CUDA: a pair of events per step, read once after a synchronize.

    Host timestamps around asynchronous kernel launches would measure launch time, not the
    step; events record on the stream itself.
    """

    name: str = "cuda_events"
    _pairs: list[tuple[Any, Any]] = field(default_factory=list)

    def start(self) -> None:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self._pairs.append((start, None))

    def stop(self) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pairs[-1] = (self._pairs[-1][0], end)

    def elapsed_ns(self) -> tuple[int, ...]:
        torch.cuda.synchronize()
        return tuple(int(s.elapsed_time(e) * 1e6) for s, e in self._pairs)
