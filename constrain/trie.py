"""Byte trie of a vocabulary's tokens, breadth-first in numpy arrays; built once per vocabulary (cached)."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from constrain_kernels import cbuild


@dataclass(frozen=True, eq=False)
class _Trie:
    """Breadth-first byte trie of a vocabulary's byte tokens.

    Nodes are numbered depth by depth (depth `d` holds global ids `depth_start[d-1] : depth_start[d]`); within a depth
    they follow the sorted order of the token bytes, so the children of any node form one contiguous run
    `child_start[n] : child_start[n] + child_count[n]`, and `parent_local[n]` is the parent's offset inside its depth.
    Token `term_tokens[i]` spells exactly the path to node `term_node[i]`; `term_start`/`term_count` index that list
    per node.
    """

    node_byte: np.ndarray  # uint8 [n_nodes]
    parent_local: np.ndarray  # int32 [n_nodes]
    child_start: np.ndarray  # int32 [n_nodes]
    child_count: np.ndarray  # int32 [n_nodes]
    term_start: np.ndarray  # int32 [n_nodes]
    term_count: np.ndarray  # int32 [n_nodes]
    term_tokens: np.ndarray  # int32 [n_byte_tokens], token ids grouped by end node (ascending ids within a node)
    term_node: np.ndarray  # int32 [n_byte_tokens]
    depth_start: tuple[int, ...]  # max_depth + 1 entries

    @property
    def n_nodes(self) -> int:
        return int(self.node_byte.shape[0])

    @property
    def max_depth(self) -> int:
        return len(self.depth_start) - 1

    @property
    def nbytes(self) -> int:
        arrays = (
            self.node_byte,
            self.parent_local,
            self.child_start,
            self.child_count,
            self.term_start,
            self.term_count,
            self.term_tokens,
            self.term_node,
        )
        return sum(int(a.nbytes) for a in arrays)


# Top k bytes of a 64-bit word, k = 0..7 (the low byte never holds token bytes: it holds the chunk's length).
_TOP_BYTES = np.array([((1 << (8 * k)) - 1) << (64 - 8 * k) for k in range(8)], dtype=np.uint64)
_BELOW = [np.uint64(1 << (8 * k)) for k in range(7, -1, -1)]  # x < 2**56: top byte zero; x < 2**48: top two; ...


def _chunk_keys(words: np.ndarray, offs: np.ndarray, rem: np.ndarray) -> np.ndarray:
    """One 7-byte chunk of each token as a sort key: the bytes big-endian, zero-padded, then `min(rem, 8)`.

    Comparing keys compares the chunks as byte strings, a shorter one first. Equal keys below 8 in the low byte are
    equal tokens; equal keys of 8 are equal so far, with bytes left in both."""
    key = words[offs].astype(np.uint64)
    key &= _TOP_BYTES[np.minimum(rem, 7)]
    key |= np.minimum(rem, 8).astype(np.uint64)
    return key


def _leading_zero_bytes(x: np.ndarray) -> np.ndarray:
    out = (x < _BELOW[0]).view(np.uint8).copy()
    for below in _BELOW[1:]:
        out += (x < below).view(np.uint8)
    return out


def _sort_tokens(flat: np.ndarray, offs: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(perm, lcp): the tokens `flat[offs[i] : offs[i] + lens[i]]` in byte order, and the length of the common
    prefix of each sorted token with the one before it (0 for the first). `flat` ends with 8 padding bytes."""
    n = offs.shape[0]
    # Every 8-byte window of the buffer as one big-endian word (unaligned strided view): one gather reads a chunk.
    words = np.ndarray(shape=(flat.shape[0] - 7,), dtype=">u8", buffer=flat, strides=(1,))
    key = _chunk_keys(words, offs, lens)
    perm = np.argsort(key)  # not stable: equal keys are equal tokens, or are ordered by the next chunk below
    key = key[perm]
    lcp = np.zeros(n, dtype=np.int32)
    pos = grp = None  # positions (in perm) still tied, and the id of each one's group of equal chunks so far
    r = 0
    while True:
        diff = key[1:] ^ key[:-1]
        chunk_len = (key & 255).astype(np.uint8)
        common = np.minimum(_leading_zero_bytes(diff), np.minimum(chunk_len[1:], chunk_len[:-1]))
        tie = (diff == 0) & (chunk_len[1:] == 8)
        if grp is None:
            lcp[1:] = common
        else:
            same_grp = grp[1:] == grp[:-1]
            tie &= same_grp
            decided = np.flatnonzero(same_grp & ~tie)
            lcp[pos[1:][decided]] = common[decided] + np.int32(7 * r)
        if not tie.any():
            return perm, lcp
        # Groups of tied neighbours: sort each by its next chunk, in place.
        in_tie = np.zeros(tie.shape[0] + 1, dtype=bool)
        in_tie[1:] = tie
        in_tie[:-1] |= tie
        sel = np.flatnonzero(in_tie)
        starts = np.ones(tie.shape[0] + 1, dtype=bool)
        starts[1:] = ~tie
        starts = starts[sel]
        n_groups = int(np.count_nonzero(starts))
        grp = np.cumsum(starts, dtype=np.uint16 if n_groups < 2**16 else np.int32)  # uint16: a radix sort below
        pos = sel if pos is None else pos[sel]
        r += 1
        toks = perm[pos]
        key = _chunk_keys(words, offs[toks] + 7 * r, lens[toks] - 7 * r)
        o = np.argsort(key)
        o = o[np.argsort(grp[o], kind="stable")]  # grp is nondecreasing along pos: groups keep their positions
        perm[pos] = toks[o]
        key = key[o]


