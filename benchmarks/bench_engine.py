"""Side-by-side engine benchmark: constrain vs xgrammar, llguidance and outlines-core, in one process, same inputs.

Every engine gets the exact token bytes of one `constrain.vocabulary.Vocabulary` (special and EOS ids are never
spelled as bytes; EOS ids are the stop tokens). For each (workload, vocabulary):
  1. valid outputs are sampled from constrain's index (random allowed tokens, then steered to acceptance, then EOS):
     `--samples` (4), and more while they hold fewer than `--min-steps` (256) tokens together;
  2. each engine is checked against constrain: allowed-token sets on the states along the first `--samples` outputs
     (non-special ids compared exactly, EOS compared as "some EOS allowed"); a peer rejecting a sampled token is a
     disagreement;
  3. each engine is timed on fresh compiles: cold compile, time to first mask (grammar text -> first mask filled),
     the median of `--ttfm-repeats` (3) cold compiles per engine (the first alone is kept as `ttfm_first_s`), each
     followed by all the sampled token ids replayed on it (mask fill into an int32 bitmask + accept per step; cold
     p50 and p99 are the medians over those replays). constrain's lazily built rows are computed inside that timing.
     The engines' compiles are interleaved, one round at a time, each round led by the next engine.
outlines-core compiles once, in a forked child (60 s watchdog, the index comes back pickled); the others compile
in-process and are marked "timeout" afterwards if they exceeded 60 s (a slow first compile is not repeated).

Usage: python benchmarks/bench_engine.py [--quick] [--vocabs llama3,qwen3,gemma4] [--workloads a,b]
                                          [--engines constrain,xgrammar,llguidance,outlines] [--json PATH]
       python benchmarks/bench_engine.py --prep-only --prep-repeats 5 --engines constrain,xgrammar
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import random
import select
import signal
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import constrain  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from workloads import Json, Literal, Workload, workloads  # noqa: E402

from constrain import automaton as fa  # noqa: E402
from constrain import index as cindex  # noqa: E402
from constrain import trie as ctrie  # noqa: E402
from constrain.index import TokenIndex  # noqa: E402
from constrain.schema import compile_schema  # noqa: E402
from constrain.vocabulary import Vocabulary, qwen3_vocabulary  # noqa: E402

TIMEOUT_S = 60.0
ENGINES = ("constrain", "xgrammar", "llguidance", "outlines")
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def mib(n: float | None) -> float | None:
    return None if n is None else round(n / 2**20, 2)


def load_vocab(label: str) -> Vocabulary:
    from constrain import assets

    if label == "llama3":
        return Vocabulary.from_gguf(assets.gguf_path("llama-bpe"))
    if label == "qwen3":
        return qwen3_vocabulary()
    if label == "gemma4":
        return Vocabulary.from_gguf(assets.gguf_path("gemma-4"))
    raise ValueError(label)


def allowed_ids(bitmask: np.ndarray, n_tokens: int) -> np.ndarray:
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:n_tokens]
    return np.flatnonzero(bits)


# --------------------------------------------------------------------------------------------------------------------
# Engines. Each: prepare(vocab) once per vocabulary (timed as tokenizer preprocessing), compile(workload) -> compiled,
# matcher(compiled) -> m, fill(m, buf), accept(m, tok) -> bool.


class Constrain:
    name = "constrain"

    def prepare(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        ctrie._TRIE_CACHE.clear()
        cindex.prepare(vocab)  # the per-vocabulary preprocessing TokenIndex would do on first use: trie, reference masks
        self.trie = ctrie._trie_for(vocab)

    def dfa(self, w: Workload) -> fa.Dfa:
        parts = [fa.literal(p.text.encode()) if isinstance(p, Literal)
                 else compile_schema(p.schema, whitespace="compact", timeout_s=TIMEOUT_S).dfa for p in w.parts]
        return parts[0] if len(parts) == 1 else fa.compile(fa.concat(*parts))

    def compile(self, w: Workload) -> TokenIndex:
        fa.clear_compiled()  # cold: no sub-automaton kept from the sampling compile or an earlier workload
        t0 = time.perf_counter()
        dfa = self.dfa(w)
        t1 = time.perf_counter()
        idx = TokenIndex(dfa, self.vocab, background=True)  # as compile_json_schema and the index cache build it
        self.last_split = {"schema_to_dfa_s": t1 - t0, "dfa_to_index_s": time.perf_counter() - t1,
                           "dfa_states": dfa.n_states}
        return idx

    def matcher(self, idx: TokenIndex):
        return idx.start()

    def fill(self, st, buf: np.ndarray) -> None:
        st.fill_mask(buf)

    def accept(self, st, tok: int) -> bool:
        st.advance(tok)
        return True


class XGrammar:
    name = "xgrammar"

    def prepare(self, vocab: Vocabulary, peer_tokens: list[bytes]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo(peer_tokens, xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                 stop_token_ids=list(vocab.eos_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def compile(self, w: Workload):
        xgr = self.xgr
        schema = w.single_schema
        if schema is not None:
            return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                                     strict_mode=False)
        parts = []
        for p in w.parts:
            if isinstance(p, Literal):
                parts.append(xgr.Grammar.from_ebnf("root ::= " + json.dumps(p.text)))
            else:
                parts.append(xgr.Grammar.from_json_schema(json.dumps(p.schema), any_whitespace=False,
                                                          separators=(",", ":"), strict_mode=False))
        return self.compiler.compile_grammar(xgr.Grammar.concat(*parts))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, buf: np.ndarray) -> None:
        m.fill_next_token_bitmask(buf[None, :] if buf.ndim == 1 else buf)

    def accept(self, m, tok: int) -> bool:
        return bool(m.accept_token(tok))


class _ByteTokenizer:
    """What llguidance.TokenizerWrapper needs: token bytes, special ids, EOS/BOS, and a (greedy per-byte) encoder."""

    def __init__(self, vocab: Vocabulary, tokens: list[bytes]):
        self.tokens = tokens
        self.eos_token_id = vocab.eos_ids[0]
        self.bos_token_id = None
        self.special_token_ids = sorted(set(vocab.special_ids) | set(vocab.eos_ids))
        byte_ids: dict[int, int] = {}
        for i, data in enumerate(tokens):
            if len(data) == 1 and i not in vocab.special_ids:
                byte_ids.setdefault(data[0], i)
        self._byte_ids = byte_ids

    def __call__(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        return [self._byte_ids[b] for b in data]


class LLGuidance:
    name = "llguidance"

    def prepare(self, vocab: Vocabulary, peer_tokens: list[bytes]) -> None:
        import llguidance
        import llguidance.numpy as lnp

        self.llg, self.lnp = llguidance, lnp
        # Special tokens keep their text (llguidance marks special_token_ids itself); holes stay empty.
        tokens = [vocab.token_bytes[i] if (i in vocab.special_ids or i in vocab.eos_ids) and vocab.token_bytes[i]
                  else peer_tokens[i] for i in range(vocab.n_tokens)]
        wrapper = llguidance.TokenizerWrapper(_ByteTokenizer(vocab, tokens))
        self.tok = llguidance.LLTokenizer(wrapper, n_vocab=vocab.vocab_size, eos_token=list(vocab.eos_ids))

    @staticmethod
    def grammar(w: Workload) -> str:
        opts = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":", "coerce_one_of": True}

        def js(schema):
            return "%json" + json.dumps({**schema, "x-guidance": opts})

        if w.single_schema is not None:
            return "start: " + js(w.single_schema)
        body = " ".join(json.dumps(p.text) if isinstance(p, Literal) else "value" for p in w.parts)
        schema = next(p.schema for p in w.parts if isinstance(p, Json))
        return f"start: {body}\nvalue: {js(schema)}\n"

    def compile(self, w: Workload):
        m = self.llg.LLMatcher(self.tok, self.grammar(w), log_level=0)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def matcher(self, compiled):
        compiled.reset()
        return compiled

    def fill(self, m, buf: np.ndarray) -> None:
        m.unsafe_compute_mask_ptr(buf.ctypes.data, buf.nbytes)

    def accept(self, m, tok: int) -> bool:
        return bool(m.consume_token(tok)) and not m.is_error()


def _rust_regex_escape(text: str) -> str:
    out = []
    for ch in text:
        if ch == "\n":
            out.append("\\n")
        elif ch in "\\.+*?()|[]{}^$#&-~":  # regex-syntax's meta characters; escaping others (`\\<`) is an error
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


class Outlines:
    name = "outlines"

    def prepare(self, vocab: Vocabulary, peer_tokens: list[bytes]) -> None:
        import outlines_core

        self.oc = outlines_core
        eos = set(vocab.eos_ids)
        mapping: dict[bytes, list[int]] = {}
        for i, data in enumerate(peer_tokens):
            if data and i not in eos:
                mapping.setdefault(data, []).append(i)
        # outlines-core takes one EOS id; the others are left out of its vocabulary (never allowed).
        self.vocabulary = outlines_core.Vocabulary(vocab.eos_ids[0], mapping)
        self.vocab_size = vocab.vocab_size
        self.eos = eos

    def regex(self, w: Workload) -> str:
        from outlines_core.json_schema import build_regex_from_schema

        return "".join(_rust_regex_escape(p.text) if isinstance(p, Literal)
                       else build_regex_from_schema(json.dumps(p.schema), "") for p in w.parts)

    def compile_in_child(self, w: Workload) -> tuple[str, Any, float, int]:
        """(status, index or error, seconds, child RSS delta): compile in a forked child under the 60 s watchdog."""
        regex = self.regex(w)
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(r)
            try:
                base = rss()
                t0 = time.perf_counter()
                idx = self.oc.Index(regex, self.vocabulary)
                dt = time.perf_counter() - t0
                payload = pickle.dumps(("ok", idx, dt, rss() - base))
            except BaseException as err:  # noqa: BLE001 - report anything to the parent
                payload = pickle.dumps(("error", repr(err)[:300], 0.0, 0))
            with os.fdopen(wfd, "wb") as fh:
                fh.write(payload)
            os._exit(0)
        os.close(wfd)
        chunks = []
        deadline = time.monotonic() + TIMEOUT_S
        with os.fdopen(r, "rb") as fh:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fh], [], [], left)[0]:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    return "timeout", None, TIMEOUT_S, 0
                chunk = os.read(fh.fileno(), 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        os.waitpid(pid, 0)
        if not chunks:
            return "error", "child died", 0.0, 0
        return pickle.loads(b"".join(chunks))

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, g, buf: np.ndarray) -> None:
        g.write_mask_into(buf.ctypes.data, buf.size, 4)

    def accept(self, g, tok: int) -> bool:
        if tok in self.eos and g.is_finished():
            return True  # outlines-core's finished Guide has no transition on EOS; EOS is what it allows there
        try:
            g.advance(tok, return_tokens=False)
            return True
        except ValueError:
            return False


# --------------------------------------------------------------------------------------------------------------------
# Reference outputs


# `sample_outputs`' most outputs when its first ones are short (`--min-steps`)
MAX_SAMPLES = 64


def sample_outputs(idx: TokenIndex, vocab: Vocabulary, n: int, soft: int, hard: int, seed: int,
                   min_steps: int = 0) -> list[list[int]]:
    """Valid token sequences (ending with an EOS id): random allowed tokens for `soft` steps, then steered to accept.
    `n` of them, and more (at most `MAX_SAMPLES` in all) while they hold fewer than `min_steps` tokens together: the
    first `n` are the same whatever `min_steps` is."""
    dfa = idx.dfa
    dist = fa.shortest_distances(dfa)
    eos = set(vocab.eos_ids)
    tb = vocab.token_bytes
    rng = random.Random(seed)
    out: list[list[int]] = []
    steps = 0
    while len(out) < n or (steps < min_steps and len(out) < MAX_SAMPLES):
        st, toks = idx.start(), []
        while True:
            allowed = st.allowed_token_ids().tolist()
            ends = [t for t in allowed if t in eos]
            body = [t for t in allowed if t not in eos]
            if ends and (len(toks) >= soft or not body):
                toks.append(ends[0])
                break
            if len(toks) >= hard:
                raise RuntimeError("sampled output did not finish")
            if len(toks) < soft:
                tok = rng.choice(body)
            else:
                cands = rng.sample(body, min(256, len(body)))
                tok = min(cands, key=lambda t: (dist[dfa.step(st.dfa_state, tb[t])], -len(tb[t])))
            st.advance(tok)
            toks.append(tok)
        out.append(toks)
        steps += len(toks)
    return out


def reference_masks(idx: TokenIndex, samples: list[list[int]], n_words: int, check_steps: int) -> list[list[np.ndarray]]:
    masks = []
    for toks in samples:
        st, rows = idx.start(), []
        for tok in toks[:check_steps]:
            rows.append(st.mask().copy())
            st.advance(tok)
        masks.append(rows)
    return masks


def check_engine(eng, compiled, samples, ref, vocab, excluded: np.ndarray, check_steps: int) -> dict:
    """Compare allowed-token sets with the reference on the first `check_steps` states of every sample."""
    n_words = (vocab.vocab_size + 31) // 32
    buf = np.zeros(n_words, dtype=np.int32)
    eos = np.asarray(vocab.eos_ids)
    n_states = n_diff = n_peer_more = 0
    examples = []
    rejected = None
    for si, toks in enumerate(samples):
        m = eng.matcher(compiled)
        for step, tok in enumerate(toks[:check_steps]):
            buf[:] = 0
            eng.fill(m, buf)
            ours = allowed_ids(ref[si][step], vocab.n_tokens)
            theirs = allowed_ids(buf, vocab.n_tokens)
            ours_b = np.setdiff1d(ours, excluded)
            theirs_b = np.setdiff1d(theirs, excluded)
            eos_ours, eos_theirs = bool(np.isin(eos, ours).any()), bool(np.isin(eos, theirs).any())
            n_states += 1
            if not np.array_equal(ours_b, theirs_b) or eos_ours != eos_theirs:
                n_diff += 1
                only_o = np.setdiff1d(ours_b, theirs_b)
                only_t = np.setdiff1d(theirs_b, ours_b)
                n_peer_more += bool(only_t.size) or (eos_theirs and not eos_ours)
                if len(examples) < 3:
                    examples.append({
                        "sample": si, "step": step,
                        "prefix": vocab.decode(toks[:step])[-40:].decode("utf-8", "replace"),
                        "only_constrain": [len(only_o), [vocab.token_bytes[t].decode("utf-8", "replace")
                                                         for t in only_o[:5]]],
                        "only_peer": [len(only_t), [vocab.token_bytes[t].decode("utf-8", "replace")
                                                    for t in only_t[:5]]],
                        "eos": [eos_ours, eos_theirs],
                    })
            if not eng.accept(m, tok):
                rejected = rejected or {"sample": si, "step": step,
                                        "token": vocab.token_bytes[tok].decode("utf-8", "replace")}
                break
    # states_peer_more: differing states where the peer allows a token (or EOS) that we do not; on the others its
    # mask is a subset of ours
    return {"states_checked": n_states, "states_differing": n_diff, "states_peer_more": n_peer_more,
            "examples": examples, "rejected": rejected}


def replay(eng, compiled, samples, n_words: int) -> tuple[list[float], dict | None]:
    """Per-step seconds of (mask fill + accept) over all samples; first rejection if any."""
    buf = np.zeros(n_words, dtype=np.int32)
    times: list[float] = []
    rejected = None
    perf = time.perf_counter
    gc.disable()
    try:
        for si, toks in enumerate(samples):
            m = eng.matcher(compiled)
            for step, tok in enumerate(toks):
                t0 = perf()
                eng.fill(m, buf)
                ok = eng.accept(m, tok)
                times.append(perf() - t0)
                if not ok:
                    rejected = rejected or {"sample": si, "step": step}
                    break
    finally:
        gc.enable()
    return times, rejected


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


# --------------------------------------------------------------------------------------------------------------------


class _Cold:
    """One in-process engine's cold compiles in a cell: each timed to its first mask and replayed at once. A single
    cold compile swings by 20-50 % on this shared machine (xgrammar's parallel_1to5_of_5 took 4.0-6.6 ms in two
    runs): the figures are medians of a few, each as cold as the first."""

    def __init__(self, name: str):
        self.name = name
        self.ttfms: list[float] = []
        self.compiles: list[float] = []
        self.splits: list[dict] = []  # constrain's `last_split` per compile
        self.cold: list[tuple[list[float], dict | None]] = []  # per compile: its replay (step seconds, rejection)
        self.compiled: Any = None  # the latest compile (replayed warm afterwards)
        self.compile_mem_mib: float | None = None  # RSS growth over the first compile
        self.error: Exception | None = None
        self.done = False

    def once(self, eng, w: Workload, samples: list[list[int]], n_words: int) -> None:
        self.compiled = None  # the previous compile freed first: each one starts as cold as the first
        gc.collect()
        base = rss() if not self.ttfms else None
        buf = np.zeros(n_words, dtype=np.int32)
        t0 = time.perf_counter()
        self.compiled = eng.compile(w)
        self.compiles.append(time.perf_counter() - t0)
        m = eng.matcher(self.compiled)
        eng.fill(m, buf)
        self.ttfms.append(time.perf_counter() - t0)
        if base is not None:
            self.compile_mem_mib = mib(rss() - base)
        if self.name == "constrain":
            self.splits.append(eng.last_split)
        if self.ttfms[-1] <= TIMEOUT_S:
            self.cold.append(replay(eng, self.compiled, samples, n_words))
        if self.ttfms[-1] > 1.0:
            self.done = True  # (slow enough that one compile is a fair measure)

    def fail(self, err: Exception) -> None:
        self.error, self.done, self.compiled = err, True, None


def run_pair(engines: dict, w: Workload, vlabel: str, vocab: Vocabulary, args) -> dict:
    n_words = (vocab.vocab_size + 31) // 32
    res: dict[str, Any] = {"workload": w.name, "vocab": vlabel, "engines": {}}
    ours = engines["constrain"]
    try:
        ref_idx = ours.compile(w)
    except Exception as err:  # noqa: BLE001
        res["error"] = f"constrain cannot compile: {type(err).__name__}: {str(err)[:200]}"
        res["engines"]["constrain"] = {"status": "error", "error": res["error"]}
        return res
    # a stable seed (str hash() changes per process): the same samples, and so comparable agreement counts, every run
    # The replays take every sample, so that p99 is not a short replay's 2nd worst step (`--min-steps`); the masks are
    # checked on the first `--samples` only, as many states a cell whatever the outputs' lengths
    samples = sample_outputs(ref_idx, vocab, args.samples, args.soft, args.hard,
                             seed=zlib.crc32(f"{w.name}/{vlabel}".encode()) & 0xFFFF, min_steps=args.min_steps)
    checked = samples[: args.samples]
    res["sample_lengths"] = [len(s) for s in samples]
    ref = reference_masks(ref_idx, checked, n_words, args.check_steps)
    excluded = np.asarray(sorted(set(vocab.special_ids) | set(vocab.eos_ids)), dtype=np.int64)
    del ref_idx
    # The in-process engines' cold compiles interleaved, a round at a time, each round starting with the next engine
    # (constrain, xgrammar, llguidance; then xgrammar, llguidance, constrain; ...): a slow minute on this shared machine,
    # or the first compile after the reference masks above, falls on every engine alike instead of on one engine's
    # block of compiles. Each compile is replayed right after its first mask (`_Cold`).
    runs = {name: _Cold(name) for name in engines if name != "outlines"}
    order = list(runs)
    for rep in range(args.ttfm_repeats):
        for name in order[rep % len(order):] + order[: rep % len(order)]:
            run = runs[name]
            if run.done:
                continue
            try:
                run.once(engines[name], w, samples, n_words)
            except Exception as err:  # noqa: BLE001
                run.fail(err)
    for name, eng in engines.items():
        r: dict[str, Any] = {}
        res["engines"][name] = r
        run = runs.get(name)
        compiled = None
        try:
            if run is not None and run.error is not None:
                raise run.error
            if name == "outlines":
                status, compiled, dt_compile, child_mem = eng.compile_in_child(w)
                if status != "ok":
                    r.update(status=status, error=compiled if status == "error" else None)
                    continue
                buf = np.zeros(n_words, dtype=np.int32)
                t0 = time.perf_counter()
                m = eng.matcher(compiled)
                eng.fill(m, buf)
                ttfm = dt_compile + time.perf_counter() - t0
                r["compile_mem_mib"] = mib(child_mem)
            else:
                compiled, ttfm, dt_compile = run.compiled, statistics.median(run.ttfms), statistics.median(run.compiles)
                r["compile_mem_mib"] = run.compile_mem_mib
                r["ttfm_first_s"] = run.ttfms[0]
                r["ttfm_all_s"] = run.ttfms
                if name == "constrain":
                    r.update({k: (round(statistics.median(sp[k] for sp in run.splits), 6) if isinstance(v, float)
                                  else v) for k, v in run.splits[0].items()})
            r["compile_s"] = dt_compile
            r["ttfm_s"] = ttfm
            if ttfm > TIMEOUT_S:
                r["status"] = "timeout"
                continue
            cold = [replay(eng, compiled, samples, n_words)] if name == "outlines" else run.cold
            # Cold per-token figures: the median over the compiles of each one's replay (one replay's p99 is its 3rd-5th
            # worst step, which one disturbance on this shared machine moves several-fold)
            every = [t for times, _ in cold for t in times]
            r["steps"] = len(cold[0][0])
            r.update(p50_us=statistics.median(pct(t, 0.5) for t, _ in cold) * 1e6,
                     p99_us=statistics.median(pct(t, 0.99) for t, _ in cold) * 1e6, max_us=max(every) * 1e6,
                     mean_us=statistics.fmean(every) * 1e6)
            r["p50_all_us"] = [pct(t, 0.5) * 1e6 for t, _ in cold]
            r["p99_all_us"] = [pct(t, 0.99) * 1e6 for t, _ in cold]
            r["replay_rejected"] = next((rej for _, rej in cold if rej), None)
            # Warm: the same outputs again on the same compiled grammar (constrain's rows now all built).
            warm, _ = replay(eng, compiled, samples, n_words)
            r.update(p50_warm_us=pct(warm, 0.5) * 1e6, p99_warm_us=pct(warm, 0.99) * 1e6)
            if name == "constrain":
                r["index_nbytes_mib"] = mib(compiled.nbytes())
                r["replay_total_s"] = statistics.median(sum(t) for t, _ in cold)
            else:
                # Check on a separate compile so the timed run above started cold.
                chk = compiled if name == "outlines" else eng.compile(w)
                r["check"] = check_engine(eng, chk, checked, ref, vocab, excluded, args.check_steps)
            r["status"] = "ok"
        except Exception as err:  # noqa: BLE001
            r.update(status="error", error=f"{type(err).__name__}: {str(err)[:300]}")
        finally:
            compiled = m = None  # noqa: F841
            if run is not None:
                run.compiled = None
    return res


_IMPORTS = {"xgrammar": ("xgrammar",), "llguidance": ("llguidance", "llguidance.numpy"),
            "outlines": ("outlines_core", "outlines_core.json_schema"), "constrain": ()}
CLASSES: dict[str, type] = {"constrain": Constrain, "xgrammar": XGrammar, "llguidance": LLGuidance,
                            "outlines": Outlines}


def peer_tokens_of(vocab: Vocabulary) -> list[bytes]:
    non_byte = set(vocab.special_ids) | set(vocab.eos_ids)
    return [b"" if i in non_byte else data for i, data in enumerate(vocab.token_bytes)]


def prepare_timed(name: str, vocab: Vocabulary, peer_tokens: list[bytes]) -> tuple[Any, dict]:
    """Prepare an engine for a vocabulary (its modules already imported): (engine, {s, rss})."""
    eng = CLASSES[name]()
    gc.collect()
    base = rss()
    t0, c0 = time.perf_counter(), time.process_time()
    eng.prepare(vocab) if name == "constrain" else eng.prepare(vocab, peer_tokens)
    # CPU seconds of the whole process (all threads): less sensitive than wall time to other load on the machine
    out = {"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "rss": rss() - base}
    if name == "constrain":
        out["trie_nbytes"] = eng.trie.nbytes
    return eng, out


def prep_child(vlabel: str, name: str) -> None:
    """--prep-child: one engine's preprocessing in a fresh process (RSS deltas are meaningless after other runs)."""
    import importlib

    for mod in _IMPORTS[name]:
        importlib.import_module(mod)
    vocab = load_vocab(vlabel)
    tokens = peer_tokens_of(vocab)
    _, out = prepare_timed(name, vocab, tokens)
    print(json.dumps(out))


