"""Switching a shim on when its framework is first imported, and the ``.pth`` line that arms it.

A regular install ships a one-line ``.pth`` file per shim; Python runs it at every
interpreter start. With ``DETOK_PLUGIN=1`` it arms an :class:`ImportHook`: a finder at the
front of ``sys.meta_path`` that costs nothing until the module it waits for (transformers'
streamers, TGI's serving module) is imported, and then runs that module's real loader and
the shim's install right after it, once. Nothing of the framework is imported early.

Used by ``detok_plugin.integrations.transformers`` and ``detok_plugin.integrations.tgi``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["ImportHook", "manage_pth"]


class ImportHook(importlib.abc.MetaPathFinder):
    """Calls ``on_load(module)`` once, right after ``fullname`` is first imported."""

    def __init__(self, fullname: str, on_load: Callable[[ModuleType], None]) -> None:
        self.fullname = fullname
        self.on_load = on_load

    def arm(self) -> None:
        """Call ``on_load`` now if the module is loaded, else at its first import."""
        module = sys.modules.get(self.fullname)
        if module is not None:
            self.on_load(module)
        elif self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def disarm(self) -> bool:
        """Stop waiting; returns whether the hook was armed."""
        armed = self in sys.meta_path
        while self in sys.meta_path:
            sys.meta_path.remove(self)
        return armed

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.fullname:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, self)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    """The module's real loader, then the hook's ``on_load``."""

    def __init__(self, loader: Any, hook: ImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook.disarm()
        self._hook.on_load(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename ... for tracebacks
        return getattr(self._loader, name)


def manage_pth(action: str, target: Path, line: str, what: str) -> int:
    """``install-pth``, ``remove-pth`` or ``show-pth`` for the ``.pth`` file ``target``
    holding ``line``; ``what`` says in the message what the line switches."""
    if action == "show-pth":
        print(f"{target}\n{line}")
    elif action == "install-pth":
        target.write_text(line + "\n", encoding="utf-8")
        print(f"wrote {target}; {what}")
    else:
        existed = target.exists()
        target.unlink(missing_ok=True)
        print(f"removed {target}" if existed else f"nothing to remove at {target}")
    return 0


PTH_ACTIONS: Sequence[str] = ("install-pth", "remove-pth", "show-pth")
