"""Schema-compiler coverage on the shared corpora: compile status per schema, oracle agreement per instance.

Prints one table per corpus (schemas, compiled %, false accepts/rejects, compile time) and the top failure
reasons; `--update` rewrites tests/baselines/*.json, which tests/test_corpus.py ratchets against.

    python benchmarks/coverage.py [--quick] [--update] [--corpus NAME ...] [--json OUT] [--token-level]
    python benchmarks/coverage.py --update --corpus jsonschemabench --resume tests/baselines/jsonschemabench.json
        (completes a partial baseline: only the schemas it lacks are compiled)
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import random
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import corpus  # noqa: E402  (tests/corpus.py: loaders, writer, runner)


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:5.1f}%" if d else "    -"


def print_table(title: str, cases: list, results: dict) -> None:
    table = corpus.summarize(cases, results)
    head = f"{'group':<34} {'schemas':>7} {'compiled':>8} {'unsup':>5} {'inval':>5} {'budget':>6} {'crash':>5} {'inst':>6} {'agree':>6} {'FA':>4} {'FA*':>4} {'FR':>4} {'FR*':>4} {'n/c':>4} {'orac':>4} {'lbl≠':>4} {'ms p50':>7} {'ms max':>7}"
    print(f"\n== {title} ==\n(FA*/FR*: of those, the upstream label sides with the compiler against the oracle)\n{head}\n{'-' * len(head)}")
    total = collections.Counter()
    all_ms: list[float] = []
    for group in sorted(table):
        row = table[group]
        ms = row.pop("ms")
        all_ms += ms
        total.update(row)
        _print_row(group, row, ms)
    _print_row("TOTAL", total, all_ms)


def _print_row(name: str, row: dict, ms: list[float]) -> None:
    p50 = f"{statistics.median(ms):7.1f}" if ms else "      -"
    mx = f"{max(ms):7.0f}" if ms else "      -"
    print(
        f"{name[:34]:<34} {row['schemas']:>7} {_pct(row['compiled'], row['schemas']):>8} {row['UnsupportedSchema']:>5} "
        f"{row['InvalidSchema']:>5} {row['BudgetExceeded']:>6} {row['crash'] + row['hang']:>5} {row['instances']:>6} "
        f"{row['agree']:>6} {row['false_accept']:>4} {row['label_sides_false_accept']:>4} {row['false_reject']:>4} {row['label_sides_false_reject']:>4} {row['not_canonicalisable']:>4} "
        f"{row['oracle_error']:>4} {row['label_disagreements']:>4} {p50} {mx}"
    )


def print_reasons(results: dict, n: int = 15) -> None:
    reasons = collections.Counter(f"{r['status']}: {r.get('reason', '')}" for r in results.values() if r["status"] != "compiled")
    print("\ntop reasons a schema did not compile:")
    for reason, count in reasons.most_common(n):
        print(f"  {count:5}  {reason}")
    bad = [(cid, iid, v) for cid, r in results.items() for iid, v in r["instances"].items() if v in ("false_accept", "false_reject")]
    if bad:
        print("false accepts / rejects (first 20):")
        for cid, iid, v in bad[:20]:
            print(f"  {v:12} {cid} #{iid}")


def token_level(cases: list, results: dict, n_cases: int = 40, walks: int = 5) -> None:
    """Llama 3 vocabulary: real tokenizations of valid canonical instances must pass the masks; random token walks
    must decode to valid instances. On a seeded sample of the compiled schemas that have instances."""
    from constrain import assets
    from constrain.compiler import compile_json_schema
    from constrain.vocabulary import Vocabulary
    from transformers import AutoTokenizer

    path = assets.gguf_path("llama-bpe")
    vocab = Vocabulary.from_gguf(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    rng = random.Random(0)
    pool = [c for c in cases if results[c.id]["status"] == "compiled" and c.instances]
    counts = collections.Counter()
    for case in rng.sample(pool, min(n_cases, len(pool))):
        index = compile_json_schema(case.compiled_schema, vocab, cache=None)
        oracle = corpus.validator(case.schema, case.draft)
        writer = corpus.CanonicalWriter(case.schema, oracle=oracle)
        for inst in case.instances:
            if results[case.id]["instances"].get(inst.id) != "agree" or not oracle.is_valid(inst.data):
                continue
            ids = tokenizer.encode(writer.text(inst.data).decode(), add_special_tokens=False)
            counts["tokenized accepted" if corpus.token_accepts(index, ids) else "tokenized REJECTED"] += 1
        for _ in range(walks):
            ids, finished = corpus.token_walk(index, rng)
            try:
                ok = finished and oracle.is_valid(json.loads(vocab.decode(ids)))
            except ValueError:
                ok = False
            counts["walk valid" if ok else "walk INVALID"] += 1
    print(f"\ntoken level (Llama 3, {min(n_cases, len(pool))} schemas): " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def _progress(name: str, checkpoint: Path | None, done: dict):
    def report(results: dict, total: int) -> None:
        if len(results) % 50 == 0 or len(results) == total:
            print(f"  {name}: {len(results)}/{total} (+{len(done)} resumed)", file=sys.stderr, flush=True)
            if checkpoint is not None:
                checkpoint.write_text(json.dumps({"corpus": name, "results": {**done, **results}}, default=str))

    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a seeded sample of 3 schemas per group")
    ap.add_argument("--update", action="store_true", help="rewrite tests/baselines/<corpus>.json (not with --quick)")
    ap.add_argument("--corpus", nargs="*", choices=list(corpus.CORPORA), default=list(corpus.CORPORA))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write the per-schema results and environment here")
    ap.add_argument("--token-level", action="store_true")
    ap.add_argument("--checkpoint", type=Path, help="rewrite the results so far here every 50 schemas (JSON)")
    ap.add_argument("--resume", type=Path, help="a --checkpoint file, or a partial baseline (tests/baselines/<corpus>.json): only the schemas it lacks are run")
    ap.add_argument("--shuffle", action="store_true", help="run the schemas in a seeded random order (so a checkpoint is a fair sample)")
    ap.add_argument("--shallower", action="store_true",
                    help="compile with shallower=True (recursion and free-form nesting below max_depth where that is over the "
                         "state budget); reported beside the baseline, never written to it")
    ap.add_argument("--max-states", type=int, help=f"compile with this state budget (default {corpus.OPTIONS['max_states']:,}); "
                    "reported beside the baseline, never written to it")
    ap.add_argument("--timeout-s", type=float, help=f"compile with this time budget (default {corpus.OPTIONS['timeout_s']} s); "
                    "reported beside the baseline, never written to it")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the worker pool's cleanup runs
    budgets = {k: v for k, v in (("max_states", args.max_states), ("timeout_s", args.timeout_s)) if v is not None}
    if args.update and (args.quick or args.shallower or budgets):
        ap.error("--update needs the full corpus under the default options (drop --quick, --shallower and the budgets)")
    options = {**corpus.OPTIONS, **({"shallower": True} if args.shallower else {}), **budgets}

    report = {"environment": {"python": platform.python_version(), "machine": platform.machine(), "options": options}, "corpora": {}}
    status = 0
    for name in args.corpus:
        cases = corpus.CORPORA[name]()
        if args.quick:
            cases = corpus.sample(cases, 3)
        if args.shuffle:
            random.Random(0).shuffle(cases)
        done: dict = {}
        if args.resume is not None:
            saved = json.loads(args.resume.read_text())
            if "schemas" in saved:  # a baseline file: its statuses and verdicts stand for results
                done = {cid: {"instances": {}, **r} for cid, r in saved["schemas"].items()} if args.resume.stem == name else {}
            else:
                done = saved["results"] if saved["corpus"] == name else {}
        start = time.monotonic()
        todo = [c for c in cases if c.id not in done]
        results = {**done, **corpus.run_cases(todo, workers=args.workers, options=options,
                                               hard_timeout_s=max(corpus.HARD_TIMEOUT_S, 4 * options["timeout_s"]),
                                               progress=_progress(name, args.checkpoint, done))}
        print_table(f"{name}: {len(cases)} schemas in {time.monotonic() - start:.0f} s", cases, results)
        print_reasons(results)
        crashes = [cid for cid, r in results.items() if r["status"] in ("crash", "hang")]
        for cid in crashes:
            print(f"CRASH {cid}: {results[cid].get('reason', '(from the resumed baseline)')}")
        status |= bool(crashes)
        if args.update:
            print(f"wrote {corpus.write_baseline(name, results)}")
        elif (corpus.BASELINES / f"{name}.json").exists():
            regressions, improvements, unstable = corpus.compare(corpus.load_baseline(name), results)
            if args.quick:  # a sample: only the cases it ran count
                regressions = [r for r in regressions if "not in the corpus" not in r]
            print(f"vs baseline: {len(regressions)} regressions, {len(improvements)} improvements, {len(unstable)} time-budget changes")
            for line in regressions[:30]:
                print(f"  REGRESSION {line}")
            for line in improvements[:30]:
                print(f"  improved   {line}")
        if args.token_level:
            token_level(cases, results)
        report["corpora"][name] = results
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
