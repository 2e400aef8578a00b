"""Load benchmark of `constrain serve --constrained-tools` on loopback: N concurrent clients, mixed tool sets and
modes, streamed and not; every reply checked against its own request. Prints requests, concurrency, p50/p99 latency,
throughput, resident memory and index-cache figures before and after; writes them as JSON.

Usage: python benchmarks/load.py [--quick] [--clients 32] [--per-client 10] [--max-tokens 32] [--sets 4]
                                 [--cache-max-bytes N] [--model DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from server_utils import Server, run_load, stats_of  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 clients x 2 requests (CI: keeps the script working)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--per-client", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sets", type=int, default=4, help="distinct tool sets (x 5 modes = distinct policies)")
    parser.add_argument("--cache-max-bytes", type=int, default=None, help="the server's index-cache bound")
    parser.add_argument("--model", default=None, help="a transformers model directory (default: the demo model)")
    parser.add_argument("--json", default=None, help="where to write the figures (default: none)")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.per_client = 8, 2

    import transformers

    from constrain.demo_model import ensure_demo_model

    model_dir = args.model or str(ensure_demo_model())
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    server_args = ["--constrained-tools", "--max-queue", str(2 * args.clients)]
    if args.model:
        server_args += ["--model", args.model]
    if args.cache_max_bytes is not None:
        server_args += ["--cache-max-bytes", str(args.cache_max_bytes)]
    server = Server("bench-load", server_args, Path(tempfile.mkdtemp(prefix="constrain-load-")))
    server.start()
    try:
        server.wait_ready()
        idle = stats_of(server.port)
        # one request per policy first: compiles are then out of the measured run (they are timed by bench_index)
        warm = run_load(server.port, clients=1, per_client=5 * args.sets, max_tokens=args.max_tokens, n_sets=args.sets,
                        tokenizer=tokenizer)
        before = stats_of(server.port)
        report = run_load(server.port, clients=args.clients, per_client=args.per_client, max_tokens=args.max_tokens,
                          n_sets=args.sets, tokenizer=tokenizer)
        after = stats_of(server.port)
    finally:
        server.stop()
    failures = warm["failures"] + report["failures"]
    mib = 1 << 20
    rows = [
        ("requests (all checked against their own request)", f"{report['requests']} ({report['ok']} valid)"),
        ("concurrent clients", report["clients"]),
        ("max_tokens", args.max_tokens),
        ("distinct policies", 5 * args.sets),
        ("p50 latency", f"{report['p50_s']:.3f} s"),
        ("p99 latency", f"{report['p99_s']:.3f} s"),
        ("throughput", f"{report['throughput_rps']:.2f} req/s"),
        ("RSS idle / after warm-up / after load", f"{idle['rss_bytes'] / mib:.0f} / {before['rss_bytes'] / mib:.0f} / "
                                                  f"{after['rss_bytes'] / mib:.0f} MiB"),
        ("index cache entries / bytes / bound", f"{after['cache']['entries']} / {after['cache']['bytes'] / mib:.1f} / "
                                                f"{after['cache']['max_bytes'] / mib:.0f} MiB"),
        ("index cache hits / misses / evictions", f"{after['cache']['hits']} / {after['cache']['misses']} / "
                                                  f"{after['cache']['evictions']}"),
        ("failures", len(failures)),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for f in failures[:10]:
        print("FAILURE", f)
    if args.json:
        env = {"python": platform.python_version(), "machine": platform.machine(), "model": model_dir,
               "transformers": transformers.__version__}
        Path(args.json).write_text(json.dumps({"env": env, "args": vars(args), "report": report, "idle": idle,
                                               "before": before, "after": after}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
