"""Token index benchmark: trie build, mask computation per state kind, cached mask fetch, cursor advance, budgets.

Usage: python benchmarks/bench_index.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np

try:
    import constrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from constrain import automaton as fa  # noqa: E402
from constrain.index import NO_COMPLETION, TokenIndex, TokenState  # noqa: E402
from constrain.trie import _build_trie  # noqa: E402  (the per-vocabulary trie, timed on its own)
from constrain.vocabulary import Vocabulary  # noqa: E402

# --------------------------------------------------------------------------------------------------------------------
# Inputs


def synthetic_vocab(n_tokens: int, seed: int = 0) -> Vocabulary:
    """BPE-like: 256 single bytes, words with and without a leading space, punctuation runs, numbers, CJK pieces."""
    rng = random.Random(seed)
    letters = b"etaoinshrdlucmfwypvbgkjqxzETAOINS"
    punct = [b'"', b"{", b"}", b":", b",", b"[", b"]", b".", b"\n", b"  ", b"(", b")", b"\\", b"_"]
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    while len(tokens) < n_tokens - 2:
        r = rng.random()
        if r < 0.6:
            word = bytes(rng.choice(letters) for _ in range(min(15, int(rng.expovariate(1 / 5)) + 1)))
            data = (b" " if rng.random() < 0.6 else b"") + word
        elif r < 0.75:
            data = b"".join(rng.choice(punct) for _ in range(rng.randint(1, 4)))
        elif r < 0.85:
            data = str(rng.randint(0, 99999)).encode()
        else:
            text = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 3))).encode()
            data = text[: rng.randint(1, len(text))]
        if data not in seen:
            seen.add(data)
            tokens.append(data)
    tokens += [b"<|eos|>", b"<|tool|>"]
    n = len(tokens)
    return Vocabulary.from_token_bytes(
        tokens, special_ids=(n - 2, n - 1), eos_ids=(n - 2,), vocab_size=(n + 127) // 128 * 128
    )


def real_vocabs() -> dict[str, Vocabulary]:
    """Real tokenizers from the local asset cache (`python -m constrain.assets fetch`), where available."""
    try:
        from constrain import assets
    except ImportError as err:
        print(f"# real vocabularies skipped: {err}", file=sys.stderr)
        return {}
    out = {}
    for label, name in (("llama3", "llama-bpe"), ("qwen2", "qwen2"), ("gemma4", "gemma-4")):
        try:
            out[label] = Vocabulary.from_gguf(assets.gguf_path(name))
        except (FileNotFoundError, AttributeError, ImportError) as err:
            print(f"# {label} skipped: {err}", file=sys.stderr)
    return out


def json_object_dfa() -> fa.Dfa:
    string = fa.concat(
        fa.literal(b'"'),
        fa.repeat(fa.union(fa.chars([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]), fa.literal(b'\\"')), 0),
        fa.literal(b'"'),
    )
    number = fa.concat(fa.optional(fa.literal(b"-")), fa.repeat(fa.byte_set([(0x30, 0x39)]), 1))
    value = fa.union(string, number)
    member = fa.concat(string, fa.literal(b": "), value)
    return fa.compile(
        fa.concat(
            fa.literal(b"{"),
            fa.optional(fa.concat(member, fa.repeat(fa.concat(fa.literal(b", "), member), 0))),
            fa.literal(b"}"),
        )
    )


STATE_PREFIXES = {"structural": b"{", "string": b'{"', "digits": b'{"a": 1'}


# --------------------------------------------------------------------------------------------------------------------
# Contenders for one state's mask


def python_loop_mask(dfa, vocab, state: int) -> np.ndarray:
    """Reference: one Python loop per token (the oracle the tests use)."""
    allowed = np.zeros(-(-vocab.vocab_size // 32) * 32, dtype=bool)
    excluded = vocab.special_ids | set(vocab.eos_ids)
    for t, data in enumerate(vocab.token_bytes):
        if data and t not in excluded and dfa.step(state, data) >= 0:
            allowed[t] = True
    if dfa.accepting[state]:
        allowed[list(vocab.eos_ids)] = True
    return np.packbits(allowed, bitorder="little").view("<i4")


def cold_mask_times(dfa, vocab, state: int, repeats: int) -> tuple[list[float], np.ndarray]:
    indexes = [TokenIndex(dfa, vocab) for _ in range(repeats)]
    times = []
    mask = None
    for index in indexes:
        t0 = time.perf_counter()
        mask = index.mask_for_state(state)
        times.append(time.perf_counter() - t0)
    return times, mask


def percentile_ns(samples: list[int], q: float) -> float:
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def bench_vocab(label: str, vocab: Vocabulary, dfa, quick: bool) -> dict:
    repeats = 3 if quick else 9
    row: dict = {"vocab": label, "n_tokens": vocab.n_tokens, "vocab_size": vocab.vocab_size}

    t0 = time.perf_counter()
    trie = _build_trie(vocab)
    row["trie_build_ms"] = (time.perf_counter() - t0) * 1e3
    tracemalloc.start()
    trie = _build_trie(vocab)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row["trie_nodes"] = trie.n_nodes
    row["trie_mb"] = trie.nbytes / 2**20
    row["trie_build_peak_mb"] = peak / 2**20
    del trie

    TokenIndex(dfa, vocab)  # fills the per-vocabulary trie cache
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        TokenIndex(dfa, vocab)
        times.append(time.perf_counter() - t0)
    row["index_setup_ms"] = statistics.median(times) * 1e3

    for kind, prefix in STATE_PREFIXES.items():
        state = dfa.step(dfa.start, prefix)
        times, mask = cold_mask_times(dfa, vocab, state, repeats)
        if not quick or vocab.n_tokens <= 40_000:
            t0 = time.perf_counter()
            reference = python_loop_mask(dfa, vocab, state)
            row[f"{kind}_python_ms"] = (time.perf_counter() - t0) * 1e3
            if not np.array_equal(reference, mask):
                raise SystemExit(f"{label}/{kind}: trie-walk mask differs from the Python reference")
        row[f"{kind}_ms"] = statistics.median(times) * 1e3
        row[f"{kind}_allowed"] = int(np.unpackbits(mask.view(np.uint8)).sum())

    t0 = time.perf_counter()
    eager = TokenIndex(dfa, vocab, eager=True)
    row["eager_ms"] = (time.perf_counter() - t0) * 1e3
    row["eager_per_state_ms"] = row["eager_ms"] / dfa.n_states
    table, _ = eager.mask_table()
    row["distinct_rows"] = int(table.shape[0])
    row["index_mb"] = eager.nbytes() / 2**20
    lazy = TokenIndex(dfa, vocab)
    for s in range(dfa.n_states):
        if not np.array_equal(lazy.mask_for_state(s), eager.mask_for_state(s)):
            raise SystemExit(f"{label}: eager and lazy masks differ at state {s}")

    # Cached fetch: the per-step cost once a state's row exists.
    cursor = TokenState(eager, dfa.step(dfa.start, STATE_PREFIXES["string"]))
    samples = []
    for _ in range(2_000 if quick else 20_000):
        t0 = time.perf_counter_ns()
        cursor.mask()
        samples.append(time.perf_counter_ns() - t0)
    row["fetch_p50_us"] = percentile_ns(samples, 50) / 1e3
    row["fetch_p99_us"] = percentile_ns(samples, 99) / 1e3

    # Advance: allowed tokens inside a string, each from a fresh fork.
    allowed = cursor.allowed_token_ids()
    rng = np.random.default_rng(0)
    picks = rng.choice(allowed[allowed < vocab.n_tokens], size=2_000 if quick else 20_000)
    forks = [cursor.fork() for _ in range(len(picks))]
    samples = []
    for fork, t in zip(forks, picks.tolist()):
        t0 = time.perf_counter_ns()
        fork.advance(t)
        samples.append(time.perf_counter_ns() - t0)
    row["advance_p50_us"] = percentile_ns(samples, 50) / 1e3
    row["advance_p99_us"] = percentile_ns(samples, 99) / 1e3
    row["advance_mean_token_bytes"] = float(np.mean([len(vocab.token_bytes[t]) for t in picks.tolist()]))
    return row


# --------------------------------------------------------------------------------------------------------------------
# Token budgets: the min_tokens table per index, budgeted masks below the horizon, the hot path above it

BFCL = str(Path(os.environ.get("CONSTRAIN_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data") / "bfcl" / "openai" / "simple_python.jsonl")
BFCL_LINES = (0, 5, 100, 250)


def bfcl_dfas(quick: bool) -> dict[str, fa.Dfa]:
    from constrain.schema import compile_schema

    try:
        with open(BFCL) as f:
            rows = [json.loads(line) for line in f]
    except FileNotFoundError as err:
        print(f"# BFCL schemas skipped: {err}", file=sys.stderr)
        return {}
    lines = BFCL_LINES[:1] if quick else BFCL_LINES
    return {rows[i]["id"]: compile_schema(rows[i]["tools"][0]["function"]["parameters"]).dfa for i in lines}


def bench_budget(label: str, vocab: Vocabulary, name: str, dfa, quick: bool) -> dict:
    repeats = 1 if quick else 3
    row: dict = {"vocab": label, "schema": name, "dfa_states": dfa.n_states}
    TokenIndex(dfa, vocab)  # fills the per-vocabulary trie cache
    times = []
    for _ in range(repeats):
        index = TokenIndex(dfa, vocab)
        t0 = time.perf_counter()
        low = index.min_tokens_from_start()
        times.append(time.perf_counter() - t0)
    row["table_ms"] = statistics.median(times) * 1e3
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        eager = TokenIndex(dfa, vocab, eager=True)
        times.append(time.perf_counter() - t0)
    row["eager_ms"] = statistics.median(times) * 1e3
    byte_distance = int(fa.shortest_distances(dfa)[dfa.start])
    if not 0 < low <= byte_distance or eager.min_tokens_from_start() != low:
        raise SystemExit(f"{label}/{name}: min_tokens {low} vs byte distance {byte_distance} / eager")
    row["min_tokens"], row["byte_distance"] = low, byte_distance

    # A budgeted mask below the horizon (the first state on a shortest output that has one): the first fetch walks
    # the trie once, later ones are a dict lookup.
    cursor = index.start()
    while index.budget_horizon(cursor.dfa_state) <= index.min_tokens(cursor.dfa_state):
        if cursor.is_accepting():
            raise SystemExit(f"{label}/{name}: no state with a budget below its horizon on a shortest output")
        need = index.min_tokens(cursor.dfa_state)
        cursor.advance(int(np.flatnonzero(index.token_min_budget(cursor.dfa_state) == need)[0]))
    state = cursor.dfa_state
    budget = index.min_tokens(state)
    if index.budget_horizon(state) == NO_COMPLETION:
        raise SystemExit(f"{label}/{name}: a token without completion (is every byte a token?)")
    t0 = time.perf_counter()
    mask = cursor.mask(budget)
    row["budget_cold_ms"] = (time.perf_counter() - t0) * 1e3
    reference = np.packbits(
        np.pad(index.token_min_budget(state) <= budget, (0, index.n_words * 32 - vocab.vocab_size)), bitorder="little"
    ).view("<i4")
    if not np.array_equal(mask, reference):
        raise SystemExit(f"{label}/{name}: budgeted mask differs from token_min_budget <= budget")
    samples_hot, samples_plain, samples_below = [], [], []
    for _ in range(2_000 if quick else 20_000):
        t0 = time.perf_counter_ns()
        cursor.mask()
        t1 = time.perf_counter_ns()
        cursor.mask(1_000)  # above the horizon: the unbudgeted row
        t2 = time.perf_counter_ns()
        cursor.mask(budget)  # below the horizon, cached
        t3 = time.perf_counter_ns()
        samples_plain.append(t1 - t0)
        samples_hot.append(t2 - t1)
        samples_below.append(t3 - t2)
    row["fetch_p50_us"] = percentile_ns(samples_plain, 50) / 1e3
    row["fetch_budget_above_p50_us"] = percentile_ns(samples_hot, 50) / 1e3
    row["fetch_budget_below_p50_us"] = percentile_ns(samples_below, 50) / 1e3
    return row


def print_budget_table(rows: list[dict]) -> None:
    print()
    print("Token budgets. table = min_tokens for every state of a lazy index (first budget/min_tokens call);")
    print("eager = TokenIndex(eager=True), which builds masks and table in one walk per state; fetch p50 in us:")
    print("mask() / mask(budget >= horizon) / mask(budget < horizon, cached). cold = first budget < horizon fetch.")
    header = (
        f"{'vocab':<16}{'schema':<20}{'states':>7}{'min tok':>8}{'bytes':>6}{'table ms':>10}{'eager ms':>10}"
        f"{'cold ms':>9}{'fetch plain/above/below us':>28}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        fetch = f"{r['fetch_p50_us']:.2f}/{r['fetch_budget_above_p50_us']:.2f}/{r['fetch_budget_below_p50_us']:.2f}"
        print(
            f"{r['vocab']:<16}{r['schema']:<20}{r['dfa_states']:>7}{r['min_tokens']:>8}{r['byte_distance']:>6}"
            f"{r['table_ms']:>10.0f}{r['eager_ms']:>10.0f}{r['budget_cold_ms']:>9.2f}{fetch:>28}"
        )


# --------------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one small synthetic vocabulary, few repeats (CI)")
    parser.add_argument("--json", default=os.path.join(tempfile.gettempdir(), "bench_index.json"))
    parser.add_argument("--no-real", action="store_true", help="skip real tokenizers from the asset cache")
    args = parser.parse_args(argv)

    dfa = json_object_dfa()
    sizes = [32_000] if args.quick else [32_000, 128_000, 256_000]
    vocabs = {f"synthetic-{n // 1000}k": synthetic_vocab(n) for n in sizes}
    if not args.quick and not args.no_real:
        vocabs.update(real_vocabs())

    rows = [bench_vocab(label, vocab, dfa, args.quick) for label, vocab in vocabs.items()]
    schemas = {"json_object": dfa, **bfcl_dfas(args.quick)}
    budget_rows = [
        bench_budget(label, vocab, name, schema, args.quick)
        for label, vocab in vocabs.items()
        for name, schema in schemas.items()
    ]

    print(f"DFA: JSON object, {dfa.n_states} states, {dfa.n_classes} classes. Mask times: one cold state, median.")
    print("python = the per-token Python loop (reference; x = how many times slower than the trie walk)")
    header = (
        f"{'vocab':<16}{'tokens':>8}{'trie ms':>9}{'trie MB':>9}{'nodes':>9}"
        f"{'struct ms':>11}{'string ms':>11}{'digits ms':>11}{'eager/st':>10}{'python':>16}"
        f"{'fetch p50/p99 us':>18}{'adv p50 us':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        python = r.get("string_python_ms")
        python_col = f"{python:8.0f} ({python / r['string_ms']:4.0f}x)" if python else "-"
        print(
            f"{r['vocab']:<16}{r['n_tokens']:>8}{r['trie_build_ms']:>9.0f}{r['trie_mb']:>9.1f}{r['trie_nodes']:>9}"
            f"{r['structural_ms']:>11.3f}{r['string_ms']:>11.3f}{r['digits_ms']:>11.3f}"
            f"{r['eager_per_state_ms']:>10.3f}{python_col:>16}"
            f"{r['fetch_p50_us']:>9.2f}/{r['fetch_p99_us']:<8.2f}{r['advance_p50_us']:>12.2f}"
        )

    print_budget_table(budget_rows)

    env = {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "gpu": None,
        "dfa_states": dfa.n_states,
        "quick": args.quick,
    }
    with open(args.json, "w") as f:
        json.dump({"environment": env, "rows": rows, "budget_rows": budget_rows}, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
