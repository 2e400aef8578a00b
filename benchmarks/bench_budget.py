"""What budget-aware decoding costs: the exact token-budget table against the bound and searched distances.

A server that masks under `max_tokens` must know, before the first token, whether a valid output fits, and once the
budget left can bind, which tokens still leave room to finish. The exact table (`TokenIndex._budget_tables`: one
trie walk per state, then a breadth-first search over the token graph) answers both for every state at once;
`TokenIndex.completes_within` reads a bound off the automaton instead (single-byte steps, no trie walk), and masks
under a budget below the bound's `free_from` search the distances they ask from the states asked
(`index.SEARCHED_DISTANCES`, the default). For each workload and vocabulary, on fresh compiles (median of
`--repeats`):
  - TTFM: schema -> DFA -> index -> first mask (as in bench_engine.py);
  - table: the exact table on top (what every budgeted request paid before the bound);
  - bound: `completes_within(max_tokens)` on top, for `--max-tokens` (256, the server's default);
  - the setup ratio (TTFM + table) / (TTFM + bound);
  - free_from, the bound and the exact minimum at the start, and whether replaying sampled outputs under a budget
    that starts at max_tokens built the table or searched a state (it must not while the budget left stays at or
    past free_from);
  - a tight walk: random tokens from the budgeted masks from free_from + 3 tokens left to acceptance, the same walk
    (same seeds; the masks are equal) on a fresh index with the table and with searched distances: the walk's total
    mask + advance time and its slowest step (median of 3 walks), and the states the searches walked.

Usage: python benchmarks/bench_budget.py [--quick] [--vocabs llama3,qwen3,gemma4] [--workloads a,b] [--repeats 5]
                                         [--max-tokens 256] [--json PATH]
       (--quick, as CI runs it: llama3, the two quick workloads, 2 repeats)
"""

from __future__ import annotations

import argparse
import json
import random
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
from constrain import index as cindex  # noqa: E402
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
        exact = int(idx._budget_tables()[0][idx.start().dfa_state])  # the whole table, as before the bound
        t3 = time.perf_counter()
        ttfm.append(t1 - t0)
        bound.append(t2 - t1)
        table.append(t3 - t2)
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
    tight = {mode: tight_walks(engine, idx.dfa, free_from + 3, mode == "searched") for mode in ("table", "searched")}
    return {"workload": w.name, "states": idx.dfa.n_states, "ttfm_s": statistics.median(ttfm),
            "table_s": statistics.median(table), "bound_s": statistics.median(bound),
            "free_from": free_from, "bound_at_start": idx._bounds()[0][idx.start().dfa_state], "min_tokens": exact,
            "fits": fits, "replayed_tokens": longest,
            "replay_built_table": replay._min_tokens is not None or bool(replay._dests_of), "tight": tight}


def tight_walks(engine: bench_engine.Constrain, dfa, budget: int, searched: bool, walks: int = 3) -> dict:
    """Random budgeted walks from `budget` tokens left to acceptance on fresh indexes, with searched distances or the
    table: (median) total and slowest step of mask + advance, and the states the searches walked."""
    saved = cindex.SEARCHED_DISTANCES
    cindex.SEARCHED_DISTANCES = searched
    totals, slowest, walked, lengths = [], [], [], []
    try:
        for seed in range(walks):
            idx = TokenIndex(dfa, engine.vocab)
            idx.start().mask()
            rng, cursor, left, steps = random.Random(seed), idx.start(), budget, []
            while True:
                t0 = time.perf_counter()
                allowed = cursor.allowed_token_ids(left).tolist()
                steps.append(time.perf_counter() - t0)
                content = [t for t in allowed if t not in engine.vocab.eos_ids]
                if not content or (cursor.is_accepting() and rng.random() < 0.3):
                    break
                t0 = time.perf_counter()
                cursor.advance(rng.choice(content), budget=left)
                steps[-1] += time.perf_counter() - t0
                left -= 1
            assert cursor.is_accepting(), "a budgeted walk ended before acceptance"
            totals.append(sum(steps))
            slowest.append(max(steps))
            walked.append(len(idx._dests_of))
            lengths.append(len(steps) - 1)
    finally:
        cindex.SEARCHED_DISTANCES = saved
    return {"total_s": statistics.median(totals), "slowest_s": statistics.median(slowest),
            "walked_states": statistics.median(walked), "tokens": lengths}


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
          f"bound / exact at start | replay of ≤ N tokens from max_tokens built the table or searched | tight walk "
          f"ms, table / searched | its slowest step ms, table / searched | states searched |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for vlabel in args.vocabs.split(","):
        engine = bench_engine.Constrain()
        engine.prepare(bench_engine.load_vocab(vlabel))
        for w in chosen:
            r = {"vocab": vlabel, **measure(engine, w, args.max_tokens, args.repeats)}
            rows.append(r)
            ratio = (r["ttfm_s"] + r["table_s"]) / (r["ttfm_s"] + r["bound_s"])
            print(f"| {r['workload']} | {vlabel} | {r['states']} | {r['ttfm_s'] * 1e3:.1f} | {r['table_s'] * 1e3:.1f} "
                  f"| {r['bound_s'] * 1e3:.2f} | {ratio:.1f}x | {r['free_from']} | {r['bound_at_start']} / "
                  f"{r['min_tokens']} | {'yes' if r['replay_built_table'] else 'no'} (N={r['replayed_tokens']}) | "
                  f"{r['tight']['table']['total_s'] * 1e3:.1f} / {r['tight']['searched']['total_s'] * 1e3:.1f} | "
                  f"{r['tight']['table']['slowest_s'] * 1e3:.1f} / {r['tight']['searched']['slowest_s'] * 1e3:.1f} | "
                  f"{r['tight']['searched']['walked_states']:.0f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"max_tokens": args.max_tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
