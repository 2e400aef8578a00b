"""Bounded LRU cache of compiled token indexes, keyed by (vocabulary fingerprint, constraint key)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from constrain.errors import InternalError
from constrain.index import TokenIndex

__all__ = ["DEFAULT_CACHE", "CacheStats", "IndexCache", "get_or_build"]


@dataclass(frozen=True)
class CacheStats:
    """A consistent snapshot of an `IndexCache`: kept entries, their estimated bytes, and lifetime counters."""

    entries: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int


class IndexCache:
    """LRU cache of `TokenIndex` objects keyed by (vocab.fingerprint, constraint key), bounded by estimated bytes.

    Thread-safe. Sizes are re-estimated on every lookup because lazy indexes grow as rows are filled. An index larger
    than `max_bytes` on its own is returned but not kept.

    Args:
        max_bytes: the bound on the sum of `TokenIndex.nbytes()` over kept entries.
    """

    def __init__(self, max_bytes: int = 1 << 30):
        if max_bytes < 0:
            raise InternalError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[tuple[str, str], TokenIndex] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: tuple[str, str]) -> bool:
        with self._lock:
            return key in self._entries

    def nbytes(self) -> int:
        """Current estimate of the bytes held by all kept entries."""
        with self._lock:
            return sum(index.nbytes() for index in self._entries.values())

    def stats(self) -> CacheStats:
        """Entries, bytes (re-estimated now), the bound, and the hit/miss/eviction counters, taken under one lock."""
        with self._lock:
            return CacheStats(
                entries=len(self._entries),
                bytes=sum(index.nbytes() for index in self._entries.values()),
                max_bytes=self.max_bytes,
                hits=self.hits,
                misses=self.misses,
                evictions=self.evictions,
            )

    def clear(self) -> None:
        """Drop every entry (statistics are kept)."""
        with self._lock:
            self._entries.clear()

    def get_or_build(
        self, key: str, vocab: Any, build: Callable[[], Any], *, eager: bool = False
    ) -> TokenIndex:
        """The cached index for (`vocab.fingerprint`, `key`), or a new `TokenIndex(build(), vocab, eager=eager)`
        (its prefill on a worker thread: `background=True`).

        `key` must identify the constraint completely (e.g. a hash of the canonical grammar); `eager` is not part of
        the key. Building happens outside the lock; two racing misses build twice and keep the first.

        Raises:
            Whatever `build` or `TokenIndex` raise; nothing is cached then.
        """
        full = (vocab.fingerprint, key)
        with self._lock:
            index = self._entries.get(full)
            if index is not None:
                self.hits += 1
                self._entries.move_to_end(full)
                self._evict()
                return index
            self.misses += 1
        index = TokenIndex(build(), vocab, eager=eager, background=True)
        with self._lock:
            existing = self._entries.get(full)
            if existing is not None:
                self._entries.move_to_end(full)
                return existing
            self._entries[full] = index
            self._evict()
        return index

    def _evict(self) -> None:
        sizes = {k: v.nbytes() for k, v in self._entries.items()}
        total = sum(sizes.values())
        while total > self.max_bytes and self._entries:
            k, _ = self._entries.popitem(last=False)
            total -= sizes[k]
            self.evictions += 1


DEFAULT_CACHE = IndexCache()


def get_or_build(key: str, vocab: Any, build: Callable[[], Any], *, eager: bool = False) -> TokenIndex:
    """`DEFAULT_CACHE.get_or_build(key, vocab, build, eager=eager)`: the process-wide index cache (1 GiB bound)."""
    return DEFAULT_CACHE.get_or_build(key, vocab, build, eager=eager)
