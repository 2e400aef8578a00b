"""Mask kernel benchmark: `constrain_kernels.apply_token_mask` vs xgrammar's and llguidance's bitmask apply, same inputs.

Every contender masks the same float32 logits [rows, V] with the same packed int32 masks (ours reads them through a
mask table + row ids, the peers get the gathered [rows, n_words] bitmask); results are checked bit-equal to the
torch reference first, then each is timed in this process (median of repeats, logits masked in place).
Sweeps V (128256 Llama 3, 151936 Qwen3, 262144 Gemma), rows (1, 8) and mask density (one token, half, all but one).

`constrain` is the dispatching entry point (CPU: `constrain_kernels.cpu_mask`, no cache: the native pass per row; CUDA:
Triton); `constrain_planned` (CPU only) applies row plans cached across calls and looked up per table row, as
`MaskProcessor` does per mask slot on CPU (the vLLM plugin asks its `PlanCache` per row); `constrain_eager` is the
plain torch reference. Rows of one call are distinct table rows. The load average is printed and kept in the JSON:
on a shared machine, torch's thread pool on busy cores is noisy (try `--threads 1`).

Usage: python benchmarks/bench_kernel.py [--quick] [--device cpu|cuda] [--threads N] [--native-isa 0|1|2]
       [--json PATH]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from constrain_kernels import apply_token_mask  # noqa: E402
from constrain_kernels import cpu_mask, cpu_native, torch_ref  # noqa: E402

VOCABS = {"llama3": 128256, "qwen3": 151936, "gemma4": 262144}
DENSITIES = ("one", "half", "all_but_one")


def make_table(vocab: int, density: str, device: torch.device, n_rows: int = 16) -> torch.Tensor:
    """A mask table of `n_rows` rows of `density` (bits past `vocab` cleared, as an index guarantees)."""
    g = torch.Generator().manual_seed(vocab)
    n_words = (vocab + 31) // 32
    allowed = torch.zeros(n_rows, n_words * 32, dtype=torch.bool)
    for r in range(n_rows):
        if density == "one":
            allowed[r, torch.randint(0, vocab, (1,), generator=g)] = True
        elif density == "half":
            allowed[r, :vocab] = torch.rand(vocab, generator=g) < 0.5
        else:
            allowed[r, :vocab] = True
            allowed[r, torch.randint(0, vocab, (1,), generator=g)] = False
    weights = (1 << torch.arange(32, dtype=torch.int64))
    words = (allowed.view(n_rows, n_words, 32).to(torch.int64) * weights).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.to(device)


def contenders(device: torch.device) -> dict:
    """name -> callable(logits, table, row_ids, bitmask); the peers only where installed."""
    out = {"constrain": lambda lg, tb, ids, bm: apply_token_mask(lg, tb, ids)}
    if device.type == "cpu":
        # As MaskProcessor does per mask slot: a row's plan comes from the shared PlanCache once, then from a list.
        cache, current = cpu_mask.PlanCache(), []  # [table of the current case, its plans by table row]

        def planned(lg, tb, ids, bm):
            if not current or current[0] is not tb:
                cache.clear()
                current[:] = [tb, [None] * tb.shape[0]]
            by_row, vocab, plans = current[1], lg.shape[1], []
            for i in ids.tolist():
                plan = None
                if i >= 0:
                    plan = by_row[i]
                    if plan is None or plan.vocab != vocab:
                        plan = by_row[i] = cache.get(i, tb[i].numpy(), vocab)
                plans.append(plan)
            cpu_mask.apply_planned(lg, plans)

        out["constrain_planned"] = planned
    out["constrain_eager"] = lambda lg, tb, ids, bm: torch_ref.apply_token_mask(lg, tb, ids)
    try:
        import xgrammar

        out["xgrammar"] = lambda lg, tb, ids, bm: xgrammar.apply_token_bitmask_inplace(lg, bm)
    except ImportError:
        pass
    try:
        import llguidance.torch as llg_torch

        out["llguidance"] = lambda lg, tb, ids, bm: llg_torch.apply_token_bitmask_inplace(lg, bm)
    except ImportError:
        pass
    return out


def timed(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of one call (logits masked in place; the first call warms up)."""
    fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def env_info(device: torch.device) -> dict:
    def ver(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(), "platform": platform.platform(), "processor": platform.processor(),
        "device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "native_isa": None if cpu_native.load() is None else cpu_native.load().isa,
        "versions": {p: ver(p) for p in ("torch", "triton", "xgrammar", "llguidance")},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI mode: llama3 only, few repeats")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--native-isa", type=int, choices=(0, 1, 2), default=None,
                    help="CPU: run the native pass as 2 AVX-512, 1 AVX2 or 0 portable C (default: the best here)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.native_isa is not None:
        native = cpu_native.load()
        if native is None or native.native_isa < args.native_isa:
            raise SystemExit(f"the native pass cannot run at level {args.native_isa} here")
        native.isa = args.native_isa
    device = torch.device(args.device)
    vocabs = {"llama3": VOCABS["llama3"]} if args.quick else VOCABS
    densities = ("half",) if args.quick else DENSITIES
    repeats = 5 if args.quick else 50
    fns = contenders(device)
    results = []
    for label, vocab in vocabs.items():
        for density in densities:
            table = make_table(vocab, density, device)
            for rows in (1, 8):
                g = torch.Generator().manual_seed(rows)
                row_ids = torch.randperm(table.shape[0], generator=g)[:rows].to(torch.int32).to(device)
                bitmask = table.index_select(0, row_ids).contiguous()
                base = torch.randn(rows, vocab, generator=g).to(device)
                want = base.clone()
                torch_ref.apply_token_mask(want, table, row_ids)
                entry = {"vocab": label, "vocab_size": vocab, "density": density, "rows": rows, "seconds": {}}
                for name, fn in fns.items():
                    logits = base.clone()
                    fn(logits, table, row_ids, bitmask)
                    if not torch.equal(logits.view(torch.int32), want.view(torch.int32)):
                        raise SystemExit(f"{name} disagrees with the torch reference on {label} {density} rows={rows}")
                    logits = base.clone()
                    entry["seconds"][name] = timed(lambda: fn(logits, table, row_ids, bitmask), repeats, device)
                results.append(entry)
    names = list(fns)
    load = os.getloadavg()
    print(f"mask kernel, {device}, {torch.get_num_threads()} threads, median of {repeats}; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs; "
          "baseline constrain (us), others as x of it (>1 = slower than constrain)")
    print("| vocab | density | rows | constrain us | " + " | ".join(n for n in names[1:]) + " |")
    print("|---|---|---|---|" + "---|" * (len(names) - 1))
    for e in results:
        base_s = e["seconds"]["constrain"]
        cells = [f"{e['seconds'][n] / base_s:.2f}x ({e['seconds'][n] * 1e6:.0f} us)" for n in names[1:]]
        print(f"| {e['vocab']} | {e['density']} | {e['rows']} | {base_s * 1e6:.0f} | " + " | ".join(cells) + " |")
    out = args.json or Path(__file__).parent / "results" / f"bench_kernel{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": env_info(device), "repeats": repeats, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