def prep_fresh(vlabel: str, name: str) -> dict:
    try:
        proc = subprocess.run([sys.executable, __file__, "--prep-child", vlabel, name], capture_output=True,
                              text=True, timeout=300)
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except Exception as err:  # noqa: BLE001
        return {"error": repr(err)[:200]}


def prep_fresh_median(vlabel: str, names: list[str], repeats: int) -> dict[str, dict]:
    """`prep_fresh` `repeats` times per engine, engines interleaved (a noisy minute hits all of them): the median time
    and RSS of each, every time kept under `s_runs`."""
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for _ in range(repeats):
        for n in names:
            runs[n].append(prep_fresh(vlabel, n))
    out = {}
    for n, rs in runs.items():
        bad = [r for r in rs if "s" not in r]
        if bad:
            out[n] = bad[0]
            continue
        out[n] = {**rs[0], **{k: statistics.median(r[k] for r in rs) for k in ("s", "cpu_s", "rss")}}
        if repeats > 1:
            out[n]["s_runs"] = [r["s"] for r in rs]
    return out


def env_info(vocabs: dict[str, Vocabulary]) -> dict:
    from importlib.metadata import version

    def ver(p):
        try:
            return version(p)
        except Exception:  # noqa: BLE001
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        gpu = None
    cpu = None
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu,
        "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "gpu": gpu,
        "versions": {p: ver(p) for p in ("torch", "triton", "numpy", "xgrammar", "llguidance", "outlines_core")},
        "commit": commit, "batch": 1,
        "vocabs": {k: {"n_tokens": v.n_tokens, "vocab_size": v.vocab_size, "eos_ids": list(v.eos_ids)}
                   for k, v in vocabs.items()},
    }


