"""What budget-aware decoding adds to a fresh policy's setup: the exact token-budget table against the bound.

A server that masks under `max_tokens` must know, before the first token, whether a valid output fits. The exact
table (`TokenIndex.min_tokens_from_start`: one trie walk per state, then a breadth-first search over the token
graph) answers it; `TokenIndex.completes_within` first reads a bound off the automaton (single-byte steps, no trie
walk) and builds the table only for a budget below that bound's `free_from`, where masks can bind at once. For each
workload and vocabulary, on fresh compiles (median of `--repeats`):
  - TTFM: schema -> DFA -> index -> first mask (as in bench_engine.py);
  - table: the exact table on top (what every budgeted request paid before the bound);
  - bound: `completes_within(max_tokens)` on top, for `--max-tokens` (256, the server's default);
  - the setup ratio (TTFM + table) / (TTFM + bound);
  - free_from, the bound and the exact minimum at the start, and whether replaying sampled outputs under a budget
    that starts at max_tokens built the table (it must not while the budget left stays at or past free_from).

Usage: python benchmarks/bench_budget.py [--quick] [--vocabs llama3,qwen3,gemma4] [--workloads a,b] [--repeats 5]
                                         [--max-tokens 256] [--json PATH]
       (--quick, as CI runs it: llama3, the two quick workloads, 2 repeats)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import constrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import bench_engine  # noqa: E402
from workloads import workloads  # noqa: E402

from constrain import automaton as fa  # noqa: E402
from constrain.index import TokenIndex  # noqa: E402


def measure(engine: bench_engine.Constrain, w, max_tokens: int, repeats: int) -> dict:
    ttfm, table, bound = [], [], []
    for _ in range(repeats):
        fa.clear_compiled()
        t0 = time.perf_counter()
        idx = engine.compile(w)
        idx.start().mask()
        t1 = time.perf_counter()
        fits = idx.completes_within(max_tokens)
        t2 = time.perf_counter()
        built = idx._min_tokens is not None  # (a budget under free_from: built up front; over 10k states: never)
        exact = idx.min_tokens_from_start()  # the table: all that the bound left undone
        t3 = time.perf_counter()
        ttfm.append(t1 - t0)
        bound.append(t2 - t1)
        table.append(t3 - t1 if built else t3 - t2)
    free_from = idx._bounds()[1]
    replay = TokenIndex(idx.dfa, engine.vocab)
    samples = bench_engine.sample_outputs(replay, engine.vocab, 4, 40, 400, seed=0)
    for toks in samples:
        cursor, left = replay.start(), max_tokens
        for t in toks:
            cursor.mask(left)
            cursor.advance(t, left)
            left -= 1
    longest = max(len(t) for t in samples)
    return {"workload": w.name, "states": idx.dfa.n_states, "ttfm_s": statistics.median(ttfm),
            "table_s": statistics.median(table), "bound_s": statistics.median(bound),
            "free_from": free_from, "bound_at_start": idx._bounds()[0][idx.start().dfa_state], "min_tokens": exact,
            "fits": fits, "replayed_tokens": longest, "replay_built_table": replay._min_tokens is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="llama3")
    ap.add_argument("--workloads", default="")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.vocabs, args.repeats = "llama3", 2
    chosen = [w for w in workloads(quick=args.quick) if not args.workloads or w.name in args.workloads.split(",")]
    rows = []
    print(f"| workload | vocab | DFA states | TTFM ms | + table ms | + bound ms | setup ratio | free_from | "
          f"bound / exact at start | replay of ≤ N tokens built the table |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for vlabel in args.vocabs.split(","):
        engine = bench_engine.Constrain()
        engine.prepare(bench_engine.load_vocab(vlabel))
        for w in chosen:
            r = {"vocab": vlabel, **measure(engine, w, args.max_tokens, args.repeats)}
            rows.append(r)
            ratio = (r["ttfm_s"] + r["table_s"]) / (r["ttfm_s"] + r["bound_s"])
            print(f"| {r['workload']} | {vlabel} | {r['states']} | {r['ttfm_s'] * 1e3:.1f} | {r['table_s'] * 1e3:.1f} "
                  f"| {r['bound_s'] * 1e3:.2f} | {ratio:.1f}x | {r['free_from']} | {r['bound_at_start']} / "
                  f"{r['min_tokens']} | {'yes' if r['replay_built_table'] else 'no'} (N={r['replayed_tokens']}) |",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"max_tokens": args.max_tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
