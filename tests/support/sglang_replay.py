"""SGLang 0.5.23's own scheduler stop check and detokenizer step, driven by token ids.

Runs in ``.venv-sglang`` (``scripts/setup_sglang.sh``), called by
``tests/integrations/sglang/test_sglang_replay.py``::

    .venv-sglang/bin/python tests/support/sglang_replay.py NAME=TOKENIZER_DIR ... > results.json

For each tokenizer, every case (named ids, and seeded random ones) becomes a real SGLang
``Req`` (real ``SamplingParams``, normalized by SGLang) whose output ids are appended one per
step, in one batch with the tokenizer's other cases, as SGLang's scheduler does: its
``update_finish_state`` (which calls ``_check_str_based_finish``), then the output
streamer's rule (a finished request is sent; a live one unless
``check_match_stop_str_prefix``), its ``init_incremental_detokenize`` for the payload, and a
real ``DetokenizerManager``'s ``_decode_batch_token_id_output`` for the text. Once stock,
then with ``detok_plugin.integrations.sglang.register()``. Prints, per tokenizer and case,
each run's deltas (step, text), finish and the oracle:
``decode(prompt + out)[len(decode(prompt)):]`` with the request's flags, cut at the earliest
completing stop (kept with ``no_stop_trim``), a stop token's text left out.
"""

from __future__ import annotations

import json
import os
import random
import sys
import types
from array import array
from typing import Any

from helpers import GPT2_BYTES

STOP_USER = "\n\nUser:"


def byte_ids(tok: Any, data: bytes) -> list[int]:
    """One token per byte (SentencePiece ``<0xNN>`` pieces, or byte-level BPE's byte tokens)."""
    if tok.convert_tokens_to_ids("<0xE4>") not in (None, tok.unk_token_id):
        return [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in data]
    table = _BYTE_CHARS
    return [tok.convert_tokens_to_ids(table[b]) for b in data]


#: GPT-2's byte -> character map (byte-level BPE pieces spell bytes with it).
_BYTE_CHARS = {b: c for c, b in GPT2_BYTES.items()}


def char_ids(tok: Any, text: str) -> list[int]:
    """One token per character where the vocabulary has it alone, else the character's bytes."""
    out = []
    table = _BYTE_CHARS
    for c in text:
        data = c.encode()
        candidates = [c, "".join(table[b] for b in data)]
        found = None
        for piece in candidates:
            tid = tok.convert_tokens_to_ids(piece)
            if tid is not None and tid != tok.unk_token_id and tok.decode([tid]) == c:
                found = tid
                break
        out.extend([found] if found is not None else byte_ids(tok, data))
    return out


