"""Exceptions raised by the reference runner.

The tree::

    RunnerError                         base of everything the runner raises
    ├── ModelNotFoundError              --model names nothing on disk
    │   (FileNotFoundError)
    ├── ModelLoadError (OSError)        a path exists but transformers cannot load it
    ├── ModelFetchError (RuntimeError)  the default model could not be downloaded/unpacked
    ├── DeviceError (RuntimeError)      --device names a device torch does not have
    ├── PromptError (ValueError)        an empty prompt, or a prompt id outside the vocabulary
    ├── PromptTypeError (TypeError)     a prompt that is neither str nor a sequence of int
    └── BatchTooLargeError              the batch's KV cache and logits do not fit
        (MemoryError)

Each inherits the builtin a caller would naturally catch, so ``except FileNotFoundError``
keeps working, and each message says what to change (the option or argument to fix).
The CLI prints the message and exits with status 2; nothing here is a bug report.
"""

from __future__ import annotations

__all__ = [
    "BatchTooLargeError",
    "DeviceError",
    "ModelFetchError",
    "ModelLoadError",
    "ModelNotFoundError",
    "PromptError",
    "PromptTypeError",
    "RunnerError",
]


class RunnerError(Exception):
    """Base class of every error the reference runner raises."""


class ModelNotFoundError(RunnerError, FileNotFoundError):
    """``--model`` names a path that does not exist."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        super().__init__(
            f"model {spec!r} not found: --model takes a local transformers model directory "
            "(with config.json) or a .gguf file; leave it out to use the embedded default, "
            "SmolLM2-135M-Instruct (nothing is downloaded from a model hub)"
        )


class ModelLoadError(RunnerError, OSError):
    """A model path exists but is not a model transformers can load (wrapped cause attached)."""

    def __init__(self, spec: str, reason: str) -> None:
        self.spec = spec
        super().__init__(f"cannot load model {spec!r}: {reason}")


class ModelFetchError(RunnerError, RuntimeError):
    """Downloading or unpacking the default model's wheel failed."""


class DeviceError(RunnerError, RuntimeError):
    """``--device`` asks for a device this torch build or machine does not have."""


class PromptError(RunnerError, ValueError):
    """A prompt of the right type whose value cannot be generated from."""

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        super().__init__(f"prompt {index}: {reason}")


class PromptTypeError(RunnerError, TypeError):
    """A prompt that is neither ``str`` nor a sequence of ``int`` token ids."""

    def __init__(self, index: int, value: object) -> None:
        self.index = index
        self.value = value
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(
            f"prompt {index} must be a str or a sequence of int token ids, "
            f"got {type(value).__name__} {shown}"
        )


class BatchTooLargeError(RunnerError, MemoryError):
    """The batch does not fit in the device's free memory."""

    def __init__(
        self,
        batch: int,
        tokens: int,
        need_bytes: int | None,
        free_bytes: int | None,
        device: str,
        largest_batch: int | None = None,
    ) -> None:
        self.batch = batch
        self.tokens = tokens
        self.need_bytes = need_bytes
        self.free_bytes = free_bytes
        self.largest_batch = largest_batch
        if need_bytes is not None and free_bytes is not None:
            sizes = f"needs about {_gib(need_bytes)} but {device} has {_gib(free_bytes)} free"
        else:
            sizes = f"ran out of memory on {device}"
        hint = f" (at most {largest_batch} fits)" if largest_batch else ""
        super().__init__(
            f"a batch of {batch} sequences of up to {tokens} tokens {sizes}; "
            f"lower --batch{hint} or --max-new-tokens"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
