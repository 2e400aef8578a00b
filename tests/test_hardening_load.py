"""Bounded load on loopback: 32 concurrent clients, mixed tool sets, modes, streaming and not, against one
`constrain serve --constrained-tools` with a small index-cache bound. Every request must get its own valid reply (no
cross-talk: names, arguments and response_format content valid for that request, and its own prompt length), the
index cache must stay within its byte bound by evicting, and resident memory must not grow with the request count.
Latency and throughput are printed here and measured at scale by `benchmarks/load.py`; they are never asserted.
"""

from __future__ import annotations


import pytest

from server_utils import demo_server, run_load, stats_of

CLIENTS, PER_CLIENT, MAX_TOKENS = 32, 3, 32
CACHE_BYTES = 20 << 20  # holds the load run's 10 compiled policies (~1.6 MB each), not the warm-up's 20
# IndexCache evicts to its bound at each lookup and lazy indexes then grow as generation fills their rows, so between
# lookups the estimate may pass the bound by what the last requests filled in
CACHE_GROWTH = CACHE_BYTES // 8
RSS_GROWTH_BOUND = 256 << 20  # a leak per request (a kept job, index or KV cache) would pass it; noise does not


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--constrained-tools", "--max-queue", str(CLIENTS * 2), "--cache-max-bytes", str(CACHE_BYTES)]
    with demo_server("load", args, tmp_path_factory.mktemp("load")) as s:
        yield s


def test_concurrent_mixed_load(server):
    import transformers

    from constrain.demo_model import ensure_demo_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(ensure_demo_model()))
    start = stats_of(server.port)
    # a warm-up over 4 tool sets (20 policies: more than the cache holds, so it must evict), then the baseline
    warm = run_load(server.port, clients=8, per_client=3, max_tokens=MAX_TOKENS, n_sets=4, tokenizer=tokenizer)
    assert not warm["failures"], warm["failures"][:5]
    before = stats_of(server.port)
    assert before["cache"]["evictions"] > start["cache"]["evictions"], before  # the byte bound is enforced
    assert before["cache"]["bytes"] <= CACHE_BYTES + CACHE_GROWTH, before
    report = run_load(server.port, clients=CLIENTS, per_client=PER_CLIENT, max_tokens=MAX_TOKENS, tokenizer=tokenizer)
    after = stats_of(server.port)
    print(f"\nload: {report['requests']} requests, {report['clients']} clients, p50 {report['p50_s']:.2f} s, "
          f"p99 {report['p99_s']:.2f} s, {report['throughput_rps']:.1f} req/s; RSS {before['rss_bytes'] >> 20} -> "
          f"{after['rss_bytes'] >> 20} MiB; cache {after['cache']}")
    assert not report["failures"], report["failures"][:5]
    assert report["ok"] == CLIENTS * PER_CLIENT
    assert after["queued"] == 0
    cache = after["cache"]
    assert cache["max_bytes"] == CACHE_BYTES
    assert cache["bytes"] <= CACHE_BYTES + CACHE_GROWTH, cache
    assert after["rss_bytes"] - before["rss_bytes"] < RSS_GROWTH_BOUND, (before, after)
    assert server.proc.poll() is None