def _concat(token_bytes: tuple[bytes, ...]) -> bytes:
    """All tokens' bytes, then 8 zero bytes of padding."""
    # b"".join takes one 80-byte Py_buffer per item (CPython's stringlib/join.h): 10-20 MB at once for a whole
    # vocabulary, fresh pages in a new process (~10 ms of page faults on Llama 3). 4096 tokens at a time reuse 320 KB.
    step = 4096
    return b"".join([*(b"".join(token_bytes[i : i + step]) for i in range(0, len(token_bytes), step)), bytes(8)])


def _lengths(token_bytes: tuple[bytes, ...]) -> np.ndarray:
    try:  # one byte per length: faster than np.fromiter when no token is 256 bytes or longer
        return np.frombuffer(bytes(map(len, token_bytes)), dtype=np.uint8).astype(np.int32)
    except ValueError:
        return np.fromiter(map(len, token_bytes), dtype=np.int32, count=len(token_bytes))


def _byte_tokens(vocab: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(every token's length (int32), all tokens' bytes then 8 zero bytes (uint8), the ids of the tokens in the trie:
    not special, not EOS, not empty (int32, ascending))."""
    token_bytes = vocab.token_bytes
    lens = _lengths(token_bytes)
    flat = np.frombuffer(_concat(token_bytes), dtype=np.uint8)
    usable = lens > 0
    usable[[int(t) for t in (*vocab.special_ids, *vocab.eos_ids) if 0 <= int(t) < len(token_bytes)]] = False
    return lens, flat, np.flatnonzero(usable).astype(np.int32)


def _build_trie(vocab: Any) -> _Trie:
    """The trie of `vocab`'s byte tokens (neither special nor EOS nor empty): in C where the library builds
    (`_build_trie_native`), else in numpy (`_build_trie_numpy`); the two give equal arrays (tests/test_trie.py)."""
    lib = _native()
    return _build_trie_numpy(vocab) if lib is None else _build_trie_native(vocab, lib)


def _build_trie_numpy(vocab: Any) -> _Trie:
    # The tokens are sorted once (7-byte chunks as integer keys, ties broken chunk by chunk), so each token's new
    # nodes are its prefixes longer than the common prefix with the previous token. Those nodes are made as "items",
    # token by token, and one stable sort by depth puts them in breadth-first order. No per-token Python loop, no
    # per-depth loop; int32 temporaries, freed early (a fresh process keeps about the peak as RSS).
    # (bench_engine.py --prep-only: 0.45-0.60x xgrammar's time; depth by depth with np.unique, it was 1.04-1.20x.)
    # The fallback where the C builder cannot be built (`_build_trie_native`, which gives equal arrays).
    lens_all, flat, ids = _byte_tokens(vocab)
    idx = np.int32 if flat.shape[0] < 2**31 else np.int64  # byte offsets
    offs_all = np.zeros(lens_all.shape[0], dtype=idx)
    if lens_all.shape[0]:
        np.cumsum(lens_all[:-1], out=offs_all[1:])
    n = int(ids.shape[0])
    if n == 0:
        none = np.zeros(0, dtype=np.int32)
        return _Trie(np.zeros(0, dtype=np.uint8), none, none, none, none, none, none, none, (0,))
    lens, offs = lens_all[ids], offs_all[ids]
    del lens_all, offs_all
    perm, lcp = _sort_tokens(flat, offs, lens)
    length = lens[perm]
    offs = offs[perm]
    del lens
    max_depth = int(length.max())

    # Items, sorted token by sorted token: its new nodes (depths lcp+1 .. length), preceded by a "query" item at
    # depth lcp when 0 < lcp < length. Sorted stably by depth, a query lands right after the last node of its depth
    # made by an earlier token: the node on the previous token's path, the parent of the token's first new node.
    query = (lcp > 0) & (lcp < length)
    n_own = length - lcp
    n_own += query  # items of each token (0: an exact duplicate of the previous token)
    item_end = np.cumsum(n_own, dtype=np.int32)
    n_items = int(item_end[-1])
    owns = n_own > 0
    first = (item_end - n_own)[owns]
    query_at = (item_end - n_own)[query]
    del n_own
    d_first = (lcp + 1 - query)[owns]
    d_last = length[owns]
    # Depth and byte offset of every item: +1 from one item to the next, reset at each token's first item.
    dt = np.uint8 if max_depth < 256 else np.uint16 if max_depth < 65536 else np.int32  # radix sort below 2**16
    depth = np.ones(n_items, dtype=dt)
    depth[first] = (d_first - np.concatenate(([0], d_last[:-1]))).astype(dt)  # may wrap: the sum is modular
    np.cumsum(depth, dtype=dt, out=depth)
    o_first = offs[owns] + (d_first - 1)
    item_off = np.ones(n_items, dtype=idx)
    item_off[first] = o_first - np.concatenate(([0], o_first[:-1] + (d_last[:-1] - d_first[:-1])))
    np.cumsum(item_off, dtype=idx, out=item_off)
    del first, d_first, d_last, o_first, offs
    order = np.argsort(depth, kind="stable")
    del depth
    is_node = np.ones(n_items, dtype=bool)
    is_node[query_at] = False
    node_in_order = is_node[order]
    del is_node, query_at
    gid = np.cumsum(node_in_order, dtype=np.int32)
    gid -= 1
    gid[order] = gid.copy()  # an item's global id if it is a node; a query's: its parent's
    nodes = order[node_in_order].astype(np.int32)  # item of each node, by global id
    del order, node_in_order
    n_nodes = int(nodes.shape[0])
    at_least = np.cumsum(np.bincount(length, minlength=max_depth + 1)[::-1])[::-1]  # tokens with length >= d
    above = np.cumsum(np.bincount(lcp, minlength=max_depth + 1)[::-1])[::-1]  # tokens with lcp >= d
    per_depth = (at_least - above)[1:]
    depth_start = np.zeros(max_depth + 1, dtype=np.int64)
    np.cumsum(per_depth, out=depth_start[1:])

    node_byte = flat[item_off[nodes]]
    del item_off
    n1 = int(depth_start[1])
    nodes[n1:] -= 1
    parent_local = np.zeros(n_nodes, dtype=np.int32)
    parent_local[n1:] = gid[nodes[n1:]]  # the item before a deeper node is its parent, or its token's query
    del nodes
    child_count = np.bincount(parent_local[n1:], minlength=n_nodes).astype(np.int32)
    parent_local[n1:] -= np.repeat(depth_start[:-2].astype(np.int32), per_depth[1:])
    child_start = np.zeros(n_nodes, dtype=np.int32)
    inner = int(depth_start[max_depth - 1])  # nodes above the deepest depth (that one keeps zeros)
    if inner:
        np.cumsum(child_count[: inner - 1], out=child_start[1:inner])
        child_start[:inner] += n1

    # End node of each sorted token: its last item's, or (an exact duplicate) the previous token's.
    src = np.maximum.accumulate(np.where(owns, np.arange(n, dtype=np.int32), 0))
    end = gid[item_end - 1][src]
    del gid, item_end
    term_count = np.bincount(end, minlength=n_nodes).astype(np.int32)
    term_start = np.zeros(n_nodes, dtype=np.int32)
    np.cumsum(term_count[:-1], out=term_start[1:])
    slot = term_start[end] + (np.arange(n, dtype=np.int32) - src)
    term_tokens = np.empty(n, dtype=np.int32)
    term_tokens[slot] = ids[perm]
    term_node = np.empty(n, dtype=np.int32)
    term_node[slot] = end
    shared = np.flatnonzero(term_count[term_node] > 1)  # equal tokens: ascending ids under their end node
    if shared.shape[0]:
        term_tokens[shared] = term_tokens[shared][np.lexsort((term_tokens[shared], term_node[shared]))]
    return _Trie(
        node_byte=node_byte,
        parent_local=parent_local,
        child_start=child_start,
        child_count=child_count,
        term_start=term_start,
        term_count=term_count,
        term_tokens=term_tokens,
        term_node=term_node,
        depth_start=tuple(depth_start.tolist()),
    )


# The same trie in C. The byte tokens are put in order of their first two bytes by counting (one pass over them in
# id order), and their bytes copied in that order into one buffer: from there each run of equal first bytes is
# sorted by a multikey quicksort (Bentley and Sedgewick: three-way partitions on the byte at one depth, a token that
# ends sorting first) and read in sorted order within a small part of the buffer. Gemma 4's trie (262k tokens, 600k
# nodes), same process, medians of 5: 65-74 ms, against 89-102 reading each token where the vocabulary keeps it (a
# cache miss a token at every pass in sorted order: the common prefixes alone took 30-48 ms) and 100-120 in numpy.
# One pass in sorted order then makes each token's new nodes (its prefixes longer than its common prefix with the
# token before it) at their breadth-first ids: within a depth, nodes come in the sorted order of their paths, the
# order `_Trie` numbers them in.
_SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef struct { const uint8_t *flat; const int64_t *offs; const int32_t *lens; } toks;

/* byte d of token t, or -1 past its end (a token that ends sorts before its extensions) */
static inline int byte_at(const toks *k, int32_t t, int32_t d) {
    return d < k->lens[t] ? (int)k->flat[k->offs[t] + d] : -1;
}

/* tokens x and y compared from byte d on (both equal before it) */
static int compare_from(const toks *k, int32_t x, int32_t y, int32_t d) {
    int32_t lx = k->lens[x], ly = k->lens[y], m = (lx < ly ? lx : ly) - d;
    if (m > 0) {
        int r = memcmp(k->flat + k->offs[x] + d, k->flat + k->offs[y] + d, (size_t)m);
        if (r) return r;
    }
    return (lx > ly) - (lx < ly);
}

static void sort_tokens(const toks *k, int32_t *a, int64_t n, int32_t d) {
    while (n > 1) {
        if (n < 16) {  /* insertion sort of a short run */
            for (int64_t i = 1; i < n; i++) {
                int32_t x = a[i];
                int64_t j = i;
                while (j > 0 && compare_from(k, a[j - 1], x, d) > 0) { a[j] = a[j - 1]; j--; }
                a[j] = x;
            }
            return;
        }
        int p0 = byte_at(k, a[0], d), p1 = byte_at(k, a[n / 2], d), p2 = byte_at(k, a[n - 1], d);
        int v = p0 < p1 ? (p1 < p2 ? p1 : (p0 < p2 ? p2 : p0)) : (p0 < p2 ? p0 : (p1 < p2 ? p2 : p1));
        int64_t lt = 0, i = 0, gt = n;
        while (i < gt) {  /* [0, lt) below v, [lt, i) equal, [gt, n) above */
            int c = byte_at(k, a[i], d);
            if (c < v) { int32_t x = a[lt]; a[lt++] = a[i]; a[i++] = x; }
            else if (c > v) { int32_t x = a[--gt]; a[gt] = a[i]; a[i] = x; }
            else i++;
        }
        /* the three parts: recurse into the two smaller ones, loop on the largest (a stack of log2(n) frames) */
        int64_t start[3] = {0, lt, gt}, size[3] = {lt, gt - lt, n - gt};
        int32_t depth[3] = {d, d + 1, d};
        if (v < 0) size[1] = 0;  /* tokens that all end here are equal */
        int big = size[0] >= size[1] ? (size[0] >= size[2] ? 0 : 2) : (size[1] >= size[2] ? 1 : 2);
        for (int q = 0; q < 3; q++)
            if (q != big && size[q] > 1) sort_tokens(k, a + start[q], size[q], depth[q]);
        a += start[big];
        n = size[big];
        d = depth[big];
    }
}

/* the first two bytes of token t as one key: 257 values a byte, 0 past the end */
static inline int32_t head2(const toks *k, int32_t t) {
    return (byte_at(k, t, 0) + 1) * 257 + byte_at(k, t, 1) + 1;
}

/* Sort the n byte tokens `ids` (ascending ids). Out: `order` the token ids sorted by their bytes; `local` the same
   tokens as positions in `sbytes`/`soffs`/`slens` (their bytes copied, `sbytes` holding the lengths' sum); `lcp` the
   common prefix of each with the one before it; depth_count[1 .. max_depth] the nodes of each depth. Scratch:
   `bucket`, 257 * 257 + 1 counts. depth_count and bucket come zeroed, the others are written whole. Returns the
   node count. */
int64_t constrain_trie_sort(const uint8_t *flat, const int64_t *offs, const int32_t *lens, const int32_t *ids,
                            int64_t n, int32_t *order, int32_t *local, uint8_t *sbytes, int64_t *soffs, int32_t *slens,
                            int32_t *lcp, int64_t *depth_count, int64_t *bucket) {
    toks k = {flat, offs, lens};
    for (int64_t i = 0; i < n; i++) {
        lcp[i] = head2(&k, ids[i]);  /* (lcp's room holds the heads until the end) */
        bucket[lcp[i] + 1]++;
    }
    for (int32_t b = 0; b < 257 * 257; b++) bucket[b + 1] += bucket[b];
    for (int64_t i = 0; i < n; i++) order[bucket[lcp[i]]++] = ids[i];
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {  /* the bytes in that order */
        int32_t t = order[i];
        memcpy(sbytes + at, flat + offs[t], (size_t)lens[t]);
        soffs[i] = at;
        slens[i] = lens[t];
        at += lens[t];
        local[i] = (int32_t)i;
    }
    toks s = {sbytes, soffs, slens};
    /* bucket[h] is now where the run of head h ends; a run of h % 257 == 0 holds tokens of at most one byte, equal */
    for (int64_t h = 0, lo = 0; h < 257 * 257; lo = bucket[h++])
        if (bucket[h] - lo > 1 && h % 257 != 0) sort_tokens(&s, local + lo, bucket[h] - lo, 2);
    int64_t nodes = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t l = 0, t = local[i], len = slens[t];
        if (i) {
            int32_t u = local[i - 1], m = slens[u] < len ? slens[u] : len;
            const uint8_t *x = sbytes + soffs[t], *y = sbytes + soffs[u];
            while (l < m && x[l] == y[l]) l++;
        }
        lcp[i] = l;
        depth_count[l + 1]++;  /* nodes at depths l + 1 .. len: counted as differences, summed below */
        depth_count[len + 1]--;
        nodes += len - l;
    }
    return nodes;
}

/* The trie's arrays (see `_Trie`) from `constrain_trie_sort`'s outputs; depth_start[d] = nodes of depth <= d. The
   arrays come zeroed; path and fill hold max_depth + 1 entries, end n. */
void constrain_trie_fill(const int32_t *order, const int32_t *local, const uint8_t *sbytes, const int64_t *soffs,
                         const int32_t *slens, int64_t n, const int32_t *lcp, const int64_t *depth_start,
                         int32_t max_depth, uint8_t *node_byte, int32_t *parent_local, int32_t *child_start,
                         int32_t *child_count, int32_t *term_start, int32_t *term_count, int32_t *term_tokens,
                         int32_t *term_node, int32_t *path, int64_t *fill, int32_t *end) {
    for (int64_t i = 0; i < n; i++) {
        int32_t t = local[i], len = slens[t];
        const uint8_t *x = sbytes + soffs[t];
        for (int32_t d = lcp[i] + 1; d <= len; d++) {
            int32_t g = (int32_t)(depth_start[d - 1] + fill[d]++);
            node_byte[g] = x[d - 1];
            if (d > 1) {
                parent_local[g] = (int32_t)(path[d - 1] - depth_start[d - 2]);
                child_count[path[d - 1]]++;
            }
            path[d] = g;
        }
        end[i] = path[len];
        term_count[path[len]]++;
    }
    int64_t n_nodes = depth_start[max_depth];
    if (max_depth > 1) {  /* the deepest depth keeps zeros */
        int64_t inner = depth_start[max_depth - 1], at = depth_start[1];
        for (int64_t g = 0; g < inner; g++) { child_start[g] = (int32_t)at; at += child_count[g]; }
    }
    int64_t at = 0;
    for (int64_t g = 0; g < n_nodes; g++) { term_start[g] = (int32_t)at; at += term_count[g]; }
    int32_t run = 0;  /* equal tokens are neighbours in sorted order and share their end node */
    for (int64_t i = 0; i < n; i++) {
        int32_t g = end[i], slot = term_start[g] + run;
        term_tokens[slot] = order[local[i]];
        term_node[slot] = g;
        if (i + 1 < n && end[i + 1] == g) { run++; continue; }
        for (int32_t s = term_start[g] + 1; s <= slot; s++) {  /* the run's ids ascending */
            int32_t x = term_tokens[s], j = s;
            while (j > term_start[g] && term_tokens[j - 1] > x) { term_tokens[j] = term_tokens[j - 1]; j--; }
            term_tokens[j] = x;
        }
        run = 0;
    }
}
"""
_NATIVE: dict[str, Any] = {}


def _native() -> Any:
    """The C trie builder (its ctypes functions typed), built on first use; None where it cannot be built."""
    if "lib" not in _NATIVE:
        with _TRIE_LOCK:
            if "lib" not in _NATIVE:
                lib = cbuild.build("trie", _SOURCE, fallback="building token tries with numpy")
                if lib is not None:
                    p, i64 = ctypes.c_void_p, ctypes.c_int64
                    lib.constrain_trie_sort.argtypes = [p, p, p, p, i64] + [p] * 8
                    lib.constrain_trie_sort.restype = i64
                    lib.constrain_trie_fill.argtypes = [p] * 5 + [i64, p, p, ctypes.c_int32] + [p] * 11
                    lib.constrain_trie_fill.restype = None
                _NATIVE["lib"] = lib
    return _NATIVE["lib"]


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _build_trie_native(vocab: Any, lib: Any) -> _Trie:
    lens, flat, ids = _byte_tokens(vocab)
    offs = np.zeros(lens.shape[0], dtype=np.int64)
    if lens.shape[0]:
        np.cumsum(lens[:-1], out=offs[1:])
    n = int(ids.shape[0])
    trie_lens = lens[ids]
    max_depth = int(trie_lens.max()) if n else 0
    order, local, lcp, slens = (np.empty(n, dtype=np.int32) for _ in range(4))
    sbytes, soffs = np.empty(int(trie_lens.sum()), dtype=np.uint8), np.empty(n, np.int64)
    depth_count, bucket = np.zeros(max_depth + 2, dtype=np.int64), np.zeros(257 * 257 + 1, dtype=np.int64)
    n_nodes = lib.constrain_trie_sort(_ptr(flat), _ptr(offs), _ptr(lens), _ptr(ids), n, _ptr(order), _ptr(local),
                                      _ptr(sbytes), _ptr(soffs), _ptr(slens), _ptr(lcp), _ptr(depth_count),
                                      _ptr(bucket))
    depth_start = np.cumsum(np.cumsum(depth_count[: max_depth + 1]))  # (per-depth differences, then counts)
    arrays = [np.zeros(n_nodes, dtype=np.uint8)] + [np.zeros(n_nodes, dtype=np.int32) for _ in range(5)]
    terms = [np.zeros(n, dtype=np.int32) for _ in range(2)]
    path, fill, end = np.zeros(max_depth + 1, np.int32), np.zeros(max_depth + 1, np.int64), np.zeros(n, np.int32)
    lib.constrain_trie_fill(_ptr(order), _ptr(local), _ptr(sbytes), _ptr(soffs), _ptr(slens), n, _ptr(lcp),
                            _ptr(depth_start), max_depth, *(_ptr(a) for a in arrays + terms), _ptr(path), _ptr(fill),
                            _ptr(end))
    node_byte, parent_local, child_start, child_count, term_start, term_count = arrays
    return _Trie(node_byte=node_byte, parent_local=parent_local, child_start=child_start, child_count=child_count,
                 term_start=term_start, term_count=term_count, term_tokens=terms[0], term_node=terms[1],
                 depth_start=tuple(depth_start.tolist()))


_TRIE_CACHE: OrderedDict[str, _Trie] = OrderedDict()
_TRIE_CACHE_SIZE = 4
_TRIE_LOCK = threading.Lock()


def _trie_for(vocab: Any) -> _Trie:
    key = vocab.fingerprint
    with _TRIE_LOCK:
        trie = _TRIE_CACHE.get(key)
        if trie is not None:
            _TRIE_CACHE.move_to_end(key)
            return trie
    trie = _build_trie(vocab)  # outside the lock: two racing builds give equal tries
    with _TRIE_LOCK:
        _TRIE_CACHE[key] = trie
        _TRIE_CACHE.move_to_end(key)
        while len(_TRIE_CACHE) > _TRIE_CACHE_SIZE:
            _TRIE_CACHE.popitem(last=False)
    return trie