def enc(tok: Any, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def skipped_special(tok: Any) -> int:
    """A special token the decode skips with skip_special_tokens (not EOS)."""
    eos = tok.eos_token_id
    for tid in tok.all_special_ids:
        if tid != eos and tok.decode([tid], skip_special_tokens=True) == "" and tok.decode([tid]):
            return int(tid)
    raise LookupError("no skippable special token")


def cases(tok: Any) -> dict[str, dict[str, Any]]:
    """The named cases (what the issue lists), then seeded random ones."""
    ni = byte_ids(tok, "你".encode())
    special = skipped_special(tok)
    c: dict[str, dict[str, Any]] = {
        "plain": {"out": enc(tok, "Hello world, this is fine.")},
        "split_characters": {"out": enc(tok, "Hi ") + byte_ids(tok, "你好🫨".encode()) + enc(tok, " ok")},
        "prompt_ends_inside_a_character": {"prompt": enc(tok, "Say: ") + ni[:2], "out": ni[2:] + enc(tok, "好 ok")},
        "stop_spelled_char_by_char": {
            "out": enc(tok, "Sure thing") + char_ids(tok, STOP_USER) + enc(tok, " more text"), "stop": [STOP_USER]},
        "cjk_stop_in_byte_tokens": {
            "out": enc(tok, "好的") + byte_ids(tok, "结束".encode()) + enc(tok, "之后"), "stop": ["结束"]},
        "stop_in_ordinary_tokens": {"out": enc(tok, "one two END three"), "stop": ["END"]},
        "stop_kept_no_stop_trim": {"out": enc(tok, "one two END three"), "stop": ["END"], "no_stop_trim": True},
        "partial_stop_that_breaks": {"out": enc(tok, "one EN two END"), "stop": ["END"]},
        "stop_across_a_skipped_special_token": {
            "out": enc(tok, "xx") + char_ids(tok, "Z") + [special] + char_ids(tok, "Q") + enc(tok, " yy"), "stop": ["ZQ"]},
        "special_token_kept": {"out": enc(tok, "a") + [special] + enc(tok, " b"), "skip": False},
        "length_cut_inside_a_character": {"out": enc(tok, "ok ") + ni[:2]},
        "eos_ends_the_stream": {"out": enc(tok, "bye") + [tok.eos_token_id] + enc(tok, "never")},
        "byte_run_then_invalid_byte": {"out": enc(tok, "x") + byte_ids(tok, "你".encode() + b"\x80") + enc(tok, " ok")},
    }
    for seed in range(6):
        c[f"random_{seed}"] = _random_case(tok, seed)
    for case in c.values():
        case.setdefault("prompt", enc(tok, "Q: "))
    return c


_POOL = ("Hello", " 世界", "🫨", " émoji", "结束", "\n\n", "User:", " the end", "Ω", "ok", "👍🏽", " 日本語")


def _random_case(tok: Any, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    out: list[int] = []
    for _ in range(rng.randint(4, 9)):
        piece = rng.choice(_POOL)
        how = rng.random()
        out += byte_ids(tok, piece.encode()) if how < 0.3 else char_ids(tok, piece) if how < 0.5 else enc(tok, piece)
    text = tok.decode(out, skip_special_tokens=True)
    stop: list[str] = []
    if rng.random() < 0.7 and len(text) > 4:
        at = rng.randrange(1, len(text) - 2)
        stop = [text[at : at + rng.randint(1, 3)].replace("\ufffd", "") or "Ω"]
    return {"out": out, "stop": stop}


def oracle(tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    prompt, out, stops = case.get("prompt", []), case["out"], case.get("stop", [])
    skip, keep = case.get("skip", True), case.get("no_stop_trim", False)

    def text(ids: list[int]) -> str:
        return tok.decode(prompt + ids, skip_special_tokens=skip)[len(tok.decode(prompt, skip_special_tokens=skip)) :]

    found: dict[str, Any] = {"text": text(out), "steps": len(out), "finish": "length"}
    for k in range(1, len(out) + 1):
        t = text(out[:k])
        hits = [(t.find(s), s) for s in stops if s in t]
        if hits:
            pos, s = min(hits)
            found = {"text": t[: pos + len(s)] if keep else t[:pos], "steps": k, "finish": "stop", "matched": s}
            break
        if out[k - 1] == tok.eos_token_id:
            found = {"text": t if keep else text(out[: k - 1]), "steps": k, "finish": "eos"}
            break
    final, steps = found["text"], found["steps"]
    found["settled"] = [_settled(tok, text, out, k, stops, final) for k in range(1, steps)] + [len(final)]
    return found


def _settled(tok: Any, text: Any, out: list[int], k: int, stops: list[str], final: str) -> int:
    """How many characters of ``final`` every continuation of ``out[:k]`` keeps (none, an
    invalid byte, a letter: a SentencePiece byte run turns to U+FFFD whole on an invalid
    byte), less the ids that overlap a genuine partial stop (the scheduler holds ids)."""
    base = os.path.commonprefix([text(out[:k] + more).rstrip("\ufffd") for more in ([], byte_ids(tok, b"\x80"), enc(tok, "a"))])
    for n in range(min(len(base), max(map(len, stops), default=0)), 0, -1):
        if any(s.startswith(base[-n:]) for s in stops):  # the ids from the one the partial stop starts in
            j = max(j for j in range(k) if len(text(out[:j]).rstrip("\ufffd")) <= len(base) - n)
            base = os.path.commonprefix([base, text(out[:j]).rstrip("\ufffd")])
            break
    return len(os.path.commonprefix([base, final]))


def detokenizer_manager(tok: Any, capacity: int = 1 << 16) -> Any:
    """SGLang's own ``DetokenizerManager`` with the state its step reads, built without its
    ``__init__`` (which starts the process's sockets)."""
    from sglang.srt.managers.detokenizer_manager import DetokenizerManager, LimitedCapacityDict

    manager = DetokenizerManager.__new__(DetokenizerManager)
    manager.tokenizer, manager.vocab_size = tok, len(tok)
    manager.decode_status = LimitedCapacityDict(capacity=capacity)
    manager.disable_tokenizer_batch_decode = False
    manager.is_tool_call_parser_gpt_oss = False
    manager.tool_close_token_ids = frozenset()
    return manager


def run(tok: Any, named: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every case of one tokenizer, in one batch, through SGLang's scheduler and detokenizer."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    manager = detokenizer_manager(tok)
    reqs: dict[str, Any] = {}
    for name, case in named.items():
        sp = SamplingParams(
            max_new_tokens=len(case["out"]), stop=case.get("stop") or None,
            skip_special_tokens=case.get("skip", True), no_stop_trim=case.get("no_stop_trim", False),
        )
        sp.normalize(tok)
        req = Req(name, "", array("q", case["prompt"]), sp, stream=True,
                  eos_token_ids={tok.eos_token_id}, vocab_size=len(tok))
        req.tokenizer = tok
        reqs[name] = req
    deltas: dict[str, list[list[Any]]] = {name: [] for name in named}
    for step in range(max(len(c["out"]) for c in named.values())):
        batch = _step(reqs, named, step)
        if not batch:
            continue
        texts = manager._decode_batch_token_id_output(batch)
        for rid, text in zip(batch.rids, texts):
            deltas[rid].append([step + 1, text])
    return {
        name: {"deltas": deltas[name], "finish": _finish(req), "steps": len(req.output_ids)}
        for name, req in reqs.items()
    }


def _step(reqs: dict[str, Any], named: dict[str, dict[str, Any]], step: int) -> Any:
    rows: dict[str, list[Any]] = {name: [] for name in (
        "rids", "decoded_texts", "decode_ids", "read_offsets", "finished_reasons", "no_stop_trim",
        "skip_special_tokens", "spaces_between_special_tokens")}
    for name, req in reqs.items():
        out = named[name]["out"]
        if req.finished() or step >= len(out):
            continue
        req.output_ids.append(out[step])
        req.update_finish_state()
        if req.finished():
            if req.finished_len is None:
                req.finished_len = len(req.output_ids)
        elif req.check_match_stop_str_prefix():
            continue
        decode_ids, read_offset = req.init_incremental_detokenize()
        rows["rids"].append(name)
        rows["decoded_texts"].append(req.decoded_text)
        rows["decode_ids"].append(decode_ids[req.send_decode_id_offset :])
        req.send_decode_id_offset = len(decode_ids)
        rows["read_offsets"].append(read_offset)
        rows["finished_reasons"].append(req.finished_reason.to_json() if req.finished_reason else None)
        rows["no_stop_trim"].append(req.sampling_params.no_stop_trim)
        rows["skip_special_tokens"].append(req.sampling_params.skip_special_tokens)
        rows["spaces_between_special_tokens"].append(req.sampling_params.spaces_between_special_tokens)
    return types.SimpleNamespace(**rows) if rows["rids"] else None


def _finish(req: Any) -> Any:
    reason = req.finished_reason.to_json() if req.finished_reason else None
    return {"reason": reason, "finished_len": req.finished_len}


def main(argv: list[str]) -> None:
    os.environ["DETOK_PLUGIN"] = "1"
    from detok_plugin.integrations.sglang import register, unregister
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    results: dict[str, Any] = {}
    for arg in argv:
        name, path = arg.split("=", 1)
        tok = (PreTrainedTokenizerFast if name == "deepseek_v3" else AutoTokenizer).from_pretrained(path)
        tok.additional_stop_token_ids = None  # what SGLang's get_tokenizer adds
        named = cases(tok)
        unregister()
        stock = run(tok, named)
        if not register():
            raise SystemExit("the plugin did not switch on")
        plugin = run(tok, named)
        unregister()
        results[name] = {
            case: {"stock": stock[case], "plugin": plugin[case], "oracle": oracle(tok, named[case]), "case": named[case]}
            for case in named
        }
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv[1:])
