"""What an array of tool calls costs on top of its item: constrain and xgrammar side by side.

`parallel_1to5_of_5` (bench_engine.py) is an array of 1..5 call objects over 5 BFCL tools; its item is the `anyOf`
of the 5 call objects. xgrammar writes the array as a repetition over the item's rules, so both cost it about the
same. constrain unrolls the copies of the item's automaton while they weigh little, and counts the items beside
the automaton once unrolling would weigh more (`schema.COUNTED_UNROLLED_SIZE`: 1..10 and 1..20 keep the item's 407
states; 1..5 is unrolled to 2,012, as before session 27 and again since session 28). For each vocabulary, TTFM
(schema -> compiled -> first mask, cold: no sub-automaton kept between compiles) of the item and of arrays of 1..5,
1..10 and 1..20 of it, both engines' compiles interleaved, `--repeats` rounds after one untimed; prints the medians
and each array's cost over the item.

Then what the count costs each token: 1..5 compiled counted and unrolled (the threshold set to 0, then lifted), the
same `--walks` sampled outputs (~400 tokens each, random allowed tokens, then steered to the end) replayed through
fresh indexes of both, the two replays interleaved walk by walk; prints mask + advance p50 / p90 / p99 per token.

Usage: python benchmarks/bench_array_items.py [--quick] [--vocabs llama3,qwen3,gemma4] [--repeats 15] [--walks 12]
                                              [--json PATH]
       (--quick, as CI runs it: llama3, 2 rounds, 2 walks of ~50 tokens)
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engine  # noqa: E402
from constrain import automaton as fa  # noqa: E402
from constrain import schema as schema_module  # noqa: E402
from constrain.index import TokenIndex  # noqa: E402
from workloads import Json, Workload, any_call, bfcl_tools  # noqa: E402


ARRAYS = (5, 10, 20)  # maxItems of the arrays timed (minItems 1); 5 is parallel_1to5_of_5


def workloads() -> list[Workload]:
    item = any_call(bfcl_tools()[:5])
    return [Workload("item", [Json(item)], "anyOf of 5 BFCL call objects")] + [
        Workload(f"1to{n}", [Json({"type": "array", "items": item, "minItems": 1, "maxItems": n})],
                 f"array of 1..{n} of them" + (" (parallel_1to5_of_5)" if n == 5 else "")) for n in ARRAYS]


def measure(vlabel: str, repeats: int) -> dict:
    vocab = bench_engine.load_vocab(vlabel)
    engines = {"constrain": bench_engine.Constrain(), "xgrammar": bench_engine.XGrammar()}
    engines["constrain"].prepare(vocab)
    engines["xgrammar"].prepare(vocab, bench_engine.peer_tokens_of(vocab))
    buf = np.zeros((vocab.vocab_size + 31) // 32, np.int32)
    times: dict[str, dict[str, list[float]]] = {name: {} for name in engines}
    for w in workloads():  # one round untimed: first calls in a process (imports, caches of the vocabulary)
        for eng in engines.values():
            eng.fill(eng.matcher(eng.compile(w)), buf)
    for _ in range(repeats):
        for w in workloads():
            for name, eng in engines.items():
                gc.collect()
                t0 = time.perf_counter()
                m = eng.matcher(eng.compile(w))
                eng.fill(m, buf)
                times[name].setdefault(w.name, []).append(time.perf_counter() - t0)
    out = {}
    for name, per in times.items():
        item = statistics.median(per["item"]) * 1e3
        out[name] = {"item_ms": round(item, 2)}
        for n in ARRAYS:
            array = statistics.median(per[f"1to{n}"]) * 1e3
            out[name][f"1to{n}_ms"] = round(array, 2)
            out[name][f"1to{n}_over_item_ms"] = round(array - item, 2)
    return out


def per_token(vlabel: str, walks: int, soft: int) -> dict:
    """Mask + advance seconds per token of 1..5, counted against unrolled, over the same sampled walks."""
    vocab = bench_engine.load_vocab(vlabel)
    eng = bench_engine.Constrain()
    eng.prepare(vocab)
    array = workloads()[1]
    shipped = schema_module.COUNTED_UNROLLED_SIZE
    dfas = {}
    try:
        for kind, threshold in (("counted", 0), ("unrolled", 10**9)):
            schema_module.COUNTED_UNROLLED_SIZE = threshold
            fa.clear_compiled()
            dfas[kind] = eng.dfa(array)
    finally:
        schema_module.COUNTED_UNROLLED_SIZE = shipped
    samples = bench_engine.sample_outputs(TokenIndex(dfas["unrolled"], vocab), vocab, walks, soft, soft * 4, seed=5)
    n_words = (vocab.vocab_size + 31) // 32
    times: dict[str, list[float]] = {kind: [] for kind in dfas}
    for walk in samples:
        for kind, dfa in dfas.items():
            t, rejected = bench_engine.replay(eng, TokenIndex(dfa, vocab), [walk], n_words)
            if rejected:
                raise RuntimeError(f"{kind} 1..5 refused a token of a walk sampled from the unrolled one: {rejected}")
            times[kind] += t
    out = {kind: {"states": dfa.n_states} for kind, dfa in dfas.items()}
    for kind, t in times.items():
        out[kind].update({f"p{q}_us": round(bench_engine.pct(t, q / 100) * 1e6, 2) for q in (50, 90, 99)})
    out["tokens"] = len(times["counted"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="llama3,qwen3,gemma4")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--walks", type=int, default=12)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    soft = 400
    if args.quick:
        args.vocabs, args.repeats, args.walks, soft = "llama3", 2, 2, 50
    results = {}
    print("| vocab | engine | item ms | " + " | ".join(f"1..{n} ms (- item)" for n in ARRAYS) + " |")
    print("|---|---|---|" + "---|" * len(ARRAYS))
    for vlabel in args.vocabs.split(","):
        results[vlabel] = measure(vlabel, args.repeats)
        for name, r in results[vlabel].items():
            cells = " | ".join(f"{r[f'1to{n}_ms']} ({r[f'1to{n}_over_item_ms']:+})" for n in ARRAYS)
            print(f"| {vlabel} | {name} | {r['item_ms']} | {cells} |", flush=True)
    print(f"\n1..5 per token, counted against unrolled ({args.walks} walks of ~{soft} tokens, fresh indexes, "
          f"interleaved), mask + advance us:")
    print("| vocab | tokens | counted states | unrolled states | p50 | p90 | p99 |")
    print("|---|---|---|---|---|---|---|")
    for vlabel in args.vocabs.split(","):
        r = results[vlabel]["per_token"] = per_token(vlabel, args.walks, soft)
        c, u = r["counted"], r["unrolled"]
        cells = " | ".join(f"{c[f'p{q}_us']} / {u[f'p{q}_us']}" for q in (50, 90, 99))
        print(f"| {vlabel} | {r['tokens']} | {c['states']} | {u['states']} | {cells} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
