"""Shims that put the core into serving stacks, one package per stack: ``transformers``,
``vllm``, ``tgi``; and ``common``, what every shim needs written once (the ``DETOK_PLUGIN``
switch, the patch registry, the start-up hooks and their ``.pth`` command).

In each stack's package one module, ``_framework``, imports the framework (lazily) and
checks its contract, so a new framework version is a change to one file. Importing a shim
imports no framework; using it without its framework raises an ImportError naming the
extra to install.
"""
