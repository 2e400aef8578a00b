"""The dense CPU mask pass in C: a contiguous logits row and its packed mask words → each blocked element set to -inf.

The source below is built once per machine with the system C compiler (as inductor builds its CPU kernels) and loaded
with ctypes; `load()` returns None where that fails, and callers fall back to `constrain_kernels.cpu_mask`'s compiled torch pass.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

from constrain_kernels import cbuild

__all__ = ["NativePass", "load"]

# On x86-64 with AVX-512 (F + BW) each 16 (32) mask bits are the mask register of one masked store of the -inf pattern:
# allowed elements are not even read. Elsewhere a branchless blend that compilers vectorize (built for AVX2 too, picked
# at run time). All run on the calling thread (no OpenMP: a thread pool stalls on a busy machine,
# `benchmarks/bench_kernel.py`).
_SOURCE = r"""
#include <stdint.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CONSTRAIN_X86 1
#endif

static const uint32_t BIT[32] = {
    1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7, 1u << 8, 1u << 9, 1u << 10, 1u << 11,
    1u << 12, 1u << 13, 1u << 14, 1u << 15, 1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22,
    1u << 23, 1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31};

/* x[t] = neg for every t < width whose bit t % 32 of words[t / 32] is 0: a branchless blend per word that compilers
   vectorize (a constant bit table, not per-lane shifts, which SSE2 lacks). */
#define BLOCK_BODY(T)                                                                                     \
    int64_t full = width >> 5;                                                                            \
    for (int64_t i = 0; i < full; i++) {                                                                  \
        uint32_t m = words[i];                                                                            \
        if (m == 0xFFFFFFFFu) continue;                                                                   \
        T *p = x + (i << 5);                                                                              \
        for (int j = 0; j < 32; j++) {                                                                    \
            T keep = (m & BIT[j]) ? (T)~(T)0 : (T)0;                                                      \
            p[j] = (T)((p[j] & keep) | (neg & (T)~keep));                                                 \
        }                                                                                                 \
    }                                                                                                     \
    for (int64_t t = full << 5; t < width; t++)                                                           \
        if (!((words[t >> 5] >> (t & 31)) & 1u)) x[t] = neg;

static void block32_generic(uint32_t *x, const uint32_t *words, int64_t width, uint32_t neg) { BLOCK_BODY(uint32_t) }
static void block16_generic(uint16_t *x, const uint32_t *words, int64_t width, uint16_t neg) { BLOCK_BODY(uint16_t) }

#ifdef CONSTRAIN_X86
__attribute__((target("avx2")))
static void block32_avx2(uint32_t *x, const uint32_t *words, int64_t width, uint32_t neg) { BLOCK_BODY(uint32_t) }
__attribute__((target("avx2")))
static void block16_avx2(uint16_t *x, const uint32_t *words, int64_t width, uint16_t neg) { BLOCK_BODY(uint16_t) }
#endif

#ifdef CONSTRAIN_X86
__attribute__((target("avx512f")))
static void block32_avx512(uint32_t *x, const uint32_t *words, int64_t width, uint32_t neg) {
    const __m512i v = _mm512_set1_epi32((int)neg);
    int64_t full = width >> 5;
    for (int64_t i = 0; i < full; i++) {
        uint32_t m = ~words[i];
        if (!m) continue;
        _mm512_mask_storeu_epi32(x + (i << 5), (__mmask16)(m & 0xFFFFu), v);
        _mm512_mask_storeu_epi32(x + (i << 5) + 16, (__mmask16)(m >> 16), v);
    }
    int rest = (int)(width & 31);
    if (rest) {
        uint32_t m = ~words[full] & ((1u << rest) - 1u);
        _mm512_mask_storeu_epi32(x + (full << 5), (__mmask16)(m & 0xFFFFu), v);
        if (rest > 16) _mm512_mask_storeu_epi32(x + (full << 5) + 16, (__mmask16)(m >> 16), v);
    }
}

__attribute__((target("avx512f,avx512bw")))
static void block16_avx512(uint16_t *x, const uint32_t *words, int64_t width, uint16_t neg) {
    const __m512i v = _mm512_set1_epi16((short)neg);
    int64_t full = width >> 5;
    for (int64_t i = 0; i < full; i++) {
        uint32_t m = ~words[i];
        if (m) _mm512_mask_storeu_epi16(x + (i << 5), (__mmask32)m, v);
    }
    int rest = (int)(width & 31);
    if (rest) _mm512_mask_storeu_epi16(x + (full << 5), (__mmask32)(~words[full] & ((1u << rest) - 1u)), v);
}
#endif

