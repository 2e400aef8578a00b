"""Command line: `constrain compile` (a schema → automaton and token-mask figures), `constrain serve` (the OpenAI-compatible server)."""

from __future__ import annotations

import argparse
import gc
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


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from constrain.engine import Engine
    from constrain.server import DEFAULT_MAX_BODY_BYTES, create_app

    if args.cache_max_bytes is not None:
        from constrain.compiler import DEFAULT_CACHE

        DEFAULT_CACHE.max_bytes = args.cache_max_bytes  # applied from the next lookup on
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("constrain.serve")
    t0 = time.perf_counter()
    engine = Engine.load(args.model, tool_format=args.tool_format, constrained=args.constrained_tools,
                         max_queue=args.max_queue, timeout=args.timeout, threads=args.threads,
                         compile_timeout=args.compile_timeout, shallower=args.shallower_schemas)
    log.info("model %s%s loaded in %.1f s: tool format %s, %s tools, queue %d, timeout %g s",
             engine.name, " (DEMO: tiny random weights, output is noise)" if engine.demo else "",
             time.perf_counter() - t0, engine.native_format or "none (text only)",
             "constrained" if engine.constrained else "free (validated after generation)", args.max_queue,
             args.timeout)
    # What start-up loaded (torch, transformers, the model, the vocabulary's tables) stays for the process's life: out
    # of the collector's view, an oldest-generation collection -- set off by some request's allocations, inside its
    # decoding step -- no longer walks it (110 ms with torch and transformers imported, 0.0 ms frozen). vLLM's engine
    # core freezes its start-up heap the same way.
    gc.collect()
    gc.freeze()
    log.info("listening on http://%s:%d/v1", args.host, args.port)
    # SIGTERM / Ctrl-C: uvicorn stops accepting, lets in-flight requests finish for up to --shutdown-timeout s, cancels
    # the rest (a cancelled stream's generation is cancelled with it), then re-raises the signal: the process ends by it
    uvicorn.run(create_app(engine, api_key=args.api_key, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES),
                host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=args.shutdown_timeout)
    engine.close()
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
    serve = sub.add_parser("serve", help="serve a transformers model over an OpenAI-compatible HTTP API")
    serve.add_argument("--model", default=None, help="a local transformers model directory (default: the embedded "
                       "demo model, a tiny random Qwen3 on the real Qwen3 tokenizer and chat template)")
    serve.add_argument("--tool-format", default="auto", choices=("auto", "hermes", "qwen3_xml", "gemma4", "llama3_json",
                                                                 "mistral", "mistral_v3", "json"))
    serve.add_argument("--constrained-tools", action="store_true",
                       help="constrain generation to the request's tool policy (else validate after generation)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")
    serve.add_argument("--max-queue", type=int, default=16, help="requests that may wait (more: 429)")
    serve.add_argument("--timeout", type=float, default=120.0, help="seconds per request (more: 504)")
    serve.add_argument("--max-body-bytes", type=int, default=None,
                       help="largest request body taken (default 8 MiB; more: 413)")
    serve.add_argument("--shallower-schemas", action="store_true",
                       help="a tool schema over the state budget with recursion or free-form nesting is compiled with "
                            "fewer levels of it (logged) instead of refused")
    serve.add_argument("--compile-timeout", type=float, default=30.0,
                       help="seconds a request's tool policy may take to compile (more: 400 budget_exceeded)")
    serve.add_argument("--cache-max-bytes", type=int, default=None,
                       help="bound on the compiled-index cache (default 1 GiB; least recently used evicted first)")
    serve.add_argument("--shutdown-timeout", type=float, default=30.0,
                       help="seconds in-flight requests get to finish on SIGTERM before they are cancelled")
    serve.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 for the demo model)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return _compile(args)


if __name__ == "__main__":
    sys.exit(main())
