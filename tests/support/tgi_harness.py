"""Drives TGI's own server code; run by ``DETOK_TGI_PYTHON`` (a Python with TGI's
``text_generation_server`` and detok-plugin importable) for tests/integrations/tgi/test_tgi_server.py and
benchmarks/bench_tgi.py. It reports what TGI did as JSON; the tests judge it.

Nothing here imitates TGI: the model is TGI's own non-flash ``CausalLM`` with TGI's own
``OPTForCausalLM``, loaded by TGI from a directory of tiny random weights over a real
tokenizer; batches are TGI's ``CausalLMBatch``, built from TGI's protobuf requests and
driven as TGI's router drives them: ``from_pb`` and ``generate_token`` for each arriving
wave (a prefill), ``generate_token`` on the running batch (a decode), ``filter`` after
every step in which a request finished, ``concatenate`` when a wave joins.

The weights are skewed so that sampling splits characters: the output embedding (tied to
the input one) keeps large rows only for ids that decode alone to U+FFFD (pieces of a
character), ids of multi-byte characters, punctuation, spaces and EOS; every other row is
zero. Sampling (temperature 1.5, top-k 30) is seeded per request (TGI's own
``Sampling``), so a run repeats.

Commands (``python tests/support/tgi_harness.py CMD ...``): ``model TOKENIZER_DIR OUT_DIR``,
``loop MODEL_DIR OUT_JSON``, ``client SOCKET MODEL_DIR OUT_JSON``.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import weakref
from pathlib import Path
from typing import Any

os.environ.setdefault("ATTENTION", "paged")
os.environ.setdefault("PREFIX_CACHING", "0")

#: Text whose characters the skewed model favours (multi-byte in UTF-8).
FAVOURED_TEXT = "你好，世界！🫨 ありがとう。é ü ß 😀👍 Ωμέγα — «ok» 1, 2;\n\n"
PROMPTS = ("Hello", "你好", "Q: 🫨?", "ありがとう", "Say: é", "1, 2,", "«", "Ω")


def make_model(tokenizer_dir: str, out_dir: str, seed: int = 0) -> None:
    """A tiny OPT over the tokenizer in ``tokenizer_dir``, saved with it in ``out_dir``."""
    import torch
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    config = OPTConfig(
        vocab_size=len(tok), hidden_size=32, word_embed_proj_dim=32, ffn_dim=64,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else eos,
        eos_token_id=eos, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
    )
    torch.manual_seed(seed)
    model = OPTForCausalLM(config).eval()
    favoured = favoured_ids(tok)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        keep = torch.zeros(emb.shape[0], dtype=torch.bool)
        keep[sorted(favoured)] = True
        emb[~keep] = 0.0
        emb[keep] = torch.randn(int(keep.sum()), emb.shape[1]) * 0.3
        for sid in set(_eos_ids(tok)) | set(_specials(tok)):
            emb[sid] = torch.randn(emb.shape[1]) * 0.6  # more often in the top k: requests end
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)


def _eos_ids(tok: Any) -> list[int]:
    return [tok.eos_token_id] if tok.eos_token_id is not None else []


def favoured_ids(tok: Any) -> set[int]:
    """Ids that decode alone to U+FFFD (at most 300), ids of FAVOURED_TEXT, EOS, and
    special tokens that are not BOS (at most 4; these and EOS with larger rows)."""
    n = len(tok)
    texts = tok.batch_decode([[i] for i in range(n)])
    pieces = [i for i, t in enumerate(texts) if "\ufffd" in t]
    step = max(1, len(pieces) // 300)
    ids = set(pieces[::step][:300])
    ids.update(tok(FAVOURED_TEXT, add_special_tokens=False)["input_ids"])
    ids.update(_eos_ids(tok))
    ids.update(_specials(tok))
    return ids


def _specials(tok: Any) -> list[int]:
    return [i for i in tok.all_special_ids if i != tok.bos_token_id and i < len(tok)][:4]


# --- TGI's loop, as its router drives it ----------------------------------------------


def load_model(model_dir: str) -> Any:
    import torch
    from text_generation_server.models.causal_lm import CausalLM
    from text_generation_server.models.custom_modeling.opt_modeling import OPTForCausalLM

    return CausalLM(model_id=model_dir, model_class=OPTForCausalLM, dtype=torch.float32)


def request_pb(rid: int, prompt: str, *, max_new_tokens: int, stops: list[str], seed: int,
               ignore_eos: bool = False) -> Any:
    from text_generation_server.pb import generate_pb2 as pb

    return pb.Request(
        id=rid, inputs=prompt, input_chunks=pb.Input(chunks=[pb.InputChunk(text=prompt)]),
        truncate=1024, prefill_logprobs=False, top_n_tokens=0,
        parameters=pb.NextTokenChooserParameters(
            temperature=1.5, top_k=30, top_p=1.0, typical_p=1.0, do_sample=True, seed=seed,
            repetition_penalty=1.0, frequency_penalty=0.0, watermark=False,
        ),
        stopping_parameters=pb.StoppingCriteriaParameters(
            max_new_tokens=max_new_tokens, stop_sequences=stops, ignore_eos_token=ignore_eos,
        ),
    )


def drive(model: Any, waves: list[list[Any]], every: int = 3) -> dict[int, dict[str, Any]]:
    """Run ``waves`` of requests through TGI's loop (a wave joins every ``every`` steps);
    per request id: its ids, streamed texts, ``is_special``, final text, finish reason,
    generated tokens, ``current_tokens`` at the end, and whether its criteria were freed
    after the ``filter`` that dropped it."""
    import torch
    from text_generation_server.pb import generate_pb2 as pb

    out: dict[int, dict[str, Any]] = {}
    refs: dict[int, Any] = {}
    running = None
    waves = list(waves)
    step = 0
    batch_id = 0
    while waves or running is not None:
        if waves and (running is None or step % every == 0):
            requests = waves.pop(0)
            batch_id += 1
            new = model.batch_type.from_pb(
                pb.Batch(id=batch_id, requests=requests, size=len(requests)),
                model.tokenizer, torch.float32, model.device,
            )
            # (a comprehension: a loop variable would keep the last criteria alive)
            refs.update({r.id: (weakref.ref(c), c) for r, c in zip(new.requests, new.stopping_criterias)})
            gens, new, _ = model.generate_token(new)  # prefill
            new = _record_and_filter(gens, new, out, refs)
            if running is not None and new is not None:
                running = model.batch_type.concatenate([running, new])
            elif new is not None:
                running = new
            del new
        else:
            gens, running, _ = model.generate_token(running)  # decode
            running = _record_and_filter(gens, running, out, refs)
        step += 1
        gc.collect()
        for rid, rec in out.items():
            if rec["finish_reason"] is not None and "freed" not in rec and rid in refs:
                rec["freed"] = refs[rid][0]() is None
    return out


def _record_and_filter(gens: list[Any], batch: Any, out: dict, refs: dict) -> Any:
    done = []
    for g in gens:
        rec = out.setdefault(g.request_id, {"ids": [], "texts": [], "is_special": [],
                                            "final": None, "finish_reason": None})
        rec["ids"] += [int(t) for t in g.tokens.token_ids]
        rec["texts"] += list(g.tokens.texts)
        rec["is_special"] += [bool(s) for s in g.tokens.is_special]
        if g.generated_text is not None:
            gt = g.generated_text
            rec.update(final=gt.text, finish_reason=int(gt.finish_reason),
                       generated_tokens=int(gt.generated_tokens))
            criteria = refs[g.request_id][1]
            rec["current_tokens"] = criteria.current_tokens
            rec["ours"] = type(criteria).__name__ == "DetokStoppingCriteria"
            refs[g.request_id] = (refs[g.request_id][0], None)  # drop our strong reference
            done.append(g.request_id)
    if batch is None or not done:
        return batch
    keep = [r.id for r in batch.requests if r.id not in done]
    return batch.filter(keep) if keep else None


def corpus(tok: Any, texts: dict[int, str] | None) -> list[list[Any]]:
    """Three waves of requests; with ``texts`` (a first run's text per request) some get
    stop strings taken from it: two characters from its middle, a multi-byte character,
    and a special token's text where the tokenizer has one that is not BOS or EOS."""
    specials = [t for t in tok.all_special_tokens if t not in (tok.bos_token, tok.eos_token)]
    waves: list[list[Any]] = []
    rid = 0
    for _wave in range(3):
        reqs = []
        for _k in range(8):
            rid += 1
            stops = [] if texts is None else _stops(rid, texts.get(rid, ""), specials)
            reqs.append(request_pb(rid, PROMPTS[rid % len(PROMPTS)], max_new_tokens=8 + (rid * 7) % 33,
                                   stops=stops, seed=1000 + rid, ignore_eos=rid % 5 == 0))
        waves.append(reqs)
    return waves


def _stops(rid: int, text: str, specials: list[str]) -> list[str]:
    """Request ``rid``'s stops, from a first run's ``text``: characters the output really
    has (a run between U+FFFD, which a user would not write)."""
    runs = [r for r in text.split("\ufffd") if r.strip()]
    if rid % 4 == 1 and runs:
        run = runs[len(runs) // 2]
        return [run[len(run) // 2:len(run) // 2 + 2]]
    if rid % 4 == 2:
        wide = [ch for ch in text if len(ch.encode()) > 1 and ch != "\ufffd"]
        return [wide[len(wide) // 2]] if wide else []
    if rid % 4 == 3 and specials:
        return [specials[rid % len(specials)]]
    if rid % 8 == 4 and runs:
        return [runs[0][:2]]
    return []


def loop(model_dir: str, out_json: str) -> None:
    """A first run (ours, no stops) to pick stop strings, then the corpus with them twice:
    through the shim and stock; every request's record, its prompt and stops."""
    from detok_plugin.integrations import tgi

    model = load_model(model_dir)
    assert tgi.install(tgi.Settings(enabled=True))
    first = drive(model, corpus(model.tokenizer, None))
    texts = {rid: rec["final"] for rid, rec in first.items()}
    waves = corpus(model.tokenizer, texts)
    ours = drive(model, waves)
    tgi.uninstall()
    stock = drive(model, corpus(model.tokenizer, texts))
    meta = {r.id: {"prompt": r.inputs, "stops": list(r.stopping_parameters.stop_sequences),
                   "max_new_tokens": r.stopping_parameters.max_new_tokens,
                   "ignore_eos": r.stopping_parameters.ignore_eos_token}
            for wave in waves for r in wave}
    Path(out_json).write_text(json.dumps({"meta": meta, "ours": ours, "stock": stock}))


# --- a real server, through TGI's own generated gRPC stubs ----------------------------


def client(socket: str, model_dir: str, out_json: str) -> None:
    """Prefill two waves, decode, filter finished requests, concatenate, as the router
    does, against ``text-generation-server serve`` on ``socket``."""
    import grpc
    from text_generation_server.pb import generate_pb2 as pb
    from text_generation_server.pb import generate_pb2_grpc as pb_grpc
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    channel = grpc.insecure_channel(f"unix://{socket}")
    stub = pb_grpc.TextGenerationServiceStub(channel)
    stub.Health(pb.HealthRequest(), timeout=60)
    info = stub.Info(pb.InfoRequest())
    waves = corpus(tok, None)[:2]
    waves[1][0].stopping_parameters.stop_sequences.append(" ")
    out: dict[int, dict[str, Any]] = {}
    batches: list[Any] = []
    for n, wave in enumerate(waves):
        resp = stub.Prefill(pb.PrefillRequest(batch=pb.Batch(id=n + 1, requests=wave, size=len(wave),
                                                             max_tokens=4096)))
        batches = _pb_record(stub, resp, batches, out)
        for _ in range(2):
            if batches:
                batches = _pb_record(stub, stub.Decode(pb.DecodeRequest(batches=batches)), [], out)
    while batches:
        batches = _pb_record(stub, stub.Decode(pb.DecodeRequest(batches=batches)), [], out)
    meta = {r.id: {"prompt": r.inputs, "stops": list(r.stopping_parameters.stop_sequences)} for w in waves for r in w}
    Path(out_json).write_text(json.dumps({"meta": meta, "requests": out, "device_type": info.device_type}))


def _pb_record(stub: Any, resp: Any, batches: list[Any], out: dict) -> list[Any]:
    from text_generation_server.pb import generate_pb2 as pb

    done = []
    for g in resp.generations:
        rec = out.setdefault(g.request_id, {"ids": [], "texts": [], "is_special": [], "final": None})
        rec["ids"] += list(g.tokens.ids)
        rec["texts"] += list(g.tokens.texts)
        rec["is_special"] += list(g.tokens.is_special)
        if g.HasField("generated_text"):
            rec.update(final=g.generated_text.text, finish_reason=int(g.generated_text.finish_reason),
                       generated_tokens=g.generated_text.generated_tokens)
            done.append(g.request_id)
    if resp.HasField("batch"):
        batch = resp.batch
        if done:
            keep = [i for i in batch.request_ids if i not in done]
            batch = stub.FilterBatch(pb.FilterBatchRequest(batch_id=batch.id, request_ids=keep)).batch if keep else None
        if batch is not None and batch.size:
            batches = batches + [batch]
    return batches


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"model": make_model, "loop": loop, "client": client}[cmd](*args)
