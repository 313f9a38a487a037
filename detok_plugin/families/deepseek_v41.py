"""DeepSeek V4.1: V4's DSML with a space after ``｜DSML｜`` in every tag, in ``<｜DSML｜ calls>``.

::

    <｜DSML｜ calls>
    <｜DSML｜ invoke name="get_weather">
    <｜DSML｜ parameter name="city" string="true">東京</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

The grammar and its rules are V4's (``deepseek_v4.py``); only the spelling differs, as
vLLM 0.33's ``deepseek_v41`` parser overrides only V4's terminals. A V4 spelling inside a
V4.1 body is not a tag; the opening tag begins with the same two newlines as V4's.

>>> from detok_plugin import parse_tool_body
>>> parse_tool_body('<｜DSML｜ invoke name="f">\\n</｜DSML｜ invoke>', "deepseek_v41")
[('f', '{}')]
"""

from __future__ import annotations

from ._format import Family
from .deepseek_v4 import DSML, dsml_format, dsml_preset, grammar

__all__ = ["FAMILY"]

_V41 = f"<{DSML} calls>"

FAMILY = Family(dsml_format("deepseek_v41", grammar(" ", (_V41,))), (dsml_preset("deepseek_v41", _V41),))
