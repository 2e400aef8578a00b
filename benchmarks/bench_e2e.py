"""End-to-end decode speed on a tiny CPU model: tokens/s with and without `MaskProcessor` (and xgrammar's processor).

Same model (tiny seeded Llama on the Llama 3 tokenizer, logits 128256 wide), same prompts, greedy decoding, the same
JSON Schema for both grammar engines. Constrained runs may stop early at EOS, so the figure is time per generated step
(median of repeats) and the overhead ratio is per step. Every constrained output is checked against a fresh cursor.
Contenders take turns within each repeat (a load change on a shared machine hits all of them alike), a fresh
processor per `generate` call as a server makes one per request; the load average is printed and kept in the JSON,
and paired ratios are also given from the process's CPU time (time spent descheduled by other load not counted).

Usage: python benchmarks/bench_e2e.py [--quick] [--threads N] [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from constrain.compiler import compile_json_schema  # noqa: E402
from constrain.processor import MaskProcessor  # noqa: E402
from constrain.vocabulary import Vocabulary  # noqa: E402
from models import hf_tokenizer, tiny_model  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "score": {"type": "number"},
    },
    "required": ["name", "tags", "score"],
    "additionalProperties": False,
}


def xgrammar_processor(tok, vocab_size: int):
    try:
        import xgrammar as xgr
        from xgrammar.contrib.hf import LogitsProcessor
    except ImportError:
        return None
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
    compiled = xgr.GrammarCompiler(info, max_threads=2).compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    return lambda plen, budget: LogitsProcessor(compiled)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI mode: batch 1, 32 tokens, 2 repeats")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per contender (default 5; quick: 2)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = hf_tokenizer("llama3")
    vocab = Vocabulary.from_tokenizer(tok)
    pad = vocab.eos_ids[0]
    tok.pad_token_id, tok.padding_side = pad, "left"
    model = tiny_model("llama", 128256 + 64, eos_ids=list(vocab.eos_ids), pad_id=pad, seed=0)
    index = compile_json_schema(SCHEMA, vocab, whitespace="compact")
    max_new = 32 if args.quick else 128
    repeats = args.repeats or (2 if args.quick else 5)
    batches = (1,) if args.quick else (1, 4)
    contenders = {
        "unconstrained": None,
        "constrain": lambda plen, budget: MaskProcessor(index, plen, budget=budget),
    }
    xgr = xgrammar_processor(tok, model.config.vocab_size)
    if xgr is not None:
        contenders["xgrammar"] = xgr
    results = []
    for batch in batches:
        enc = tok(["Write a JSON record:", "Another one please", "x", "Give me data"][:batch], return_tensors="pt",
                  padding=True)
        plen = enc.input_ids.shape[1]
        entry = {"batch": batch, "max_new_tokens": max_new, "ms_per_step": {}, "steps": {}}
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        cpu_samples: dict[str, list[float]] = {name: [] for name in contenders}
        for rep in range(repeats + 1):  # the first run warms up (compiles the kernel, fills index rows)
            for name, make in contenders.items():
                procs = [] if make is None else [make(plen, max_new)]
                c0, t0 = time.process_time(), time.perf_counter()
                out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, logits_processor=procs)
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                steps = out.shape[1] - plen
                entry["steps"][name] = steps
                if rep:
                    samples[name].append(dt / steps)
                    cpu_samples[name].append(cpu / steps)
                if make is not None:
                    for r in range(batch):
                        cursor = index.start()
                        for t in out[r, plen:].tolist():
                            cursor.advance(t)
                            if cursor.is_finished():
                                break
                        if name == "constrain" and not cursor.is_accepting():
                            raise SystemExit(f"constrain output of row {r} is incomplete under the budget")
        # One more constrained run, untimed as a whole: the processor's own calls inside `generate` (caches as cold
        # as the model step leaves them), median per step.
        calls: list[float] = []
        inner = contenders["constrain"](plen, max_new)

        def timed_processor(input_ids, scores):
            t0 = time.perf_counter()
            out = inner(input_ids, scores)
            calls.append(time.perf_counter() - t0)
            return out

        model.generate(**enc, max_new_tokens=max_new, do_sample=False, logits_processor=[timed_processor])
        entry["processor_us_per_step"] = statistics.median(calls) * 1e6
        entry["paired_ratio"], entry["cpu_paired_ratio"] = {}, {}
        for name in contenders:
            entry["ms_per_step"][name] = statistics.median(samples[name]) * 1e3
            # The median of per-repeat ratios: each pairs runs made seconds apart, under about the same load.
            entry["paired_ratio"][name] = statistics.median(
                a / b for a, b in zip(samples[name], samples["unconstrained"], strict=True))
            # The same from the process's CPU time: on a shared machine, time spent descheduled is not counted.
            entry["cpu_paired_ratio"][name] = statistics.median(
                a / b for a, b in zip(cpu_samples[name], cpu_samples["unconstrained"], strict=True))
        results.append(entry)
    load = os.getloadavg()
    print(f"end to end, tiny Llama (128320 logits), greedy, {torch.get_num_threads()} threads, median of {repeats}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    names = list(contenders)
    print("| batch | unconstrained ms/step | " + " | ".join(
        f"{n} ms/step (x of medians; median of paired x; same from CPU time)" for n in names[1:]) + " |")
    print("|---|---|" + "---|" * (len(names) - 1))
    for e in results:
        base = e["ms_per_step"]["unconstrained"]
        cells = [f"{e['ms_per_step'][n]:.3f} ({e['ms_per_step'][n] / base:.2f}x; paired {e['paired_ratio'][n]:.2f}x; "
                 f"cpu {e['cpu_paired_ratio'][n]:.2f}x; {e['steps'][n]} steps)" for n in names[1:]]
        print(f"| {e['batch']} | {base:.3f} ({e['steps']['unconstrained']} steps) | " + " | ".join(cells) + " |")
    print("MaskProcessor's own time per step inside generate (median): " + ", ".join(
        f"batch {e['batch']} {e['processor_us_per_step']:.0f} us" for e in results))

    def ver(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    env = {"python": platform.python_version(), "platform": platform.platform(), "threads": torch.get_num_threads(),
           "cpus": os.cpu_count(), "load_average": load,
           "versions": {p: ver(p) for p in ("torch", "transformers", "xgrammar")}}
    out = args.json or ROOT / "benchmarks" / "results" / f"bench_e2e{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
