"""A fault put into a real vLLM server for tests/test_vllm_engine_handover.py.

Python imports ``sitecustomize`` at start-up from ``sys.path``, so a server started with this
folder on ``PYTHONPATH`` and ``DETOK_TEST_FAULT_AT=k`` gets a :class:`ServingStream` whose
``push_text`` raises on the ``k``-th id of every request (counted per request id): what a
bug in the core would do inside vLLM's output loop. Without the variable it does nothing.
Never on a path outside that test (pytest does not collect this folder: conftest.py).
"""

import os

_AT = int(os.environ.get("DETOK_TEST_FAULT_AT") or 0)

if _AT > 0:
    from detok_plugin import ServingStream

    _real = ServingStream.push_text
    _calls: dict[object, int] = {}

    def _faulty(self: ServingStream, token_id: int) -> str:
        n = _calls[self.request_id] = _calls.get(self.request_id, 0) + 1
        if n == _AT:
            raise RuntimeError(f"injected by tests/fault_site at id {n} of request {self.request_id}")
        return _real(self, token_id)

    ServingStream.push_text = _faulty  # type: ignore[method-assign]
