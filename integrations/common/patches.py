"""One registry of what the shims replaced in a framework, so that each can be put back.

A patch replaces one attribute of one owner (a class or a module) and keeps what was there
(the *stock* value, read from the owner's own ``__dict__``: a ``classmethod`` object stays
one). Every stack's shim installs and uninstalls through :data:`PATCHES`; a second install
of the same attribute keeps the first stock value, so an install repeated (vLLM calls its
plugins in every process, sometimes twice) never takes ours for stock.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["PATCHES", "Patches"]

_MISSING: Any = object()


class Patches:
    """``(owner, name) -> (stock, ours)``, guarded by ``lock`` (re-entrant: a stack may hold
    it across several patches that go in together)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._patched: dict[tuple[int, str], tuple[Any, str, Any, Any]] = {}

    def install(self, owner: Any, name: str, ours: Any) -> Any:
        """Put ``ours`` at ``owner.name``; returns the stock value (None if it had none)."""
        with self.lock:
            key = (id(owner), name)
            held = self._patched.get(key)
            stock = held[2] if held is not None else vars(owner).get(name, _MISSING)
            self._patched[key] = (owner, name, stock, ours)
            setattr(owner, name, ours)
            return None if stock is _MISSING else stock

    def uninstall(self, owner: Any, name: str) -> bool:
        """Put the stock value back (or remove ours, where there was none); returns whether
        ours was there. Left alone if someone else replaced ours since."""
        with self.lock:
            held = self._patched.pop((id(owner), name), None)
            if held is None:
                return False
            _, _, stock, ours = held
            if vars(owner).get(name, _MISSING) is not ours:
                return False
            if stock is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, stock)
            return True

    def stock(self, owner: Any, name: str) -> Any:
        """The stock value behind ours, or None while ``owner.name`` is not patched."""
        held = self._patched.get((id(owner), name))
        return None if held is None or held[2] is _MISSING else held[2]

    def ours(self, owner: Any, name: str) -> Any:
        """What we installed at ``owner.name``, or None."""
        held = self._patched.get((id(owner), name))
        return None if held is None else held[3]

    def is_ours(self, owner: Any, name: str) -> bool:
        """Whether ``owner.name`` is what we installed, right now."""
        held = self._patched.get((id(owner), name))
        return held is not None and vars(owner).get(name, _MISSING) is held[3]


#: The process's one registry.
PATCHES = Patches()
