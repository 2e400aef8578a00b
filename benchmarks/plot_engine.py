"""Plot bench_engine.py's JSON: time to first mask and per-token p50/p99 per engine, workload and vocabulary.

Usage: python benchmarks/plot_engine.py [--json benchmarks/results/bench_engine.json] [--out benchmarks/engine.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ENGINES = ("constrain", "xgrammar", "llguidance", "outlines")
FIGURES = (("ttfm_s", 1e3, "time to first mask (ms)"), ("p50_us", 1, "per-token p50, cold (µs)"),
           ("p99_us", 1, "per-token p99, cold (µs)"), ("p50_warm_us", 1, "per-token p50, warm (µs)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--json", type=Path, default=here / "results" / "bench_engine.json")
    ap.add_argument("--out", type=Path, default=here / "engine.png")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(args.json.read_text())
    rows = [r for r in doc["results"] if r["engines"].get("constrain", {}).get("status") == "ok"]
    labels = [f"{r['workload']}\n{r['vocab']}" for r in rows]
    fig, axes = plt.subplots(len(FIGURES), 1, figsize=(max(8, 0.55 * len(rows)), 3.2 * len(FIGURES)), sharex=True)
    width = 0.8 / len(ENGINES)
    for ax, (key, scale, title) in zip(axes, FIGURES):
        for i, engine in enumerate(ENGINES):
            values = []
            for r in rows:
                e = r["engines"].get(engine, {})
                values.append(e[key] * scale if e.get("status") == "ok" and e.get(key) is not None else float("nan"))
            ax.bar([x + (i - 1.5) * width for x in range(len(rows))], values, width, label=engine)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(ncol=4, fontsize=8)
    axes[-1].set_xticks(range(len(rows)))
    axes[-1].set_xticklabels(labels, rotation=60, fontsize=7)
    fig.suptitle(f"constrain vs peers, same token bytes, one process ({doc['env'].get('cpu', 'CPU')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
