"""Command line: `constrain compile` (a schema → automaton and token-mask figures)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _vocabulary(name: str):
    from constrain import assets
    from constrain.vocabulary import Vocabulary, qwen3_vocabulary

    if name == "qwen3":
        return qwen3_vocabulary()
    return Vocabulary.from_gguf(assets.gguf_path(name))


def _compile(args: argparse.Namespace) -> int:
    from constrain.compiler import compile_json_schema
    from constrain.errors import RequestError

    schema = json.load(sys.stdin if args.schema == "-" else open(args.schema, encoding="utf-8"))
    t0 = time.perf_counter()
    vocab = _vocabulary(args.vocab)
    t1 = time.perf_counter()
    try:
        index = compile_json_schema(schema, vocab, strict=args.strict, cache=None)
        state = index.start()
        allowed = state.allowed_token_ids()
    except RequestError as err:
        print(json.dumps({"error": type(err).__name__, "pointer": err.pointer, "message": err.message}))
        return 2
    t2 = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    out: list[int] = []
    eos = set(vocab.eos_ids)
    while len(out) < args.max_tokens:
        allowed = state.allowed_token_ids()
        if state.is_accepting() and (rng.random() < 0.3 or len(allowed) == len(eos & set(allowed.tolist()))):
            break
        choices = [t for t in allowed.tolist() if t not in eos] or allowed.tolist()
        token = int(rng.choice(choices))
        state.advance(token)
        out.append(token)
    text = vocab.decode(out).decode("utf-8", errors="replace")
    print(json.dumps({
        "vocab": args.vocab, "n_tokens": vocab.n_tokens, "vocab_load_s": round(t1 - t0, 3),
        "dfa_states": index.dfa.n_states, "compile_and_first_mask_ms": round((t2 - t1) * 1000, 1),
        "random_walk_tokens": len(out), "random_walk_accepting": state.is_accepting(), "random_walk_text": text,
    }, ensure_ascii=False, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="constrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    comp = sub.add_parser("compile", help="compile a JSON Schema for a real vocabulary and walk one random valid output")
    comp.add_argument("schema", help="a JSON Schema file, or - for stdin")
    comp.add_argument("--vocab", default="llama-bpe", help="llama-bpe, qwen3, gemma-4, gpt-2, phi-3, ... (from the asset cache)")
    comp.add_argument("--strict", action="store_true", help="OpenAI strict mode")
    comp.add_argument("--max-tokens", type=int, default=200)
    comp.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return _compile(args)


if __name__ == "__main__":
    sys.exit(main())
