"""Byte trie of a vocabulary's tokens, breadth-first in numpy arrays; built once per vocabulary (cached)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np



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
    parent_local: np.ndarray  # intp [n_nodes]
    child_start: np.ndarray  # intp [n_nodes]
    child_count: np.ndarray  # intp [n_nodes]
    term_start: np.ndarray  # intp [n_nodes]
    term_count: np.ndarray  # intp [n_nodes]
    term_tokens: np.ndarray  # intp [n_byte_tokens], token ids grouped by end node
    term_node: np.ndarray  # intp [n_byte_tokens]
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


def _byte_token_ids(vocab: Any) -> list[int]:
    """Ids whose bytes a byte DFA may consume: not special, not EOS, and with non-empty bytes."""
    excluded = set(vocab.special_ids) | set(vocab.eos_ids)
    return [t for t, data in enumerate(vocab.token_bytes) if data and t not in excluded]


def _build_trie(vocab: Any) -> _Trie:
    token_bytes = vocab.token_bytes
    ids = sorted(_byte_token_ids(vocab), key=token_bytes.__getitem__)  # stable: equal bytes keep id order
    spelled = [token_bytes[t] for t in ids]
    # Tokens with identical bytes share one trie path (and so one end node).
    first = [True] + [a != b for a, b in zip(spelled, spelled[1:])]
    uniq = [data for data, f in zip(spelled, first) if f]
    uniq_of_sorted = np.cumsum(np.asarray(first, dtype=np.intp)) - 1
    n = len(uniq)
    lens = np.fromiter((len(u) for u in uniq), dtype=np.intp, count=n)
    flat = np.frombuffer(b"".join(uniq), dtype=np.uint8)
    offs = np.zeros(n, dtype=np.intp)
    if n:
        np.cumsum(lens[:-1], out=offs[1:])
    max_depth = int(lens.max()) if n else 0

    cur_node = np.zeros(n, dtype=np.intp)  # node of each string's prefix at the current depth
    end_node = np.full(n, -1, dtype=np.intp)
    bytes_per_depth: list[np.ndarray] = []
    parents_per_depth: list[np.ndarray] = []  # global id of each node's parent
    base = 0
    idx = np.arange(n, dtype=np.intp)
    for d in range(1, max_depth + 1):
        idx = idx[lens[idx] >= d]
        b = flat[offs[idx] + (d - 1)]
        par = cur_node[idx] if d > 1 else np.zeros(idx.shape[0], dtype=np.intp)
        # Sorted order keeps every prefix class contiguous, so comparing with the previous survivor suffices.
        new = np.ones(idx.shape[0], dtype=bool)
        new[1:] = (par[1:] != par[:-1]) | (b[1:] != b[:-1])
        local = np.cumsum(new) - 1
        gid = base + local
        bytes_per_depth.append(b[new])
        parents_per_depth.append(par[new])
        cur_node[idx] = gid
        ending = lens[idx] == d
        end_node[idx[ending]] = gid[ending]
        base += int(new.sum())

    n_nodes = base
    node_byte = np.concatenate(bytes_per_depth) if bytes_per_depth else np.zeros(0, np.uint8)
    child_start = np.zeros(n_nodes, dtype=np.intp)
    child_count = np.zeros(n_nodes, dtype=np.intp)
    depth_base = 0
    for d in range(1, max_depth):
        n_here = bytes_per_depth[d - 1].shape[0]
        child_par = parents_per_depth[d]  # nondecreasing global ids of depth-d nodes
        nodes_here = np.arange(depth_base, depth_base + n_here, dtype=np.intp)
        left = np.searchsorted(child_par, nodes_here, side="left")
        right = np.searchsorted(child_par, nodes_here, side="right")
        child_start[depth_base : depth_base + n_here] = depth_base + n_here + left
        child_count[depth_base : depth_base + n_here] = right - left
        depth_base += n_here

    token_arr = np.asarray(ids, dtype=np.intp)
    token_node = end_node[uniq_of_sorted] if n else np.zeros(0, np.intp)
    order = np.argsort(token_node, kind="stable")
    term_tokens = token_arr[order]
    term_count = np.bincount(token_node, minlength=n_nodes).astype(np.intp)
    term_start = np.zeros(n_nodes, dtype=np.intp)
    if n_nodes:
        np.cumsum(term_count[:-1], out=term_start[1:])
    depth_start = [0]
    parent_local = [np.zeros(bytes_per_depth[0].shape[0], dtype=np.intp)] if bytes_per_depth else []
    for d, b in enumerate(bytes_per_depth):
        if d:
            parent_local.append((parents_per_depth[d] - depth_start[d - 1]).astype(np.intp))
        depth_start.append(depth_start[-1] + int(b.shape[0]))
    return _Trie(
        node_byte=node_byte,
        parent_local=np.concatenate(parent_local) if parent_local else np.zeros(0, np.intp),
        child_start=child_start,
        child_count=child_count,
        term_start=term_start,
        term_count=term_count,
        term_tokens=term_tokens,
        term_node=token_node[order],
        depth_start=tuple(depth_start),
    )


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
