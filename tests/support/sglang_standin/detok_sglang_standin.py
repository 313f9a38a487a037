"""Inert stand-ins for SGLang's kernel package (``sgl_kernel``) and torchvision, test-only.

PyPI has no CPU build of ``sglang-kernel`` (its CPU kernels exist only as source, for Intel
AMX), and torchvision's PyPI wheels are built against a CUDA torch. A text model served on
this CPU with ``SGLANG_USE_CPU_ENGINE=1 --device cpu --attention-backend torch_native
--disable-overlap-schedule`` takes torch's own path in every layer, so these two only have
to *import* (SGLang imports them at module level, for multimodal and GPU code).

This module makes them import, in ``.venv-sglang`` only (``scripts/setup_sglang.sh`` writes
the ``.pth`` line that calls :func:`install`; importing the module does nothing), and only
where the real package is not installed. Every
name in them is inert: any attribute is another inert name, and **calling any of them raises**
``NotImplementedError`` naming the op (``sgl_kernel.rmsnorm(...) is an inert test stand-in``),
so a test that reaches a kernel fails, loudly, instead of computing something wrong.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

__all__ = ["STANDINS", "install"]

#: The top-level packages stood in for.
STANDINS = ("sgl_kernel", "torchvision")


def _refuse(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name}(...) is an inert test stand-in (tests/support/sglang_standin): the real package is not "
        "installed in this venv, and no test may reach this op"
    )


class _InertMeta(type):
    """The type of every inert name: attributes are inert names too."""

    def __getattr__(cls, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return _inert(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _refuse(cls.__qualname__)


def _inert(qualname: str) -> type:
    """An inert name: a class (so that code may subclass it or test isinstance against it)
    whose instantiation, like any call, raises naming it."""
    return _InertMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": qualname.rsplit(".", 1)[0]})


class _InertModule(ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        value = _inert(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in STANDINS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+inert-test-standin"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` for each stand-in whose real package
    is not installed (a real one always wins)."""
    missing = [name for name in STANDINS if importlib.util.find_spec(name) is None]
    if missing and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
