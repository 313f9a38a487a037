"""Finding, loading and building the causal LMs the runner drives.

:func:`load_model` turns a ``--model`` value into a ``(model, tokenizer)`` pair:

1. no value: the embedded default, SmolLM2-135M-Instruct, fetched once (``fetch.py``);
2. a ``.gguf`` file: ``from_pretrained(its directory, gguf_file=its name)``;
3. a directory with ``config.json``: a transformers checkpoint, loaded as is;
4. a directory holding exactly one ``.gguf`` file and no ``config.json``: that file.

Everything loads with ``local_files_only=True``: the runner never reaches a model hub.
transformers draws its own progress bars while it de-quantizes and loads weights (the CLI
turns them off with ``TQDM_DISABLE``).

:func:`tiny_random_model` builds a 2-layer Qwen3 with random weights for any tokenizer: its
near-uniform next-token distribution samples ids from the whole vocabulary, byte fragments
and special tokens included, which is the harshest stream a detokenizer can be fed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from ._deps import torch
from .errors import DeviceError, ModelLoadError, ModelNotFoundError
from .fetch import DEFAULT_MODEL_NAME, fetch_default_model

__all__ = [
    "DeviceName",
    "DtypeName",
    "ModelSource",
    "load_model",
    "resolve_model",
    "select_device",
    "select_dtype",
    "tiny_random_model",
]

DeviceName = Literal["auto", "cpu", "cuda"]
DtypeName = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's files are: a directory, and the GGUF file in it when there is one."""

    directory: Path
    gguf_file: str | None
    label: str

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments ``from_pretrained`` needs to load from this source offline."""
        kw: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file is not None:
            kw["gguf_file"] = self.gguf_file
        return kw


def resolve_model(
    spec: str | Path | None, *, cache_dir: Path | str | None = None, progress: IO[str] | None = sys.stderr
) -> ModelSource:
    """Map a ``--model`` value to a :class:`ModelSource` (steps 1-4 of the module docstring)."""
    if spec is None or str(spec) == "":
        path = fetch_default_model(cache_dir, progress=progress)
        return ModelSource(path.parent, path.name, DEFAULT_MODEL_NAME)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelNotFoundError(str(spec))
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(str(spec), "a file must be a .gguf model; otherwise pass the model's directory")
        return ModelSource(path.parent, path.name, path.stem)
    if (path / "config.json").is_file():
        return ModelSource(path, None, path.name)
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(path, ggufs[0], Path(ggufs[0]).stem)
    if ggufs:
        raise ModelLoadError(str(spec), f"the directory holds several .gguf files ({', '.join(ggufs)}); pass one of them")
    raise ModelLoadError(str(spec), "the directory holds neither config.json nor a .gguf file")


def select_device(name: str = "auto") -> torch.device:
    """``auto`` is CUDA when present, else CPU; asking for ``cuda`` without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"--device {name} was asked for but torch sees no CUDA device; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise DeviceError(f"--device {name!r} is not a torch device ({exc})") from exc


def select_dtype(name: str, device: torch.device, *, gguf: bool = False) -> torch.dtype:
    """``auto`` is float32 on CPU (fast there, and exact enough), bfloat16 on CUDA when
    supported, and float32 for a GGUF file everywhere: transformers keeps a GGUF's weights
    packed and computes in float32, so any other dtype casts every matmul's input and output
    (and says so in a warning), while the weights stay quantized whatever the dtype."""
    if name == "auto":
        if device.type == "cuda" and not gguf:
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {['auto', *dtypes]}, not {name!r}")
    return dtypes[name]


def load_model(
    spec: str | Path | None = None,
    *,
    device: torch.device | str = "auto",
    dtype: str = "auto",
    cache_dir: Path | str | None = None,
    progress: IO[str] | None = sys.stderr,
) -> tuple[Any, Any, ModelSource]:
    """Load ``(model, tokenizer, source)``: the model in eval mode on ``device``.

    Raises :class:`ModelNotFoundError` for a path that does not exist and
    :class:`ModelLoadError` (with the cause attached) for one transformers cannot load.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The device first: a wrong --device should fail before a 98 MB download.
    dev = select_device(device) if isinstance(device, str) else device
    source = resolve_model(spec, cache_dir=cache_dir, progress=progress)
    torch_dtype = select_dtype(dtype, dev, gguf=source.gguf_file is not None)
    if progress is not None:
        progress.write(f"detok-plugin: loading {source.label} on {dev} ({str(torch_dtype).removeprefix('torch.')})\n")
        progress.flush()
    label = str(source.directory / (source.gguf_file or ""))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.directory, **source.kwargs())
        # Any: transformers' typing of ``PreTrainedModel.to`` (a wrapped method) rejects a device.
        model: Any = AutoModelForCausalLM.from_pretrained(source.directory, dtype=torch_dtype, **source.kwargs())
    except ImportError as exc:
        # transformers raises ImportError when gguf or accelerate is missing: say which extra.
        raise ImportError(f"loading {label} needs an optional package ({exc}); pip install 'detok-plugin[gpu]'") from exc
    except Exception as exc:
        # A model directory can fail in many foreign ways (OSError for missing weights,
        # ValueError for an unknown architecture, struct errors for a torn GGUF). All mean
        # "this path is not a loadable model"; the cause stays attached for the traceback.
        raise ModelLoadError(label, f"{type(exc).__name__}: {exc}") from exc
    return model.to(dev).eval(), tokenizer, source


def tiny_random_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    device: torch.device | str = "cpu",
) -> Any:
    """A randomly initialised 2-layer Qwen3 causal LM whose vocabulary is ``tokenizer``'s.

    Built in code (no files), seeded without touching torch's global RNG. With
    ``initializer_range=0.02`` and 32 hidden units its logits are nearly flat, so sampling at
    temperature 1 draws ids from across the whole vocabulary.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call]  # its __init__ is unannotated
    return model.to(device).eval()
