"""XML tool-call body reader: CPU time per character of a long streamed value, ours against
the quadratic reader it replaced, in one process.

* ``quadratic``: the XML reader at a156c98 (``integrations/_xml_stream.py`` then, read from git), which searched
  and copied the whole value on every feed.
* ``linear``: the reader in the working tree (``detok_plugin.families``, its XML dialects).

Each reads one Qwen3-Coder call whose string parameter is N characters of code (a file
written by a tool call), fed one character at a time as a token stream would, and a GLM-4.5
call whose typed (object) parameter is as long. Flat rows mean O(1) per character.

Run: ``.venv/bin/python benchmarks/bench_xml_body.py [--lengths 1000 8000 64000] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, interleaved_medians, table

from detok_plugin.families import tool_format

BASELINE = "a156c98"
LINES = "for i in range(n):\n    if a[i] < b:\n        out.append('</p>')\n"


def quadratic_reader() -> type:
    """The reader at BASELINE, loaded from git as a module of its own."""
    src = subprocess.run(
        ["git", "show", f"{BASELINE}:integrations/_xml_stream.py"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    path = Path(tempfile.mkdtemp()) / "xml_stream_quadratic.py"
    # Its value helpers live in detok_plugin.families._xml_values now, unchanged.
    path.write_text(src.stdout.replace("detok_plugin._xml_calls", "detok_plugin.families._xml_values"), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("xml_stream_quadratic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.XmlBodyReader  # type: ignore[no-any-return]


def bodies(n: int) -> dict[str, tuple[str, str]]:
    code = (LINES * (n // len(LINES) + 1))[:n]
    typed = json.dumps({"lines": code.splitlines()})[:n] + '"]}'
    return {
        "qwen3 string": ("qwen3_xml", f"<function=write_file>\n<parameter=content>\n{code}\n</parameter>\n</function>"),
        "glm45 object": ("glm45", f"write_file\n<arg_key>opts</arg_key>\n<arg_value>{typed}</arg_value>\n"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 8000, 64000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    quadratic = quadratic_reader()
    readers = {"quadratic": quadratic, "linear": lambda fmt, tools: tool_format(fmt).reader(tools)}
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"properties": {"opts": {"type": "object"}}}}}]
    rows = []
    for n in args.lengths:
        for case, (fmt, body) in bodies(n).items():

            def run(cls: Any, fmt: str = fmt, body: str = body) -> None:
                reader = cls(fmt, tools)
                for ch in body:
                    reader.feed(ch)

            runners = {name: (lambda cls=cls: run(cls)) for name, cls in readers.items()}
            t = interleaved_medians(runners, repeats=args.repeats, warmup=0)
            us = {name: t[name] / len(body) * 1e6 for name in readers}
            rows.append((n, case, f"{us['quadratic']:.2f}", f"{us['linear']:.2f}", f"{us['quadratic'] / us['linear']:.1f}x"))
    print(table(rows, ["chars", "body", "quadratic us/char", "linear us/char", "quadratic/linear"]))


if __name__ == "__main__":
    main()
