"""Faults put into a real vLLM server for tests/integrations/vllm/test_vllm_engine_handover.py.

Python imports ``sitecustomize`` at start-up from ``sys.path``, so a server started with this
folder on ``PYTHONPATH`` and ``DETOK_TEST_FAULT_AT=k`` gets a :class:`ServingStream` whose
``push_text`` raises on the ``k``-th id of every request (counted per request id): what a
bug in the core would do inside vLLM's output loop; ``DETOK_TEST_CHAT_FAULT_AT=k`` makes the
detok chat parser fail on the ``k``-th step of every reply. Without either it does nothing.
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
            raise RuntimeError(f"injected by tests/support/fault_site at id {n} of request {self.request_id}")
        return _real(self, token_id)

    ServingStream.push_text = _faulty  # type: ignore[method-assign]

# ``DETOK_TEST_CHAT_FAULT_AT=k``: the detok chat parser's channels raise on their ``k``-th
# step of every reply (the chat parser's hand-over). Patched once the plugin registers its
# chat parsers, inside vLLM's plugin loading: importing vLLM here, at every interpreter's
# start-up, would run before vLLM's own set-up.
_CHAT_AT = int(os.environ.get("DETOK_TEST_CHAT_FAULT_AT") or 0)

if _CHAT_AT > 0:
    from detok_plugin.integrations.vllm import plugin as _shim

    _real_register = _shim._register_chat_parsers

    def _register_then_fault() -> None:
        _real_register()
        from detok_plugin import ChatStream

        real = ChatStream.message
        if getattr(real, "_faulty", False):
            return

        def faulty(self, ids, finished):  # type: ignore[no-untyped-def]
            self._test_steps = getattr(self, "_test_steps", 0) + 1
            if self._test_steps == _CHAT_AT:
                raise RuntimeError(f"injected by tests/support/fault_site at step {_CHAT_AT} of a reply")
            return real(self, ids, finished)

        faulty._faulty = True  # type: ignore[attr-defined]
        ChatStream.message = faulty  # type: ignore[method-assign]

    _shim._register_chat_parsers = _register_then_fault
