"""Plot bench_kernel.py's and bench_e2e.py's JSON: CPU mask application per case and end-to-end time per step.

Usage: python benchmarks/plot_decoding.py [--kernel benchmarks/results/bench_kernel.json]
       [--e2e benchmarks/results/bench_e2e.json] [--out benchmarks/decoding.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KERNELS = ("constrain_planned", "constrain", "llguidance", "xgrammar")
E2E = ("unconstrained", "constrain", "xgrammar")
# One colour per contender in both panels (the processor masks through the planned path).
COLOURS = {"constrain_planned": "C0", "constrain": "C1", "llguidance": "C2", "xgrammar": "C3", "unconstrained": "0.6"}
E2E_COLOURS = {"constrain": "C0"}
DENSITY = {"one": "1 tok", "half": "half", "all_but_one": "all-1"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--kernel", type=Path, default=here / "results" / "bench_kernel.json")
    ap.add_argument("--e2e", type=Path, default=here / "results" / "bench_e2e.json")
    ap.add_argument("--out", type=Path, default=here / "decoding.png")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kernel = json.loads(args.kernel.read_text())
    e2e = json.loads(args.e2e.read_text())
    cases = kernel["results"]
    fig, (ax_k, ax_e) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [3.2, 1]})

    names = [n for n in KERNELS if any(n in c["seconds"] for c in cases)]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [c["seconds"].get(name, float("nan")) * 1e6 for c in cases]
        ax_k.bar([x + (i - (len(names) - 1) / 2) * width for x in range(len(cases))], values, width, label=name,
                 color=COLOURS[name])
    ax_k.set_yscale("log")
    ax_k.set_ylabel("µs per call (median)")
    ax_k.set_xticks(range(len(cases)))
    ax_k.set_xticklabels([f"{c['vocab']}\n{DENSITY.get(c['density'], c['density'])}\n×{c['rows']}" for c in cases],
                         fontsize=7)
    load = kernel["env"].get("load_average", [float("nan")])[0]
    ax_k.set_title(f"mask application on the CPU, {kernel['env'].get('threads')} thread(s), float32 [rows, V] "
                   f"(load {load:.1f})", fontsize=10)
    ax_k.grid(axis="y", alpha=0.3)
    ax_k.legend(ncol=len(names), fontsize=8)

    batches = e2e["results"]
    names = [n for n in E2E if any(n in b["ms_per_step"] for b in batches)]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [x + (i - (len(names) - 1) / 2) * width for x in range(len(batches))]
        values = [b["ms_per_step"].get(name, float("nan")) for b in batches]
        bars = ax_e.bar(xs, values, width, label=name, color=E2E_COLOURS.get(name, COLOURS[name]))
        if name != "unconstrained":
            for bar, b in zip(bars, batches):
                ratio = b.get("paired_ratio", {}).get(name)
                if ratio is not None:
                    ax_e.annotate(f"{ratio:.2f}×", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                                  ha="center", va="bottom", fontsize=8)
    ax_e.set_xticks(range(len(batches)))
    ax_e.set_xticklabels([f"batch {b['batch']}" for b in batches])
    ax_e.set_ylabel("ms per generated step (median)")
    load = e2e["env"].get("load_average", [float("nan")])[0]
    ax_e.set_title(f"end to end, tiny CPU model\n(× paired ratio to unconstrained; load {load:.1f})", fontsize=10)
    ax_e.grid(axis="y", alpha=0.3)
    ax_e.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