def fmt_ratio(peer: float | None, ours: float | None) -> str:
    if peer is None or ours is None or ours <= 0:
        return "-"
    return f"{peer / ours:.2f}x"


def print_tables(prep: dict, results: list[dict], engines: list[str]) -> None:
    peers = [e for e in engines if e != "constrain"]
    print("\n## Tokenizer preprocessing (once per vocabulary, fresh process each). constrain absolute; peer/constrain")
    print("| vocab | constrain s | constrain RSS MiB | " + " | ".join(f"{p} time | {p} RSS" for p in peers) + " |")
    print("|---" * (3 + 2 * len(peers)) + "|")
    for v, d in prep.items():
        o = d["constrain"]
        if "s" not in o:
            print(f"| {v} | {o} |")
            continue
        cells = [f"{fmt_ratio(d[p].get('s'), o['s'])} | {fmt_ratio(d[p].get('rss'), o['rss'])}" if p in d
                 else "- | -" for p in peers]
        print(f"| {v} | {o['s']:.3f} | {mib(o['rss'])} | " + " | ".join(cells) + " |")
    metrics = (("ttfm_s", "time to first mask", 1e3, "ms"), ("p50_us", "per-token p50", 1, "us"),
               ("p99_us", "per-token p99", 1, "us"), ("max_us", "per-token max", 1, "us"),
               ("p50_warm_us", "per-token p50, warm (second replay)", 1, "us"),
               ("p99_warm_us", "per-token p99, warm (second replay)", 1, "us"),
               ("compile_s", "cold compile", 1e3, "ms"))
    for key, title, scale, unit in metrics:
        print(f"\n## {title}: constrain absolute ({unit}); peers as peer/constrain (>1 = constrain faster)")
        print(f"| workload | vocab | constrain {unit} | " + " | ".join(peers) + " |")
        print("|---" * (3 + len(peers)) + "|")
        for r in results:
            o = r["engines"].get("constrain", {})
            if o.get("status") != "ok":
                print(f"| {r['workload']} | {r['vocab']} | {o.get('status', 'error')} | "
                      + " | ".join(r["engines"].get(p, {}).get("status", "-") for p in peers) + " |")
                continue
            cells = []
            for p in peers:
                e = r["engines"].get(p, {})
                if e.get(key) is None:
                    cells.append(e.get("status", "-"))
                else:
                    cells.append(fmt_ratio(e[key], o[key]))
            print(f"| {r['workload']} | {r['vocab']} | {o[key] * scale:.1f} | " + " | ".join(cells) + " |")
    print("\n## constrain breakdown and mask agreement (states differing / checked (of those, states where the peer "
          "allows a token we do not); R = rejected a sampled token)")
    print("| workload | vocab | DFA states | schema->DFA ms | DFA->index ms | replay total ms (lazy rows) | "
          + " | ".join(peers) + " |")
    print("|---" * (6 + len(peers)) + "|")
    for r in results:
        o = r["engines"].get("constrain", {})
        if o.get("status") != "ok":
            continue
        cells = []
        for p in peers:
            c = r["engines"].get(p, {}).get("check")
            if c is None:
                cells.append(r["engines"].get(p, {}).get("status", "-"))
            else:
                cells.append(f"{c['states_differing']}/{c['states_checked']} ({c['states_peer_more']})"
                             + (" R" if c["rejected"] else ""))
        print(f"| {r['workload']} | {r['vocab']} | {o['dfa_states']} | {o['schema_to_dfa_s'] * 1e3:.1f} | "
              f"{o['dfa_to_index_s'] * 1e3:.1f} | {o['replay_total_s'] * 1e3:.1f} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI: llama3 only, two workloads, two short samples")
    ap.add_argument("--vocabs", default=None)
    ap.add_argument("--workloads", default=None)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--samples", type=int, default=None, help="sampled outputs whose masks are checked (4; --quick 2)")
    ap.add_argument("--min-steps", type=int, default=None,
                    help="more outputs replayed until they hold this many tokens (256; --quick 0): a p99 over fewer "
                         "than ~100 steps is a short replay's worst steps")
    ap.add_argument("--ttfm-repeats", type=int, default=3, help="cold compiles per engine and cell; TTFM is their median")
    ap.add_argument("--json", default=None, help="default benchmarks/results/bench_engine[_quick|_prep].json")
    ap.add_argument("--prep-only", action="store_true", help="tokenizer preprocessing only (no workloads)")
    ap.add_argument("--prep-repeats", type=int, default=1,
                    help="fresh processes per (vocabulary, engine), engines interleaved; the median is reported")
    ap.add_argument("--prep-child", nargs=2, metavar=("VOCAB", "ENGINE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.prep_child:
        prep_child(*args.prep_child)
        return 0
    args.samples = args.samples or (2 if args.quick else 4)
    if args.min_steps is None:
        args.min_steps = 0 if args.quick else 256
    args.soft, args.hard, args.check_steps = (24, 200, 12) if args.quick else (64, 600, 24)
    vlabels = (args.vocabs or ("llama3" if args.quick else "llama3,qwen3,gemma4")).split(",")
    wl = workloads(quick=args.quick and not args.workloads)
    if args.workloads:
        wanted = args.workloads.split(",")
        wl = [w for w in wl if w.name in wanted]
    names = args.engines.split(",")
    import importlib

    for n in names:
        for mod in _IMPORTS[n]:
            importlib.import_module(mod)  # imports are not preprocessing
    t_start = time.perf_counter()
    vocabs: dict[str, Vocabulary] = {}
    prep: dict[str, dict] = {}
    results: list[dict] = []
    for vl in vlabels:
        vocab = vocabs[vl] = load_vocab(vl)
        peer_tokens = peer_tokens_of(vocab)
        engines = {}
        prep[vl] = {}
        # Time and RSS from fresh processes per engine; the in-process run (modules imported before) is kept too.
        fresh = prep_fresh_median(vl, names, max(1, args.prep_repeats))
        for n in names:
            if args.prep_only:
                prep[vl][n] = fresh[n]
                continue
            engines[n], inproc = prepare_timed(n, vocab, peer_tokens)
            prep[vl][n] = {**fresh[n], "s_inproc": inproc["s"]}
        print(f"# {vl}: n_tokens={vocab.n_tokens} vocab_size={vocab.vocab_size} prep "
              + ", ".join(f"{n} {d['s']:.2f}s/{mib(d['rss'])}MiB" for n, d in prep[vl].items()), file=sys.stderr)
        for w in [] if args.prep_only else wl:
            t0 = time.perf_counter()
            r = run_pair(engines, w, vl, vocab, args)
            results.append(r)
            print(f"#   {w.name}: {time.perf_counter() - t0:.1f}s "
                  + ", ".join(f"{n}={e.get('status')}" for n, e in r["engines"].items()), file=sys.stderr)
        del engines
    print_tables(prep, results, names)
    suffix = "_prep" if args.prep_only else "_quick" if args.quick else ""
    out = Path(args.json or Path(__file__).parent / "results" / f"bench_engine{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"env": env_info(vocabs), "quick": args.quick, "timeout_s": TIMEOUT_S, "whitespace": "compact",
           "samples": args.samples, "min_steps": args.min_steps, "preprocessing": prep, "results": results,
           "workloads": {w.name: w.description for w in wl}, "wall_s": time.perf_counter() - t_start}
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\n# wrote {out} ({time.perf_counter() - t_start:.0f}s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
