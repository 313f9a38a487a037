"""Switching a shim on at interpreter start: the ``.pth`` line, its command, and the import hook.

A regular install ships a one-line ``.pth`` file per stack whose shim patches a framework
in place (transformers, TGI); Python runs it at every interpreter start. The line costs a
dict lookup unless ``DETOK_PLUGIN`` is set; set, it calls the stack's ``_startup()``, which
arms an :class:`ImportHook`: a finder at the front of ``sys.meta_path`` that costs nothing
until the module it waits for (transformers' streamers, TGI's serving module) is imported,
and then runs that module's real loader and the shim's install right after it, once.
Nothing of the framework is imported early, and nothing is said at start: each stack says
what the switch did (on, off, refused and why) in one line when, and only when, its
framework's module is imported in that process (:func:`arm_at_start`), so a hook of one
stack is silent in another stack's process (vLLM's processes run every ``.pth`` line too).
The line goes out through :func:`say`, never ``warnings.warn`` (which, called from a
``.pth`` line, prints a raw ``<string>:1: UserWarning``). :func:`pth_command` is every
stack's ``python -m detok_plugin.integrations.<stack> {install-pth,remove-pth,show-pth}``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .patches import PATCHES
from .switch import Switch

__all__ = ["PTH_ACTIONS", "ImportHook", "arm_at_start", "pth_command", "pth_line", "say"]


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


def say(logger_name: str, level: int, line: str) -> None:
    """Say ``line`` where this process shows it: through ``logging`` (as ``logger_name``)
    when the application has set up a handler on its way (its configuration then decides),
    else as one plain line on stderr. Never raises."""
    log = logging.getLogger(logger_name)
    if log.hasHandlers():
        log.log(level, "%s", line)
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no usable stderr (pythonw, closed): nowhere to say it
        pass


#: The hooks that say "off", by the module each waits for (one per module and process).
_OFF_HOOKS: dict[str, ImportHook] = {}


def arm_at_start(hook: ImportHook, *, tell: Callable[[int, str], None], stock: str) -> None:
    """A stack's ``_startup()`` (what its ``.pth`` line calls at interpreter start).

    With ``DETOK_PLUGIN`` on, arm ``hook`` (its ``on_load`` patches and says so); off or a
    mistaken value, arm a hook on the same module that says ``detok-plugin: off (<why>);
    <stock>`` through ``tell(level, line)`` (a mistaken value as a warning); unset or empty,
    nothing. Either way nothing is said unless that module is imported in this process. It
    never raises: a ``.pth`` line that raises prints a traceback at every interpreter start.
    """
    switch = Switch.from_env()
    if switch.state == "unset":
        return
    try:
        with PATCHES.lock:
            if switch.on:
                hook.arm()
            elif hook.fullname not in _OFF_HOOKS:
                level = logging.WARNING if switch.problem else logging.INFO
                line = f"detok-plugin: off ({switch.source}); {stock}"
                off = _OFF_HOOKS[hook.fullname] = ImportHook(hook.fullname, lambda _module: tell(level, line))
                off.arm()
    except Exception as exc:  # never break interpreter start
        tell(logging.WARNING, f"detok-plugin: {switch.source}: could not wait for {hook.fullname}: {exc!r}; {stock}")


PTH_ACTIONS: Sequence[str] = ("install-pth", "remove-pth", "show-pth")


def pth_line(module: str) -> str:
    """The ``.pth`` line that calls ``module._startup()`` when ``DETOK_PLUGIN`` is set.
    Python's ``site`` module executes ``.pth`` lines that start with ``import``."""
    return f'import os; "DETOK_PLUGIN" in os.environ and __import__("{module}", fromlist=["_startup"])._startup()'


def pth_command(
    argv: Sequence[str] | None, *, module: str, pth_name: str, what: str, checks: Mapping[str, Callable[[], int]] | None = None
) -> int:
    """``python -m <module> {install-pth,remove-pth,show-pth}`` (and any of ``checks``):
    manage the one-line ``.pth`` file ``pth_name`` in a site-packages directory; ``what``
    says what the line switches."""
    import argparse
    import sysconfig

    checks = checks or {}
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}", description=f"Manage the one-line .pth file by which DETOK_PLUGIN=1 {what}."
    )
    parser.add_argument("action", choices=(*PTH_ACTIONS, *checks))
    parser.add_argument(
        "--site-dir", type=Path, default=Path(sysconfig.get_paths()["purelib"]),
        help="site-packages directory to write to (default: this interpreter's purelib)",
    )
    args = parser.parse_args(argv)
    if args.action in checks:
        return checks[args.action]()
    target, line = args.site_dir / pth_name, pth_line(module)
    if args.action == "show-pth":
        print(f"{target}\n{line}")
    elif args.action == "install-pth":
        target.write_text(line + "\n", encoding="utf-8")
        print(f"wrote {target}; DETOK_PLUGIN=1 now {what}")
    else:
        existed = target.exists()
        target.unlink(missing_ok=True)
        print(f"removed {target}" if existed else f"nothing to remove at {target}")
    return 0
