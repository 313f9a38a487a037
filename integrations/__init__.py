"""Shims that put the core into serving stacks: ``transformers``, ``vllm``, ``tgi``.

Each submodule imports its framework lazily and raises an ImportError naming the extra
to install when the framework is missing.
"""