#ifdef CONSTRAIN_X86
__attribute__((target("avx512f")))
static void fill32_avx512(uint32_t *x, int64_t from, int64_t to, uint32_t v) {
    const __m512i z = _mm512_set1_epi32((int)v);
    int64_t t = from;
    for (; t + 16 <= to; t += 16) _mm512_storeu_si512((void *)(x + t), z);
    if (t < to) _mm512_mask_storeu_epi32(x + t, (__mmask16)((1u << (to - t)) - 1u), z);
}

__attribute__((target("avx512f,avx512bw")))
static void fill16_avx512(uint16_t *x, int64_t from, int64_t to, uint16_t v) {
    const __m512i z = _mm512_set1_epi16((short)v);
    int64_t t = from;
    for (; t + 32 <= to; t += 32) _mm512_storeu_si512((void *)(x + t), z);
    if (t < to) _mm512_mask_storeu_epi16(x + t, (__mmask32)((1ull << (to - t)) - 1u), z);
}
#endif

#ifdef CONSTRAIN_X86
__attribute__((target("avx2")))
static void fill32_avx2(uint32_t *x, int64_t from, int64_t to, uint32_t v) { for (int64_t t = from; t < to; t++) x[t] = v; }
__attribute__((target("avx2")))
static void fill16_avx2(uint16_t *x, int64_t from, int64_t to, uint16_t v) { for (int64_t t = from; t < to; t++) x[t] = v; }
#endif

static inline void fill32(uint32_t *x, int64_t from, int64_t to, uint32_t v, int isa) {
#ifdef CONSTRAIN_X86
    if (isa == 2 && to - from >= 16) { fill32_avx512(x, from, to, v); return; }
    if (isa == 1 && to - from >= 16) { fill32_avx2(x, from, to, v); return; }
#endif
    for (int64_t t = from; t < to; t++) x[t] = v;
}

static inline void fill16(uint16_t *x, int64_t from, int64_t to, uint16_t v, int isa) {
#ifdef CONSTRAIN_X86
    if (isa == 2 && to - from >= 32) { fill16_avx512(x, from, to, v); return; }
    if (isa == 1 && to - from >= 32) { fill16_avx2(x, from, to, v); return; }
#endif
    for (int64_t t = from; t < to; t++) x[t] = v;
}

/* 2 when the AVX-512 (F + BW) paths can run here, 1 for AVX2, else 0. */
int constrain_native_isa(void) {
#ifdef CONSTRAIN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return 2;
    if (__builtin_cpu_supports("avx2")) return 1;
#endif
    return 0;
}

void constrain_block32(uint32_t *x, const uint32_t *words, int64_t width, uint32_t neg, int isa) {
#ifdef CONSTRAIN_X86
    if (isa == 2) { block32_avx512(x, words, width, neg); return; }
    if (isa == 1) { block32_avx2(x, words, width, neg); return; }
#endif
    block32_generic(x, words, width, neg);
}

void constrain_block16(uint16_t *x, const uint32_t *words, int64_t width, uint16_t neg, int isa) {
#ifdef CONSTRAIN_X86
    if (isa == 2) { block16_avx512(x, words, width, neg); return; }
    if (isa == 1) { block16_avx2(x, words, width, neg); return; }
#endif
    block16_generic(x, words, width, neg);
}

/* One logits row of `vocab` elements under one row plan (kernels.cpu_mask.RowPlan): kind 0 allows only the ascending
   `ids`, kind 1 blocks the `ids`, kind 2 applies `words`; every element from `width` on is blocked too. */
static void apply_row(void *x, int64_t vocab, int element_bits, uint32_t neg, int kind, const int64_t *ids,
                      int64_t n_ids, const uint32_t *words, int64_t width, int isa) {
    if (element_bits == 32) {
        uint32_t *y = (uint32_t *)x;
        if (kind == 0) {
            int64_t from = 0;
            for (int64_t i = 0; i < n_ids; i++) { fill32(y, from, ids[i], neg, isa); from = ids[i] + 1; }
            fill32(y, from, vocab, neg, isa);
            return;
        }
        fill32(y, width, vocab, neg, isa);
        if (kind == 1) { for (int64_t i = 0; i < n_ids; i++) y[ids[i]] = neg; }
        else constrain_block32(y, words, width, neg, isa);
    } else {
        uint16_t *y = (uint16_t *)x;
        uint16_t v = (uint16_t)neg;
        if (kind == 0) {
            int64_t from = 0;
            for (int64_t i = 0; i < n_ids; i++) { fill16(y, from, ids[i], v, isa); from = ids[i] + 1; }
            fill16(y, from, vocab, v, isa);
            return;
        }
        fill16(y, width, vocab, v, isa);
        if (kind == 1) { for (int64_t i = 0; i < n_ids; i++) y[ids[i]] = v; }
        else constrain_block16(y, words, width, v, isa);
    }
}

/* plan: {kind, ids address, number of ids, words address, width} (one ctypes array per plan: few arguments to
   convert per call). */
void constrain_apply_row(void *x, int64_t vocab, int element_bits, uint32_t neg, const int64_t *plan, int isa) {
    apply_row(x, vocab, element_bits, neg, (int)plan[0], (const int64_t *)(intptr_t)plan[1], plan[2],
              (const uint32_t *)(intptr_t)plan[3], plan[4], isa);
}
"""

class NativePass:
    """The loaded library: `block` masks one contiguous row by its words, `apply_row` by a row plan's fields.

    `isa` is the instruction set used: 2 AVX-512, 1 AVX2, 0 portable C (`native_isa`: the best this CPU runs); tests
    lower it to run the other paths.
    """

    def __init__(self, lib: ctypes.CDLL):
        self._fns = {32: lib.constrain_block32, 16: lib.constrain_block16}
        for bits, fn in self._fns.items():
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_uint32 if bits == 32 else ctypes.c_uint16, ctypes.c_int]
            fn.restype = None
        self._apply_row = lib.constrain_apply_row
        self._apply_row.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint32,
                                    ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        self._apply_row.restype = None
        lib.constrain_native_isa.restype = ctypes.c_int
        self.native_isa = int(lib.constrain_native_isa())
        self.isa = self.native_isa

    @staticmethod
    def plan_args(kind: int, ids_ptr: int, n_ids: int, words_ptr: int, width: int) -> ctypes.Array:
        """A row plan's fields for `apply_row`: `kind` 0 keeps only the `n_ids` ascending int64 ids at `ids_ptr` (all
        below `width`), 1 blocks those ids, 2 applies the ceil(width / 32) int32 words at `words_ptr`."""
        return (ctypes.c_int64 * 5)(kind, ids_ptr, n_ids, words_ptr, width)

    def apply_row(self, x_ptr: int, vocab: int, element_bits: int, neg: int, plan_args: ctypes.Array) -> None:
        """Mask the `vocab` contiguous elements at `x_ptr` under one row plan (`plan_args`), in place: one call into C.

        Elements from the plan's width to `vocab` are always blocked.
        """
        self._apply_row(x_ptr, vocab, element_bits, neg, plan_args, self.isa)

    def block(self, x_ptr: int, words_ptr: int, width: int, element_bits: int, neg: int) -> None:
        """Set x[t] to the bit pattern `neg` for every t < `width` whose mask bit is 0.

        `x_ptr`: `width` contiguous elements of `element_bits` (32 or 16); `words_ptr`: ceil(width / 32) int32 words.
        """
        self._fns[element_bits](x_ptr, words_ptr, width, neg, self.isa)


_lock = threading.Lock()
_state: dict[str, NativePass | None] = {}


def load() -> NativePass | None:
    """The native pass, built on first use (cached on disk by source and compiler); None where it cannot be built.

    The build cache is `$CONSTRAIN_KERNELS` if set, else `~/.cache/constrain/kernels`. `CONSTRAIN_NATIVE=0` turns
    the native pass off. A failed build warns once (callers then use the slower torch pass).
    """
    if "pass" in _state:  # the usual call: no lock once loaded
        return _state["pass"]
    with _lock:
        if "pass" not in _state:
            _state["pass"] = _load()
        return _state["pass"]


def _load() -> NativePass | None:
    lib = cbuild.build("cpu_mask", _SOURCE, fallback="masking dense CPU rows with the slower torch pass")
    try:
        return None if lib is None else NativePass(lib)
    except AttributeError as err:  # a stale or foreign library without our symbols
        warnings.warn(f"the native CPU mask pass lacks {err}; masking dense CPU rows with the slower torch pass",
                      RuntimeWarning, stacklevel=3)
        return None
