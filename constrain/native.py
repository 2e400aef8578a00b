"""The two automaton passes that dominate a compile, in C: subset construction (NFA → DFA) and minimisation.

Built once per machine with the system C compiler (`constrain_kernels.cbuild`) and called through ctypes, which releases the
GIL. `automata()` returns None where the library cannot be built or `CONSTRAIN_NATIVE=0`; `constrain.automaton` then
runs its numpy/Python passes, which give the same languages (and, minimised, the same state counts): the tests
compare both.

  * `determinise`: the subset construction over symbol classes, states numbered breadth-first (classes ascending per
    state), with the state budget, the time budget and cancellation checked inside (every 2^14 units of work).
  * `minimise`: Hopcroft's partition refinement on the partial DFA, as refinable partitions of states and of
    transitions (Valmari and Lehtinen's formulation), O(m log n) for m live transitions; trimmed input only.

Beside them, smaller passes in C: products, the glue of parts side by side (`glue`), the trie walks of the token
index, the cursor's step.
"""

from __future__ import annotations

import array
import concurrent.futures
import ctypes
import functools
import mmap
import os
import threading
import weakref
from itertools import chain
from typing import Any, Sequence

import numpy as np

from constrain_kernels import cbuild

__all__ = ["NativeAutomata", "Reference", "Stepper", "automata", "DET_OK", "DET_STATES", "DET_TIME", "DET_CANCELLED"]

DET_OK, DET_STATES, DET_TIME, DET_CANCELLED, DET_NOMEM = 0, 1, 2, 3, 4

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { DET_OK = 0, DET_STATES = 1, DET_TIME = 2, DET_CANCELLED = 3, DET_NOMEM = 4 };

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- growable int32 vector ---- */
typedef struct { int32_t *v; int64_t n, cap; } ivec;

static int ivec_reserve(ivec *a, int64_t need) {
    if (need <= a->cap) return 1;
    int64_t cap = a->cap ? a->cap : 64;
    while (cap < need) cap *= 2;
    int32_t *p = (int32_t *)realloc(a->v, (size_t)cap * sizeof(int32_t));
    if (!p) return 0;
    a->v = p;
    a->cap = cap;
    return 1;
}

static inline int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap && !ivec_reserve(a, a->n + 1)) return 0;
    a->v[a->n++] = x;
    return 1;
}

/* ---- a set of int32 sets: each stored once in a pool, found by hash, mapped to a value ---- */
typedef struct {
    ivec pool;
    int64_t *off;     /* set i is pool[off[i] .. off[i + 1]) */
    uint64_t *hash;
    int32_t *value;
    int64_t n, cap;
    int32_t *slot;    /* open addressing, -1 = empty */
    int64_t n_slot;   /* a power of two, kept over twice n */
} settab;

static uint64_t hash_ints(const int32_t *a, int64_t n) {
    uint64_t h = 0x243F6A8885A308D3ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint32_t)a[i];
        h *= 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    return h;
}

static int settab_init(settab *t) {
    memset(t, 0, sizeof *t);
    t->cap = 256;
    t->n_slot = 1024;
    t->off = (int64_t *)malloc((size_t)(t->cap + 1) * sizeof(int64_t));
    t->hash = (uint64_t *)malloc((size_t)t->cap * sizeof(uint64_t));
    t->value = (int32_t *)malloc((size_t)t->cap * sizeof(int32_t));
    t->slot = (int32_t *)malloc((size_t)t->n_slot * sizeof(int32_t));
    if (!t->off || !t->hash || !t->value || !t->slot) return 0;
    memset(t->slot, 0xFF, (size_t)t->n_slot * sizeof(int32_t));
    t->off[0] = 0;
    return 1;
}

static void settab_free(settab *t) {
    free(t->pool.v); free(t->off); free(t->hash); free(t->value); free(t->slot);
}

/* index of the set equal to a[0..n) (hash h), or -1 - (the empty slot where it would go) */
static int64_t settab_find(const settab *t, const int32_t *a, int64_t n, uint64_t h) {
    uint64_t mask = (uint64_t)t->n_slot - 1, i = h & mask;
    while (t->slot[i] >= 0) {
        int64_t s = t->slot[i];
        if (t->hash[s] == h && t->off[s + 1] - t->off[s] == n &&
            (n == 0 || !memcmp(t->pool.v + t->off[s], a, (size_t)n * sizeof(int32_t))))
            return s;
        i = (i + 1) & mask;
    }
    return -1 - (int64_t)i;
}

/* add a[0..n) (not present; `where` from settab_find) with `value`; 0 when out of memory */
static int settab_add(settab *t, const int32_t *a, int64_t n, uint64_t h, int32_t value, int64_t where) {
    if (t->n == t->cap) {
        int64_t cap = t->cap * 2;
        int64_t *off = (int64_t *)realloc(t->off, (size_t)(cap + 1) * sizeof(int64_t));
        if (!off) return 0;
        t->off = off;
        uint64_t *hash = (uint64_t *)realloc(t->hash, (size_t)cap * sizeof(uint64_t));
        if (!hash) return 0;
        t->hash = hash;
        int32_t *val = (int32_t *)realloc(t->value, (size_t)cap * sizeof(int32_t));
        if (!val) return 0;
        t->value = val;
        t->cap = cap;
    }
    if (!ivec_reserve(&t->pool, t->pool.n + n)) return 0;
    if (n) memcpy(t->pool.v + t->pool.n, a, (size_t)n * sizeof(int32_t));
    t->pool.n += n;
    int64_t id = t->n++;
    t->off[id + 1] = t->pool.n;
    t->hash[id] = h;
    t->value[id] = value;
    t->slot[where] = (int32_t)id;
    if (t->n * 2 > t->n_slot) {
        int64_t n_slot = t->n_slot * 2;
        int32_t *slot = (int32_t *)malloc((size_t)n_slot * sizeof(int32_t));
        if (!slot) return 0;
        memset(slot, 0xFF, (size_t)n_slot * sizeof(int32_t));
        uint64_t mask = (uint64_t)n_slot - 1;
        for (int64_t s = 0; s < t->n; s++) {
            uint64_t i = t->hash[s] & mask;
            while (slot[i] >= 0) i = (i + 1) & mask;
            slot[i] = (int32_t)s;
        }
        free(t->slot);
        t->slot = slot;
        t->n_slot = n_slot;
    }
    return 1;
}

/* ascending sorts: insertion sort for short runs (the usual case here), qsort beyond */
#define DEFINE_SORT(NAME, T)                                                                            \
    static int NAME##_cmp(const void *x, const void *y) {                                               \
        T a = *(const T *)x, b = *(const T *)y;                                                         \
        return (a > b) - (a < b);                                                                       \
    }                                                                                                   \
    static void NAME(T *a, int64_t n) {                                                                 \
        if (n > 24) { qsort(a, (size_t)n, sizeof(T), NAME##_cmp); return; }                             \
        for (int64_t i = 1; i < n; i++) {                                                               \
            T x = a[i];                                                                                 \
            int64_t j = i;                                                                              \
            while (j > 0 && a[j - 1] > x) { a[j] = a[j - 1]; j--; }                                     \
            a[j] = x;                                                                                   \
        }                                                                                               \
    }
DEFINE_SORT(sort_ints, int32_t)
DEFINE_SORT(sort_u64, uint64_t)

/* ---- subset construction ---- */
typedef struct {
    int64_t n_states, cap;
    int32_t n_classes;
    int32_t *trans;   /* n_states x n_classes, -1 = no transition */
    uint8_t *acc;
} det_result;

typedef struct {
    /* the NFA (CSR) */
    int32_t n_nodes, n_classes, final;
    const int32_t *eps_off, *eps_dst, *edge_off, *edge_mask, *edge_dst, *mask_off, *mask_cls;
    /* limits */
    int64_t max_states;
    double deadline;
    const int64_t *cancel;
    int32_t n_cancel;
    int64_t work, next_check;
    /* scratch */
    int32_t *stamp, gen;
    ivec stack, members;
    settab states, seeds;
    det_result *out;
} det_ctx;

static int det_limits(det_ctx *c) {
    for (int32_t i = 0; i < c->n_cancel; i++)
        if (*(volatile int32_t *)(intptr_t)c->cancel[i]) return DET_CANCELLED;
    if (c->deadline > 0 && mono_now() > c->deadline) return DET_TIME;
    return DET_OK;
}

static inline int det_tick(det_ctx *c, int64_t units) {
    c->work += units;
    if (c->work < c->next_check) return DET_OK;
    c->next_check = c->work + (1 << 14);
    return det_limits(c);
}

/* Room in a result for its state n: the transition rows and acceptance flags double (out->cap with them) when full.
   0 when out of memory. */
static int result_grow(det_result *out, int64_t n) {
    if (n < out->cap) return 1;
    int64_t cap = out->cap ? out->cap * 2 : 256;
    int32_t *tr = (int32_t *)realloc(out->trans, (size_t)cap * (size_t)out->n_classes * sizeof(int32_t) + 4);
    if (!tr) return 0;
    out->trans = tr;
    uint8_t *acc = (uint8_t *)realloc(out->acc, (size_t)cap + 1);
    if (!acc) return 0;
    out->acc = acc;
    out->cap = cap;
    return 1;
}

static int det_new_state(det_ctx *c, const int32_t *members, int64_t n, uint64_t h, int64_t where, int accepting,
                         int32_t *id_out) {
    det_result *o = c->out;
    int64_t id = o->n_states;
    if (id > c->max_states) return DET_STATES;
    if (!result_grow(o, id)) return DET_NOMEM;
    memset(o->trans + id * o->n_classes, 0xFF, (size_t)o->n_classes * sizeof(int32_t));
    o->acc[id] = (uint8_t)accepting;
    o->n_states = id + 1;
    if (!settab_add(&c->states, members, n, h, (int32_t)id, where)) return DET_NOMEM;
    *id_out = (int32_t)id;
    return DET_OK;
}

/* the DFA state of the epsilon closure of the sorted, distinct seeds (added if new) */
static int det_closure(det_ctx *c, const int32_t *seeds, int64_t n_seeds, int32_t *id_out) {
    uint64_t hs = hash_ints(seeds, n_seeds);
    int64_t at = settab_find(&c->seeds, seeds, n_seeds, hs);
    if (at >= 0) { *id_out = c->seeds.value[at]; return DET_OK; }
    int32_t gen = ++c->gen;
    c->stack.n = 0;
    c->members.n = 0;
    int accepting = 0;
    for (int64_t i = 0; i < n_seeds; i++) {
        int32_t s = seeds[i];
        if (c->stamp[s] != gen) { c->stamp[s] = gen; if (!ivec_push(&c->stack, s)) return DET_NOMEM; }
    }
    int64_t visited = 0;
    while (c->stack.n) {
        int32_t x = c->stack.v[--c->stack.n];
        visited++;
        if (x == c->final) accepting = 1;
        if (x == c->final || c->edge_off[x + 1] > c->edge_off[x])
            if (!ivec_push(&c->members, x)) return DET_NOMEM;
        for (int32_t e = c->eps_off[x]; e < c->eps_off[x + 1]; e++) {
            int32_t y = c->eps_dst[e];
            if (c->stamp[y] != gen) { c->stamp[y] = gen; if (!ivec_push(&c->stack, y)) return DET_NOMEM; }
        }
    }
    int rc = det_tick(c, 1 + (visited >> 6));
    if (rc) return rc;
    sort_ints(c->members.v, c->members.n);
    uint64_t h = hash_ints(c->members.v, c->members.n);
    int64_t where = settab_find(&c->states, c->members.v, c->members.n, h);
    int32_t id;
    if (where >= 0) id = c->states.value[where];
    else if ((rc = det_new_state(c, c->members.v, c->members.n, h, -1 - where, accepting, &id))) return rc;
    at = settab_find(&c->seeds, seeds, n_seeds, hs);  /* the slot may have moved */
    if (!settab_add(&c->seeds, seeds, n_seeds, hs, id, -1 - at)) return DET_NOMEM;
    *id_out = id;
    return DET_OK;
}

static int det_run(det_ctx *c, int32_t start) {
    int32_t id;
    int rc = det_closure(c, &start, 1, &id);
    if (rc) return rc;
    uint64_t *pairs = NULL;
    int64_t pairs_cap = 0;
    ivec seeds = {0};
    const int32_t k = c->n_classes;
    for (int64_t s = 0; s < c->out->n_states; s++) {
        int64_t n_pairs = 0;
        int64_t lo = c->states.off[s], hi = c->states.off[s + 1];
        for (int64_t i = lo; i < hi; i++) {
            int32_t x = c->states.pool.v[i];
            for (int32_t e = c->edge_off[x]; e < c->edge_off[x + 1]; e++) {
                int32_t m = c->edge_mask[e], t = c->edge_dst[e];
                int32_t n_cls = c->mask_off[m + 1] - c->mask_off[m];
                if (n_pairs + n_cls > pairs_cap) {
                    int64_t cap = pairs_cap ? pairs_cap : 256;
                    while (cap < n_pairs + n_cls) cap *= 2;
                    uint64_t *p = (uint64_t *)realloc(pairs, (size_t)cap * sizeof(uint64_t));
                    if (!p) { rc = DET_NOMEM; goto done; }
                    pairs = p;
                    pairs_cap = cap;
                }
                for (int32_t j = c->mask_off[m]; j < c->mask_off[m + 1]; j++)
                    pairs[n_pairs++] = ((uint64_t)(uint32_t)c->mask_cls[j] << 32) | (uint32_t)t;
            }
        }
        if ((rc = det_tick(c, 1 + ((hi - lo) >> 6) + (n_pairs >> 6)))) goto done;
        sort_u64(pairs, n_pairs);
        int64_t i = 0;
        while (i < n_pairs) {
            int32_t cls = (int32_t)(pairs[i] >> 32);
            seeds.n = 0;
            for (; i < n_pairs && (int32_t)(pairs[i] >> 32) == cls; i++) {
                int32_t t = (int32_t)(uint32_t)pairs[i];
                if (!seeds.n || seeds.v[seeds.n - 1] != t)
                    if (!ivec_push(&seeds, t)) { rc = DET_NOMEM; goto done; }
            }
            if ((rc = det_closure(c, seeds.v, seeds.n, &id))) goto done;
            c->out->trans[s * k + cls] = id;
        }
    }
done:
    free(pairs);
    free(seeds.v);
    return rc;
}

void *constrain_determinise(int32_t n_nodes, const int32_t *eps_off, const int32_t *eps_dst,
                            const int32_t *edge_off, const int32_t *edge_mask, const int32_t *edge_dst,
                            const int32_t *mask_off, const int32_t *mask_cls, int32_t n_classes, int32_t start,
                            int32_t final, int64_t max_states, double deadline, const int64_t *cancel,
                            int32_t n_cancel, int32_t *status) {
    det_result *out = (det_result *)calloc(1, sizeof(det_result));
    det_ctx c;
    memset(&c, 0, sizeof c);
    if (!out) { *status = DET_NOMEM; return NULL; }
    out->n_classes = n_classes;
    c.n_nodes = n_nodes; c.n_classes = n_classes; c.final = final;
    c.eps_off = eps_off; c.eps_dst = eps_dst; c.edge_off = edge_off; c.edge_mask = edge_mask;
    c.edge_dst = edge_dst; c.mask_off = mask_off; c.mask_cls = mask_cls;
    c.max_states = max_states; c.deadline = deadline; c.cancel = cancel; c.n_cancel = n_cancel;
    c.next_check = 0;
    c.out = out;
    c.stamp = (int32_t *)calloc((size_t)n_nodes + 1, sizeof(int32_t));
    int rc = DET_NOMEM;
    if (c.stamp && settab_init(&c.states) && settab_init(&c.seeds)) rc = det_run(&c, start);
    free(c.stamp);
    free(c.stack.v);
    free(c.members.v);
    settab_free(&c.states);
    settab_free(&c.seeds);
    *status = rc;
    return out;
}

int64_t constrain_det_states(void *h) { return ((det_result *)h)->n_states; }

void constrain_det_copy(void *h, int32_t *trans, uint8_t *acc) {
    det_result *o = (det_result *)h;
    memcpy(trans, o->trans, (size_t)o->n_states * (size_t)o->n_classes * sizeof(int32_t));
    memcpy(acc, o->acc, (size_t)o->n_states);
}

void constrain_det_free(void *h) {
    det_result *o = (det_result *)h;
    if (!o) return;
    free(o->trans);
    free(o->acc);
    free(o);
}

/* ---- minimisation: refinable partitions (elements in set order; M marked counts, W touched sets) ---- */
typedef struct { int32_t z, w; int32_t *E, *L, *S, *F, *P, *M, *W; } part;

static int part_alloc(part *p, int64_t n_elements, int64_t n_sets) {
    memset(p, 0, sizeof *p);
    p->E = (int32_t *)malloc((size_t)(n_elements + 1) * sizeof(int32_t));
    p->L = (int32_t *)malloc((size_t)(n_elements + 1) * sizeof(int32_t));
    p->S = (int32_t *)malloc((size_t)(n_elements + 1) * sizeof(int32_t));
    p->F = (int32_t *)malloc((size_t)(n_sets + 1) * sizeof(int32_t));
    p->P = (int32_t *)malloc((size_t)(n_sets + 1) * sizeof(int32_t));
    p->M = (int32_t *)calloc((size_t)n_sets + 1, sizeof(int32_t));
    p->W = (int32_t *)malloc((size_t)(n_sets + 1) * sizeof(int32_t));
    return p->E && p->L && p->S && p->F && p->P && p->M && p->W;
}

static void part_free(part *p) { free(p->E); free(p->L); free(p->S); free(p->F); free(p->P); free(p->M); free(p->W); }

/* elements 0..n-1 grouped by key[e] in 0..n_keys-1 (every key used): one set per key, in key order */
static void part_by_key(part *p, int32_t n, const int32_t *key, int32_t n_keys) {
    for (int32_t b = 0; b <= n_keys; b++) p->F[b] = 0;
    for (int32_t e = 0; e < n; e++) p->F[key[e] + 1]++;
    for (int32_t b = 0; b < n_keys; b++) p->F[b + 1] += p->F[b];
    for (int32_t b = 0; b < n_keys; b++) p->P[b] = p->F[b];
    for (int32_t e = 0; e < n; e++) {
        int32_t b = key[e], at = p->P[b]++;
        p->E[at] = e;
        p->L[e] = at;
        p->S[e] = b;
    }
    p->z = n_keys;
    p->w = 0;
}

static inline void part_mark(part *p, int32_t e) {
    int32_t s = p->S[e], i = p->L[e], j = p->F[s] + p->M[s];
    if (i < j) return;  /* already marked */
    p->E[i] = p->E[j];
    p->L[p->E[i]] = i;
    p->E[j] = e;
    p->L[e] = j;
    if (p->M[s]++ == 0) p->W[p->w++] = s;
}

/* split every touched set into its marked and unmarked elements; the smaller part becomes the new set */
static void part_split(part *p) {
    while (p->w) {
        int32_t s = p->W[--p->w], j = p->F[s] + p->M[s];
        if (j == p->P[s]) { p->M[s] = 0; continue; }
        int32_t z = p->z;
        if (p->M[s] <= p->P[s] - j) { p->F[z] = p->F[s]; p->P[z] = j; p->F[s] = j; }
        else { p->P[z] = p->P[s]; p->F[z] = j; p->P[s] = j; }
        for (int32_t i = p->F[z]; i < p->P[z]; i++) p->S[p->E[i]] = z;
        p->M[s] = 0;
        p->M[z] = 0;
        p->z = z + 1;
    }
}

/* Coarsest partition of a trimmed partial DFA of n states given as its m transitions (tail[i] --label[i]--> head[i],
   labels 0..k-1) refining `block0` (0..n0-1, every id used) that is a congruence. Writes each state's block to
   `block_out`; returns the number of blocks, -1 when out of memory. */
static int32_t hopcroft_edges(int32_t n, int32_t k, int64_t m, const int32_t *tail, const int32_t *head,
                              const int32_t *label, const int32_t *block0, int32_t n0, int32_t *block_out) {
    int32_t *in_off = (int32_t *)calloc((size_t)n + 2, sizeof(int32_t));
    int32_t *in_tr = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    int32_t *label_of = (int32_t *)malloc((size_t)k * sizeof(int32_t) + 4);
    int32_t *used = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    part B, C;
    int ok = in_off && in_tr && label_of && used && part_alloc(&B, n, n) && part_alloc(&C, m, m);
    int32_t result = -1;
    if (!ok) goto done;
    /* labels renumbered to the used ones, in label order */
    for (int32_t c = 0; c < k; c++) label_of[c] = -1;
    for (int64_t i = 0; i < m; i++) label_of[label[i]] = 0;
    int32_t n_labels = 0;
    for (int32_t c = 0; c < k; c++) if (label_of[c] >= 0) label_of[c] = n_labels++;
    for (int64_t i = 0; i < m; i++) used[i] = label_of[label[i]];
    part_by_key(&B, n, block0, n0);
    part_by_key(&C, (int32_t)m, used, n_labels);
    /* incoming transitions per state */
    for (int64_t i = 0; i < m; i++) in_off[head[i] + 2]++;
    for (int32_t s = 0; s < n; s++) in_off[s + 2] += in_off[s + 1];
    for (int64_t i = 0; i < m; i++) in_tr[in_off[head[i] + 1]++] = (int32_t)i;
    /* splitters: every cord (the transitions of one label: splits states with that label from those without) and
       every block but block 0 (Hopcroft: all but one block of the initial partition, then the smaller half of
       each split) */
    int32_t b = 1, cd = 0;
    while (cd < C.z) {
        for (int32_t i = C.F[cd]; i < C.P[cd]; i++) part_mark(&B, tail[C.E[i]]);
        part_split(&B);
        cd++;
        while (b < B.z) {
            for (int32_t i = B.F[b]; i < B.P[b]; i++) {
                int32_t s = B.E[i];
                for (int32_t j = in_off[s]; j < in_off[s + 1]; j++) part_mark(&C, in_tr[j]);
            }
            part_split(&C);
            b++;
        }
    }
    for (int32_t s = 0; s < n; s++) block_out[s] = B.S[s];
    result = B.z;
done:
    free(in_off); free(in_tr); free(label_of); free(used);
    if (ok) { part_free(&B); part_free(&C); }
    return result;
}

/* The same for a dense table `trans` (n x k, -1 = none). */
static int32_t hopcroft(int32_t n, int32_t k, const int32_t *trans, const int32_t *block0, int32_t n0,
                        int32_t *block_out) {
    int64_t m = 0;
    for (int64_t i = 0; i < (int64_t)n * k; i++) m += trans[i] >= 0;
    int32_t *tail = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    int32_t *head = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    int32_t *label = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    int32_t result = -1;
    if (tail && head && label) {
        int64_t t = 0;
        for (int32_t s = 0; s < n; s++)
            for (int32_t c = 0; c < k; c++) {
                int32_t d = trans[(int64_t)s * k + c];
                if (d >= 0) { tail[t] = s; head[t] = d; label[t] = c; t++; }
            }
        result = hopcroft_edges(n, k, m, tail, head, label, block0, n0, block_out);
    }
    free(tail); free(head); free(label);
    return result;
}

/* ---- token masks: one DFA state's walk down the vocabulary's byte trie ---- */

/* Nodes are breadth-first with contiguous children (`constrain.trie._Trie`); the first-byte nodes are 0..n_first-1.
   Sets the bit of every token whose bytes keep the DFA live from `state` in `words` (zeroed by the caller); marks
   the state each such token ends in, in `seen` (n_states flags) and `tok_state` (per token id), when not NULL.
   Depth first with pruning while few nodes are live; once more than `dense_after` are, it returns -2 with
   `stop_after`, else starts again breadth first over every node in order (`node_state`: n_nodes scratch), which
   reads memory sequentially (a string-content state keeps ~all nodes live: 3.9 ms depth first, 0.6 ms in order on
   Llama 3's 275k nodes).
   Returns the number of live nodes, -1 when out of memory. */
/* trie node flags for a byte set X (`constrain_xflags`): the node's path holds a byte of X; the node or one below
   it ends a token whose path does */
enum { X_ON_PATH = 1, X_BELOW = 2 };

/* set token t's bit; with `touched`, list each word set from zero (touched[0]: how many so far) */
#define SET_BIT(t)                                                                                  \
    do {                                                                                            \
        int32_t w_ = (t) >> 5;                                                                      \
        if (touched && !words[w_]) touched[1 + touched[0]++] = w_;                                  \
        words[w_] |= 1u << ((t) & 31);                                                              \
    } while (0)

/* mark state s seen; with `dests`, list each state marked from unseen (dests[0]: how many so far) */
#define SEE(s)                                                                                      \
    do {                                                                                            \
        if (seen && !seen[s]) {                                                                     \
            seen[s] = 1;                                                                            \
            if (dests) dests[1 + dests[0]++] = (s);                                                 \
        }                                                                                           \
    } while (0)

/* Children are visited by jumping to each live byte's child (a binary search in the node's children, which are
   sorted by byte) instead of reading every child, when the node has at least JUMP_MIN children and the DFA state
   keeps at most one byte in JUMP_RATIO of that many live (a structural state: a quote, a key's next letter). */
enum { JUMP_MIN = 16, JUMP_RATIO = 8 };
/* a node has at most 256 children (one per byte), so a jump lists at most 256 / JUMP_RATIO bytes */
enum { JUMP_MAX = 256 / JUMP_RATIO };
#define WALK_FRAMES(max_depth) ((size_t)((max_depth) + 1) * (5 * sizeof(int32_t) + JUMP_MAX))

/* The bytes (at most `most`) that keep `row` (one DFA state's transitions) live, written to `out`; -1 when more.
   `cls_off`/`cls_bytes`: the bytes of each class, class by class. */
static int32_t live_bytes(const int32_t *row, int32_t k, const int32_t *cls_off, const uint8_t *cls_bytes,
                          int32_t most, uint8_t *out) {
    int32_t n = 0;
    for (int32_t c = 0; c < k; c++) {
        if (row[c] < 0) continue;
        int32_t m = cls_off[c + 1] - cls_off[c];
        if (n + m > most) return -1;
        memcpy(out + n, cls_bytes + cls_off[c], (size_t)m);
        n += m;
    }
    return n;
}

/* The child of the node whose children are `lo .. hi - 1` that reads byte `b`, or -1. */
static inline int32_t child_by_byte(const uint8_t *node_byte, int32_t lo, int32_t hi, uint8_t b) {
    int32_t end = hi;
    while (lo < hi) {
        int32_t mid = lo + ((hi - lo) >> 1);
        if (node_byte[mid] < b) lo = mid + 1; else hi = mid;
    }
    return lo < end && node_byte[lo] == b ? lo : -1;
}

/* Digit runs (`native._digit_runs`): a trie node all of whose descendants read digits has run r = run_of[node] >= 0,
   the tokens below it being run_tok[run_off[r] .. run_off[r + 1]); loop[s] flags the DFA states every digit leads
   back to (a JSON number's digits). Reached in such a state, the node's subtree is not walked: each token below it
   keeps the DFA live and ends in that state (Llama 3's 1,110 number tokens: ~1,100 nodes -> 10).

   With `hits` (room for `cap_hits`), the walk lists the runs it reaches there instead of setting their tokens' bits,
   while there is room (`constrain_walk_many` then knows a mask by its runs and its other words before making it). */
enum { RUN_HITS = 64 };  /* the most runs `constrain_walk_many` lists per walk */
typedef struct {
    const int32_t *run_of, *run_off, *run_tok;
    const uint8_t *loop;
    int32_t *hits;
    int32_t n_hits, cap_hits;
} digit_runs;

static inline digit_runs *runs_of(const int64_t *a, digit_runs *out) {
    if (!a[28]) return NULL;
    out->run_of = (const int32_t *)(intptr_t)a[28];
    out->run_off = (const int32_t *)(intptr_t)a[29];
    out->run_tok = (const int32_t *)(intptr_t)a[30];
    out->loop = (const uint8_t *)(intptr_t)a[31];
    out->hits = NULL;
    out->n_hits = out->cap_hits = 0;
    return out;
}

/* Every token of run r is live and ends in `state`: its bits set (and `tok_state`, when not NULL). */
static void run_bits(const digit_runs *runs, int32_t r, uint32_t *words, int32_t *touched, int32_t *tok_state,
                     int32_t state) {
    for (int32_t i = runs->run_off[r]; i < runs->run_off[r + 1]; i++) {
        SET_BIT(runs->run_tok[i]);
        if (tok_state) tok_state[runs->run_tok[i]] = state;
    }
}

static int64_t walk(const int32_t *tflat, int32_t k, const int32_t *byte_class, const int32_t *child_start,
                    const int32_t *child_count, const int32_t *term_start, const int32_t *term_count,
                    const int32_t *term_tokens, const int32_t *parent, const int32_t *term_node,
                    int32_t n_nodes, int32_t n_terms, int32_t *node_state, int64_t dense_after,
                    int32_t n_first, int32_t max_depth, int32_t state, const uint8_t *flags, int stop_after,
                    uint32_t *words, uint8_t *seen, int32_t *tok_state, int32_t *touched, int32_t *dests,
                    const uint8_t *node_byte, const int32_t *cls_off, const uint8_t *cls_bytes, int32_t *frames,
                    digit_runs *runs) {
    /* per depth: the next child and the end of the run (or, jumping: the run's start, its end, the next of the
       `n_jump` live bytes in `jump`), and the DFA state the run is read from; in `frames` (WALK_FRAMES(max_depth)
       bytes) when given */
    size_t d1 = (size_t)(max_depth + 1);
    int32_t *cur = frames ? frames : (int32_t *)malloc(WALK_FRAMES(max_depth));
    if (!cur) return -1;
    int32_t *end = cur + d1, *from = end + d1, *n_jump = from + d1, *at_jump = n_jump + d1;
    uint8_t *jump = (uint8_t *)(at_jump + d1);
    int64_t live = 0;
    int32_t depth = 0;
    cur[0] = 0; end[0] = n_first; from[0] = state;
    n_jump[0] = n_first >= JUMP_MIN ? live_bytes(tflat + (int64_t)state * k, k, cls_off, cls_bytes,
                                                 n_first / JUMP_RATIO, jump) : -1;
    at_jump[0] = 0;
    while (depth >= 0) {
        int32_t node;
        if (n_jump[depth] >= 0) {
            node = -1;
            const uint8_t *jb = jump + (size_t)depth * JUMP_MAX;
            while (node < 0 && at_jump[depth] < n_jump[depth])
                node = child_by_byte(node_byte, cur[depth], end[depth], jb[at_jump[depth]++]);
            if (node < 0) { depth--; continue; }
        } else {
            if (cur[depth] == end[depth]) { depth--; continue; }
            node = cur[depth]++;
        }
        if (flags && !(flags[node] & X_BELOW)) continue;
        int32_t s = tflat[(int64_t)from[depth] * k + byte_class[node_byte[node]]];
        if (s < 0) continue;
        if (++live > dense_after) break;
        int32_t tc = term_count[node];
        if (tc && (!flags || (flags[node] & X_ON_PATH))) {
            const int32_t *tok = term_tokens + term_start[node];
            for (int32_t i = 0; i < tc; i++) {
                SET_BIT(tok[i]);
                if (tok_state) tok_state[tok[i]] = s;
            }
            SEE(s);
        }
        if (runs && runs->loop[s] && !flags && runs->run_of[node] >= 0) {  /* a digit loop over a subtree of digits */
            int32_t r = runs->run_of[node];
            if (runs->n_hits < runs->cap_hits) runs->hits[runs->n_hits++] = r;
            else run_bits(runs, r, words, touched, tok_state, s);
            SEE(s);
            continue;
        }
        int32_t cc = child_count[node];
        if (cc && depth + 1 <= max_depth) {
            depth++;
            cur[depth] = child_start[node];
            end[depth] = child_start[node] + cc;
            from[depth] = s;
            n_jump[depth] = cc >= JUMP_MIN ? live_bytes(tflat + (int64_t)s * k, k, cls_off, cls_bytes,
                                                        cc / JUMP_RATIO, jump + (size_t)depth * JUMP_MAX) : -1;
            at_jump[depth] = 0;
        }
    }
    if (!frames) free(cur);
    if (live <= dense_after) return live;
    if (stop_after) return -2;
    /* in order: every node's state from its parent's (parents come first) */
    const int32_t *row = tflat + (int64_t)state * k;
    for (int32_t x = 0; x < n_first; x++) node_state[x] = row[byte_class[node_byte[x]]];
    for (int32_t x = n_first; x < n_nodes; x++) {
        int32_t p = node_state[parent[x]];
        node_state[x] = p < 0 ? -1 : tflat[(int64_t)p * k + byte_class[node_byte[x]]];
    }
    live = 0;
    for (int32_t x = 0; x < n_nodes; x++) live += node_state[x] >= 0;
    for (int32_t i = 0; i < n_terms; i++) {
        int32_t s = node_state[term_node[i]];
        if (s < 0) continue;
        int32_t t = term_tokens[i];
        SET_BIT(t);
        if (tok_state) tok_state[t] = s;
        SEE(s);
    }
    return live;
}

/* One state's whole mask: `walk` with the walker's fixed arguments in one array (one ctypes conversion instead of
   twenty), the EOS and special-token bits added, and the mask's canonical sparse form.
   a = {tflat, k, byte_class (int32 [256]: each byte's class), child_start, child_count, term_start, term_count,
        term_tokens, parent, term_node, n_nodes, n_terms, dense_after, n_first, max_depth, n_words,
        accepting (uint8 per state), n_eos, eos ids, n_specials, special ids, special classes, share_after,
        first-byte subtree sizes, wide_nodes, node_byte, cls_off, cls_bytes}, addresses as integers (`cls_off`,
        int32 [k + 1], and `cls_bytes`, uint8 [256]: the bytes of each class, class by class).
   Zeroes `words` first. `sparse` (when not NULL) receives the count of nonzero words, or -1 when more than
   `sparse_max`, then each nonzero word's index and value. */
#define P(i) ((const int32_t *)(intptr_t)a[i])
#define B8(i) ((const uint8_t *)(intptr_t)a[i])
static void clear_last(const int64_t *a, uint32_t *words, uint8_t *seen, int32_t *touched, int32_t *dests) {
    if (touched) {  /* `words` is the buffer of the last call with this `touched`: clear only what it set */
        for (int32_t i = 1; i <= touched[0]; i++) words[touched[i]] = 0;
        touched[0] = 0;
    } else {
        memset(words, 0, (size_t)a[15] * sizeof(uint32_t));
    }
    if (dests) {  /* likewise `seen` and the states the last call listed */
        for (int32_t i = 1; i <= dests[0]; i++) seen[dests[i]] = 0;
        dests[0] = 0;
    }
}

static void finish_mask(const int64_t *a, int32_t state, uint32_t *words, uint8_t *seen, int32_t *sparse,
                        int32_t sparse_max, int32_t *touched, int32_t *dests);
static void sparse_form(int32_t n_words, const uint32_t *words, int32_t *sparse, int32_t sparse_max,
                        int32_t *touched);

/* A mask's nonzero words are listed by sorting the words it touched up to this many, by reading every word beyond
   (qsort of every touched list: send_email_to_array's structural fill on Qwen3, whose e-mail states touch hundreds
   of words, 9.1 ms; this way 6.8 ms). */
enum { SORT_TOUCHED = 128 };

/* `share`: return -2 (a state the caller may rather derive from an earlier one's mask: `constrain_walk_delta`) at
   once when the subtrees of the live first-byte nodes hold a[24] nodes or more (a[23]: int64 subtree sizes of the
   first-byte nodes), or once the depth-first walk finds more than a[22] nodes live. */
/* A cursor inside a counter with `room` counts left at `state`: the bits of the tokens whose walk stays live, ticks
   (effect 1) at most `room` times before it closes or opens a bound (effect >= 2), and ends where the counts it took
   leave room for what the state needs (`need`, 0/1 per state, the dead state last); `words` zeroed first (a[15]
   words). `effect`: int8 per (state, class), the dead row last, as `tflat`. Returns the most ticks any live token makes
   before closing (room or not), -1 out of memory. Depth first over the trie, every live node. */
int64_t constrain_walk_counted(const int64_t *a, const int8_t *effect, const uint8_t *need, int32_t state, int32_t room,
                               uint32_t *words) {
    const int32_t *tflat = P(0), *byte_class = P(2), *child_start = P(3), *child_count = P(4), *term_start = P(5),
                  *term_count = P(6), *term_tokens = P(7);
    const uint8_t *node_byte = B8(25);
    int32_t k = (int32_t)a[1], n_first = (int32_t)a[13], max_depth = (int32_t)a[14];
    memset(words, 0, (size_t)a[15] * sizeof(uint32_t));
    size_t d1 = (size_t)max_depth + 1;
    int32_t *cur = (int32_t *)malloc(5 * d1 * sizeof(int32_t));
    if (!cur) return -1;
    int32_t *end = cur + d1, *from = end + d1, *count = from + d1, *closed = count + d1;
    int32_t *touched = NULL;
    int64_t most = 0;
    int32_t depth = 0;
    cur[0] = 0; end[0] = n_first; from[0] = state; count[0] = 0; closed[0] = 0;
    while (depth >= 0) {
        if (cur[depth] == end[depth]) { depth--; continue; }
        int32_t node = cur[depth]++;
        int64_t at = (int64_t)from[depth] * k + byte_class[node_byte[node]];
        int32_t s = tflat[at];
        if (s < 0) continue;
        int32_t shut = closed[depth] || effect[at] >= 2;
        int32_t n = count[depth] + (effect[at] == 1);
        if (!shut && n > most) most = n;
        if (!shut && n > room) continue;
        int32_t tc = term_count[node];
        if (tc && (shut || n + need[s] <= room))
            for (int32_t i = 0; i < tc; i++) SET_BIT(term_tokens[term_start[node] + i]);
        int32_t cc = child_count[node];
        if (cc && depth + 1 <= max_depth) {
            depth++;
            cur[depth] = child_start[node];
            end[depth] = child_start[node] + cc;
            from[depth] = s;
            count[depth] = n;
            closed[depth] = shut;
        }
    }
    free(cur);
    return most;
}

int64_t constrain_walk(const int64_t *a, int32_t state, int32_t *node_state, uint32_t *words, uint8_t *seen,
                       int32_t *tok_state, int32_t *sparse, int32_t sparse_max, int32_t *touched, int32_t *dests,
                       int32_t share) {
    const int32_t *tflat = P(0);
    int32_t k = (int32_t)a[1];
    digit_runs runs;
    clear_last(a, words, seen, touched, dests);
    if (share) {
        const int32_t *row = tflat + (int64_t)state * k, *byte_class = P(2);
        const uint8_t *node_byte = B8(25);
        const int64_t *below = (const int64_t *)(intptr_t)a[23];
        int64_t n = 0;
        for (int64_t x = 0; x < a[13]; x++) n += row[byte_class[node_byte[x]]] >= 0 ? below[x] : 0;
        if (n >= a[24]) return -2;
    }
    int64_t live = walk(tflat, k, P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), (int32_t)a[10], (int32_t)a[11],
                        node_state, share ? a[22] : a[12], (int32_t)a[13], (int32_t)a[14], state, NULL, share,
                        words, seen, tok_state, touched, dests, B8(25), P(26), B8(27), NULL, runs_of(a, &runs));
    if (live < 0) return live;
    finish_mask(a, state, words, seen, sparse, sparse_max, touched, dests);
    return live;
}

/* The masks of `states[0 .. n)` in one call, each walked depth first while at most `live_max` trie nodes are live,
   deduplicated: `row_local[i]` gets the number of state i's distinct mask among this call's, or -1 when more than
   `max_first` bytes leave it live or more nodes are live (`live_max` until the walks given up so far have found
   `waste_budget` nodes, then `live_floor`), or its mask has more than `sparse_max` nonzero words, or `uniq_data`
   (`data_cap` entries) is full (left to `constrain_walk`). Distinct mask u is
   `uniq_data[uniq_off[u] .. uniq_off[u + 1])`, its nonzero words' index and value, by index (`sparse`:
   1 + 2 * sparse_max scratch). `words` and `touched` as in `constrain_walk`, left cleared.
   Returns the number of distinct masks, -1 when out of memory. */
int32_t constrain_walk_many(const int64_t *a, const int32_t *states, int32_t n, int32_t max_first, int64_t live_max,
                            int64_t live_floor, int64_t waste_budget, uint32_t *words, int32_t *touched,
                            int32_t *sparse, int32_t sparse_max, int32_t *row_local, int32_t *uniq_off,
                            int32_t *uniq_data, int64_t data_cap) {
    settab t, keys;  /* keys: (the digit runs a walk reached, its other words) -> its distinct mask */
    int ok = settab_init(&t) & settab_init(&keys);  /* each zeroed first: settab_free is safe either way */
    int32_t *frames = (int32_t *)malloc(WALK_FRAMES(a[14]));
    ivec key = {0};
    if (!ok || !frames) { free(frames); settab_free(&t); settab_free(&keys); return -1; }
    int32_t rc = 0;
    uint8_t first[256];
    digit_runs runs;
    int32_t hits[RUN_HITS];
    for (int32_t i = 0; i < n; i++) {
        int32_t state = states[i];
        row_local[i] = -1;
        if (live_bytes(P(0) + (int64_t)state * a[1], (int32_t)a[1], P(26), B8(27), max_first, first) < 0)
            continue;
        clear_last(a, words, NULL, touched, NULL);
        int64_t cap = waste_budget > 0 ? live_max : live_floor;
        digit_runs *rp = runs_of(a, &runs);
        if (rp) { rp->hits = hits; rp->cap_hits = RUN_HITS; }
        int64_t live = walk(P(0), (int32_t)a[1], P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), (int32_t)a[10],
                            (int32_t)a[11], NULL, cap, (int32_t)a[13], (int32_t)a[14], state, NULL, 1, words,
                            NULL, NULL, touched, NULL, B8(25), P(26), B8(27), frames, rp);
        if (live == -1) { rc = -1; break; }
        if (live < 0) { waste_budget -= cap; continue; }
        finish_mask(a, state, words, NULL, sparse, sparse_max, touched, NULL);
        if (sparse[0] < 0) continue;
        /* a walk through digit runs: its mask is known by the runs and the other words, made once per such key */
        int64_t km = 0, kat = 0;
        uint64_t kh = 0;
        if (rp && rp->n_hits) {
            km = 1 + rp->n_hits + 2 * (int64_t)sparse[0];
            if (!ivec_reserve(&key, km)) { rc = -1; break; }
            key.v[0] = rp->n_hits;
            memcpy(key.v + 1, hits, (size_t)rp->n_hits * sizeof(int32_t));
            memcpy(key.v + 1 + rp->n_hits, sparse + 1, (size_t)(2 * sparse[0]) * sizeof(int32_t));
            kh = hash_ints(key.v, km);
            kat = settab_find(&keys, key.v, km, kh);
            if (kat >= 0) { row_local[i] = keys.value[kat]; continue; }
            for (int32_t j = 0; j < rp->n_hits; j++) run_bits(rp, hits[j], words, touched, NULL, state);
            sparse_form((int32_t)a[15], words, sparse, sparse_max, touched);
            if (sparse[0] < 0) continue;
        }
        int64_t m = 2 * (int64_t)sparse[0];
        uint64_t h = hash_ints(sparse + 1, m);
        int64_t u = settab_find(&t, sparse + 1, m, h);
        if (u < 0) {
            if (t.pool.n + m > data_cap) continue;
            if (!settab_add(&t, sparse + 1, m, h, 0, -1 - u)) { rc = -1; break; }
            u = t.n - 1;
        }
        if (km && !settab_add(&keys, key.v, km, kh, (int32_t)u, -1 - kat)) { rc = -1; break; }
        row_local[i] = (int32_t)u;
    }
    clear_last(a, words, NULL, touched, NULL);
    if (rc == 0) {
        for (int64_t u = 0; u <= t.n; u++) uniq_off[u] = (int32_t)t.off[u];
        if (t.pool.n) memcpy(uniq_data, t.pool.v, (size_t)t.pool.n * sizeof(int32_t));
        rc = (int32_t)t.n;
    }
    settab_free(&t);
    settab_free(&keys);
    free(key.v);
    free(frames);
    return rc;
}

/* `state`'s mask from `base`, the mask of a state that keeps the same byte strings live as `state` as long as they
   avoid a byte set X (`constrain_pair_check`): the tokens without a byte of X as in `base` (`nox`: their bits),
   the others walked from `state` depth first, visiting only the trie nodes `flags` (`constrain_xflags`) marks as
   leading to them; EOS and special bits as `constrain_walk` sets them. Returns the number of nodes walked. */
int64_t constrain_walk_delta(const int64_t *a, int32_t state, const uint8_t *flags, const uint32_t *base,
                             const uint32_t *nox, uint32_t *words, uint8_t *seen, int32_t *sparse, int32_t sparse_max,
                             int32_t *touched, int32_t *dests) {
    clear_last(a, words, seen, touched, dests);
    for (int64_t w = 0; w < a[15]; w++) {
        uint32_t v = base[w] & nox[w];
        words[w] = v;
        if (v) touched[1 + touched[0]++] = (int32_t)w;
    }
    int64_t live = walk(P(0), (int32_t)a[1], P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), (int32_t)a[10],
                        (int32_t)a[11], NULL, INT64_MAX, (int32_t)a[13], (int32_t)a[14], state, flags, 0, words, seen,
                        NULL, touched, dests, B8(25), P(26), B8(27), NULL, NULL);
    if (live < 0) return live;
    finish_mask(a, state, words, seen, sparse, sparse_max, touched, dests);
    return live;
}

static void finish_mask(const int64_t *a, int32_t state, uint32_t *words, uint8_t *seen, int32_t *sparse,
                        int32_t sparse_max, int32_t *touched, int32_t *dests) {
    const int32_t *tflat = P(0);
    int32_t k = (int32_t)a[1], n_words = (int32_t)a[15];
    const uint8_t *accepting = (const uint8_t *)(intptr_t)a[16];
    if (accepting[state])
        for (int64_t i = 0; i < a[17]; i++) { int32_t t = P(18)[i]; SET_BIT(t); }
    for (int64_t i = 0; i < a[19]; i++) {
        int32_t d = tflat[(int64_t)state * k + P(21)[i]];
        if (d < 0) continue;
        int32_t t = P(20)[i];
        SET_BIT(t);
        SEE(d);
    }
    if (sparse) sparse_form(n_words, words, sparse, sparse_max, touched);
}

/* `sparse[0]`: the count of `words`' nonzero words, or -1 when more than `sparse_max`; then each one's index and
   value (`touched`: the words set, when listed). */
static void sparse_form(int32_t n_words, const uint32_t *words, int32_t *sparse, int32_t sparse_max,
                        int32_t *touched) {
    int32_t n = 0;
    if (touched && touched[0] <= sparse_max && touched[0] <= SORT_TOUCHED) {  /* the touched words, sorted */
        n = touched[0];
        sort_ints(touched + 1, n);
        for (int32_t i = 0; i < n; i++) {
            sparse[1 + 2 * i] = touched[1 + i];
            sparse[2 + 2 * i] = (int32_t)words[touched[1 + i]];
        }
    } else if (touched && touched[0] <= sparse_max) {  /* many: in order, without sorting them */
        for (int32_t w = 0; w < n_words; w++) {
            if (!words[w]) continue;
            sparse[1 + 2 * n] = w;
            sparse[2 + 2 * n] = (int32_t)words[w];
            n++;
        }
    } else if (touched) {
        n = -1;
    } else {
        for (int32_t w = 0; w < n_words; w++) {
            if (!words[w]) continue;
            if (n == sparse_max) { n = -1; break; }
            sparse[1 + 2 * n] = w;
            sparse[2 + 2 * n] = (int32_t)words[w];
            n++;
        }
    }
    sparse[0] = n;
}
#undef P
#undef B8

/* Trie node flags for the byte set `in_x` (256 flags): X_ON_PATH on each node whose path holds a byte of X, X_BELOW
   on each node at or above a node that has X_ON_PATH (nodes breadth-first: parents first). `nox` (zeroed by the
   caller) gets the bit of every byte token whose path holds no byte of X. Returns how many nodes have X_BELOW. */
int64_t constrain_xflags(int32_t n_nodes, const uint8_t *node_byte, const int32_t *parent, const uint8_t *in_x,
                         int32_t n_terms, const int32_t *term_node, const int32_t *term_tokens, uint8_t *flags,
                         uint32_t *nox) {
    for (int32_t x = 0; x < n_nodes; x++) {
        int32_t p = parent[x];
        flags[x] = (in_x[node_byte[x]] || (p >= 0 && (flags[p] & X_ON_PATH))) ? X_ON_PATH | X_BELOW : 0;
    }
    int64_t below = 0;
    for (int32_t x = n_nodes - 1; x >= 0; x--) {
        if (!(flags[x] & X_BELOW)) continue;
        below++;
        if (parent[x] >= 0) flags[parent[x]] |= X_BELOW;
    }
    for (int32_t i = 0; i < n_terms; i++)
        if (!(flags[term_node[i]] & X_ON_PATH)) nox[term_tokens[i] >> 5] |= 1u << (term_tokens[i] & 31);
    return below;
}

/* ---- a hash map from int64 keys to int32 ids (pair search, length product) ---- */

typedef struct { int64_t *keys; int32_t *vals; int64_t n_slot, n; } idmap;  /* int64 key >= 0 -> int32 id */

static int idmap_init(idmap *m) {
    m->n_slot = 1024;
    m->n = 0;
    m->keys = (int64_t *)malloc((size_t)m->n_slot * sizeof(int64_t));
    m->vals = (int32_t *)malloc((size_t)m->n_slot * sizeof(int32_t));
    if (!m->keys || !m->vals) return 0;
    for (int64_t i = 0; i < m->n_slot; i++) m->keys[i] = -1;
    return 1;
}

static int64_t idmap_slot(const int64_t *keys, int64_t n_slot, int64_t key) {
    int64_t at = (int64_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 20) & (n_slot - 1);
    while (keys[at] >= 0 && keys[at] != key) at = (at + 1) & (n_slot - 1);
    return at;
}

/* The id of `key`; else adds it with id `fresh` and returns -1 (-2 when out of memory). */
static int32_t idmap_get_or_add(idmap *m, int64_t key, int32_t fresh) {
    int64_t at = idmap_slot(m->keys, m->n_slot, key);
    if (m->keys[at] == key) return m->vals[at];
    m->keys[at] = key;
    m->vals[at] = fresh;
    if (++m->n * 2 > m->n_slot) {
        int64_t n_slot = m->n_slot * 2;
        int64_t *keys = (int64_t *)malloc((size_t)n_slot * sizeof(int64_t));
        int32_t *vals = (int32_t *)malloc((size_t)n_slot * sizeof(int32_t));
        if (!keys || !vals) { free(keys); free(vals); return -2; }
        for (int64_t i = 0; i < n_slot; i++) keys[i] = -1;
        for (int64_t i = 0; i < m->n_slot; i++) {
            if (m->keys[i] < 0) continue;
            int64_t to = idmap_slot(keys, n_slot, m->keys[i]);
            keys[to] = m->keys[i];
            vals[to] = m->vals[i];
        }
        free(m->keys); free(m->vals);
        m->keys = keys; m->vals = vals; m->n_slot = n_slot;
    }
    return -1;
}

/* Whether state p of DFA A (transitions `ta`, `ka` classes per state) and state q of DFA B keep the same byte strings
   of up to `depth` bytes live when the strings avoid the joint classes flagged in `xj`: joint class j is the bytes
   of class ja[j] in A and jb[j] in B (A and B may be one DFA: then ja = jb, its byte classes). Breadth first over
   pairs of states; a pair of one state twice (ta == tb) agrees on everything. On a disagreement it flags the joint
   class that led to the disagreeing pair (e.g. the closing quote of two string fields followed by different
   properties), or on the first byte the class itself, and starts again, at most `max_rounds` times. Returns how
   many joint classes `xj` flags when p and q agree, -1 when they do not within those rounds or more than
   `max_pairs` pairs are reached, -3 when out of memory. */
int32_t constrain_pair_check(const int32_t *ta, int32_t ka, const int32_t *tb, int32_t kb, int32_t n_joint,
                             const int32_t *ja, const int32_t *jb, int32_t p, int32_t q, int32_t depth, uint8_t *xj,
                             int32_t max_pairs, int32_t max_rounds, int32_t stop_depth, int32_t *agree) {
    int32_t *pa = (int32_t *)malloc((size_t)max_pairs * 4 * sizeof(int32_t));
    if (!pa) return -3;
    int32_t *pb = pa + max_pairs, *pd = pb + max_pairs, *pf = pd + max_pairs;
    int same = ta == tb;
    int32_t result = -1;
    idmap seen = {0};
    for (int32_t round = 0; round <= max_rounds; round++) {
        free(seen.keys); free(seen.vals);
        if (!idmap_init(&seen)) { result = -3; break; }
        int32_t n = 1, fail = -1, fail_depth = 0;
        pa[0] = p; pb[0] = q; pd[0] = 0; pf[0] = -1;
        for (int32_t head = 0; head < n && fail < 0; head++) {
            const int32_t *ra = ta + (int64_t)pa[head] * ka, *rb = tb + (int64_t)pb[head] * kb;
            int32_t d = pd[head], f = pf[head];
            fail_depth = d;
            for (int32_t j = 0; j < n_joint; j++) {
                if (xj[j]) continue;
                int32_t sa = ra[ja[j]], sb = rb[jb[j]];
                if ((sa < 0) != (sb < 0)) { fail = f < 0 ? j : f; break; }
                if (sa < 0 || (same && sa == sb) || d + 1 >= depth) continue;
                int32_t id = idmap_get_or_add(&seen, ((int64_t)sa << 32) | (uint32_t)sb, n);
                if (id == -2) { fail = -3; break; }  /* -3: out of memory */
                if (id >= 0) continue;
                if (n == max_pairs) { fail = -2; break; }  /* -2: too many pairs */
                pa[n] = sa; pb[n] = sb; pd[n] = d + 1; pf[n] = j;
                n++;
            }
        }
        if (round == 0 && stop_depth > 0 && fail != -3 && fail != -1 && fail_depth >= stop_depth) {
            /* breadth first, every pair fewer than fail_depth bytes deep was expanded without a disagreement: every
               string of at most fail_depth bytes has the same liveness from p and from q (-4: the caller walks only
               the longer tokens) */
            *agree = fail_depth;
            result = -4;
            break;
        }
        if (fail == -2 || fail == -3) { result = fail == -3 ? -3 : -1; break; }
        if (fail < 0) {
            result = 0;
            for (int32_t j = 0; j < n_joint; j++) result += xj[j] != 0;
            break;
        }
        xj[fail] = 1;
    }
    free(seen.keys); free(seen.vals); free(pa);
    return result;
}

/* One token's bytes read by a cursor (`TokenState.advance`), as `automaton.walk_counted` reads them. ctx: the table
   (int32, `state * n_classes + class`), n_classes, the class of each byte (int32[256]), and, 0 where the index has
   none, the counters' effects (int8, flat like the table), their limits (int64), the deep values' spills (int8, flat)
   and refills (int64, `state * 2 + kind`), the most kinds the stack holds (`automaton.MAX_SPILLED`). io: state,
   count, limit, at, depth in; the same out (state -1 and `at` the byte where the walk died, passed its bound or
   spilled onto a full stack, else at -1). stack: the `depth` spilled kinds, room for n more. */
void constrain_step(const int64_t *ctx, const uint8_t *data, int32_t n, int64_t *io, int32_t *stack) {
    const int32_t *table = (const int32_t *)(intptr_t)ctx[0];
    const int64_t k = ctx[1];
    const int32_t *cls = (const int32_t *)(intptr_t)ctx[2];
    const int8_t *effect = (const int8_t *)(intptr_t)ctx[3];
    const int64_t *limits = (const int64_t *)(intptr_t)ctx[4];
    const int8_t *spill = (const int8_t *)(intptr_t)ctx[5];
    const int64_t *refill = (const int64_t *)(intptr_t)ctx[6];
    int64_t state = io[0], count = io[1], limit = io[2], depth = io[4];
    io[3] = -1;
    for (int32_t at = 0; at < n; at++) {
        int64_t x = state * k + cls[data[at]];
        state = table[x];
        if (state < 0) { io[3] = at; break; }
        if (effect) {
            int8_t e = effect[x];
            if (e == 1) {
                count++;
                if (limit >= 0 && limit < count) { state = -1; io[3] = at; break; }
            } else if (e == 2) {
                limit = -1;
            } else if (e) {
                count = 0;
                limit = limits[e - 3];
            }
        }
        if (spill) {
            int8_t kind = spill[x];
            if (kind) {
                if (depth >= ctx[7]) { state = -1; io[3] = at; break; }
                stack[depth++] = kind - 1;
            } else if (depth && refill[2 * state] >= 0) state = refill[2 * state + stack[--depth]];
        }
    }
    io[0] = state; io[1] = count; io[2] = limit; io[4] = depth;
}

/* `constrain_step` without counters or stack: the state after `data`, or -2 - at where the walk died at byte `at`. */
int64_t constrain_step_plain(const int64_t *ctx, const uint8_t *data, int32_t n, int64_t state) {
    const int32_t *table = (const int32_t *)(intptr_t)ctx[0];
    const int64_t k = ctx[1];
    const int32_t *cls = (const int32_t *)(intptr_t)ctx[2];
    for (int32_t at = 0; at < n; at++) {
        state = table[state * k + cls[data[at]]];
        if (state < 0) return -2 - at;
    }
    return state;
}

/* How many first bytes of a token keep the DFA live from `state` (a structural state: a few). */
int32_t constrain_first_live(const int64_t *a, int32_t state) {
    const int32_t *row = (const int32_t *)(intptr_t)a[0] + (int64_t)state * a[1];
    const int32_t *byte_class = (const int32_t *)(intptr_t)a[2];
    const uint8_t *node_byte = (const uint8_t *)(intptr_t)a[25];
    int32_t n = 0;
    for (int64_t x = 0; x < a[13]; x++) n += row[byte_class[node_byte[x]]] >= 0;
    return n;
}

int32_t constrain_minimise(int32_t n, int32_t k, const int32_t *trans, const int32_t *block0, int32_t n0,
                           int32_t *block_out) {
    return hopcroft(n, k, trans, block0, n0, block_out);
}

/* ---- automata glued one after another ---- */

/* `automaton._glue_all` in one pass: part i (tables[i], n[i] x k, -1 for no transition; accs[i]; start[i]) written
   from row `at` on, its start left out when i > 0 and nothing in the part enters it, the other states renumbered to
   follow on. The accepting states of the parts so far (part i - 1's; those that skip to part i; and, where a part
   accepts at its start, the ones that stepped into it too) also step like part i's start and accept as it does.
   skip[i] = j: part i's accepting states also step like part j's start (i + 1 < j < n_parts), or stay accepting
   (j = n_parts); -1: none. Part i's entry (q, c) is tables[i][q * strides[2i] + c * strides[2i + 1]] (numpy's
   strides in elements: its tables are often column-major). `out` and `acc_out` have room for the sum of n[i] rows,
   row-major. Returns the rows written, -1 when an accepting state already steps on a class the next part's start
   steps on, -2 when out of memory. */
int64_t constrain_glue(int32_t n_parts, int32_t k, const int32_t *const *tables, const int64_t *strides,
                       const uint8_t *const *accs, const int32_t *n, const int32_t *start, const int32_t *skip,
                       int32_t *out, uint8_t *acc_out) {
    ivec final = {0}, own = {0};
    ivec *owns = (ivec *)calloc((size_t)(n_parts > 0 ? n_parts : 1), sizeof(ivec));
    int32_t *into = (int32_t *)malloc((size_t)(k > 0 ? k : 1) * sizeof(int32_t));
    int64_t at = 0, rc = -2;
    uint8_t *dropped = (uint8_t *)calloc((size_t)(n_parts > 0 ? n_parts : 1), 1);
    if (!owns || !into || !dropped) goto done;
    for (int32_t i = 0; i < n_parts; i++) {
        const int32_t *t = tables[i];
        const int64_t rs = strides[2 * i], cs = strides[2 * i + 1];
        const uint8_t *a = accs[i];
        const int32_t ni = n[i], s0 = start[i];
        int drop = 0, known = 0;
        for (int32_t p = 1; p < i && !known; p++)  /* a part repeated (an array's item): its start read once */
            if (tables[p] == t && start[p] == s0 && n[p] == ni && strides[2 * p] == rs && strides[2 * p + 1] == cs) {
                drop = dropped[p];
                known = 1;
            }
        if (i > 0 && !known) {
            drop = 1;
            for (int32_t q = 0; q < ni && drop; q++)
                for (int32_t c = 0; c < k; c++)
                    if (t[q * rs + c * cs] == s0) { drop = 0; break; }
        }
        dropped[i] = (uint8_t)drop;
#define GLUE_NUMBER(v) ((v) < 0 ? -1 : (int32_t)(at + (v) - (drop && (v) > s0)))
        for (int32_t q = 0; q < ni; q++) {
            if (drop && q == s0) continue;
            const int64_t r = at + q - (drop && q > s0);
            const int32_t *row = t + q * rs;
            int32_t *dst = out + r * k;
            for (int32_t c = 0; c < k; c++) dst[c] = GLUE_NUMBER(row[c * cs]);
            acc_out[r] = a[q] ? 1 : 0;
        }
        own.n = 0;
        for (int32_t q = 0; q < ni; q++)
            if (a[q] && !(drop && q == s0) && !ivec_push(&own, GLUE_NUMBER(q))) goto done;
        for (int32_t p = 0; p < i; p++) {
            if (skip[p] != i) continue;
            for (int64_t j = 0; j < owns[p].n; j++)
                if (!ivec_push(&final, owns[p].v[j])) goto done;
        }
        if (i > 0) {
            const int32_t *row = t + s0 * rs;
            for (int32_t c = 0; c < k; c++) into[c] = GLUE_NUMBER(row[c * cs]);
            for (int64_t j = 0; j < final.n; j++) {
                const int32_t *f = out + (int64_t)final.v[j] * k;
                for (int32_t c = 0; c < k; c++)
                    if (f[c] >= 0 && into[c] >= 0) { rc = -1; goto done; }
            }
            for (int64_t j = 0; j < final.n; j++) {
                int32_t *f = out + (int64_t)final.v[j] * k;
                for (int32_t c = 0; c < k; c++)
                    if (f[c] < 0) f[c] = into[c];
                acc_out[final.v[j]] = a[s0] ? 1 : 0;
            }
            if (a[s0])
                for (int64_t j = 0; j < final.n; j++)
                    if (!ivec_push(&own, final.v[j])) goto done;
        }
#undef GLUE_NUMBER
        if (skip[i] >= 0) {
            for (int64_t j = 0; j < own.n; j++)
                if (!ivec_push(&owns[i], own.v[j])) goto done;
        }
        ivec swap = final;
        final = own;
        own = swap;
        at += ni - drop;
    }
    for (int32_t p = 0; p < n_parts; p++)
        if (skip[p] == n_parts)
            for (int64_t j = 0; j < owns[p].n; j++) acc_out[owns[p].v[j]] = 1;
    rc = at;
done:
    if (owns)
        for (int32_t p = 0; p < n_parts; p++) free(owns[p].v);
    free(owns); free(into); free(dropped); free(final.v); free(own.v);
    return rc;
}

/* ---- fewest tokens to acceptance (a bound) ---- */

/* The fewest bytes from a state right after a tick (a live transition whose effect is `tick`) to the next tick, the
   bytes between stepping on transitions whose effect is `none` only (the same counter) and that tick's byte counted;
   with `from` >= 0, from that state instead; `cap` when it is `cap` or more; -1 when out of memory. Breadth first:
   the first state met with a tick is nearest. */
int32_t constrain_tick_gap(int32_t n, int32_t k, const int32_t *trans, const int8_t *effect, int32_t cap, int8_t tick,
                           int8_t none, int32_t from) {
    int32_t *queue = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *dist = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
    uint8_t *seen = (uint8_t *)calloc((size_t)n + 1, 1);
    int32_t out = -1, head = 0, tail = 0;
    if (!queue || !dist || !seen) goto done;
    out = cap;
    if (from >= 0) { seen[from] = 1; queue[tail] = from; dist[tail++] = 1; }
    else for (int64_t x = 0; x < (int64_t)n * k; x++) {
        int32_t t = trans[x];
        if (t >= 0 && effect[x] == tick && !seen[t]) { seen[t] = 1; queue[tail] = t; dist[tail++] = 1; }
    }
    while (head < tail) {
        int32_t s = queue[head], d = dist[head++];
        if (d >= cap) break;
        const int32_t *row = trans + (int64_t)s * k;
        const int8_t *eff = effect + (int64_t)s * k;
        for (int32_t j = 0; j < k; j++)
            if (row[j] >= 0 && eff[j] == tick) { out = d; goto done; }
        for (int32_t j = 0; j < k; j++) {
            int32_t t = row[j];
            if (t >= 0 && eff[j] == none && !seen[t]) { seen[t] = 1; queue[tail] = t; dist[tail++] = d + 1; }
        }
    }
done:
    free(queue); free(dist); free(seen);
    return out;
}

/* bound[s]: an upper bound on the fewest tokens from state s to acceptance, or `none`. Breadth-first backwards
   over the classes with use[c] != 0 (each taken by one byte that is a token by itself, rep[c] >= 0, or a special
   symbol, rep[c] = -1) gives every state a shortest path to acceptance, next[s] its next state; then, states in order
   of that distance, bound[s] = 1 + min bound[s_j] over the prefixes of the path's bytes that are tokens (the trie:
   root's children `root_lo .. root_hi - 1`), s_j the state after j of them: a token sequence that spells the path.
   0, or -1 when out of memory. */
int32_t constrain_token_bound(int32_t n, int32_t k, const int32_t *trans, const uint8_t *use, const int32_t *rep,
                              const uint8_t *acc, const uint8_t *node_byte, const int32_t *child_start,
                              const int32_t *child_count, const int32_t *term_count, int32_t root_lo, int32_t root_hi,
                              int64_t none, int64_t *bound) {
    int64_t *start = calloc((size_t)n + 1, sizeof(int64_t));
    int64_t *fill = malloc(((size_t)n + 1) * sizeof(int64_t));
    int32_t *queue = malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *next = malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *via = malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *pred = NULL, *pcls = NULL;
    int32_t rc = -1;
    if (!start || !fill || !queue || !next || !via) goto done;
    for (int32_t s = 0; s < n; s++)
        for (int32_t c = 0; c < k; c++)
            if (use[c] && trans[(int64_t)s * k + c] >= 0) start[trans[(int64_t)s * k + c] + 1]++;
    for (int32_t s = 0; s < n; s++) start[s + 1] += start[s];
    pred = malloc(((size_t)start[n] + 1) * sizeof(int32_t));
    pcls = malloc(((size_t)start[n] + 1) * sizeof(int32_t));
    if (!pred || !pcls) goto done;
    memcpy(fill, start, ((size_t)n + 1) * sizeof(int64_t));
    for (int32_t s = 0; s < n; s++)
        for (int32_t c = 0; c < k; c++) {
            int32_t t = use[c] ? trans[(int64_t)s * k + c] : -1;
            if (t >= 0) { pred[fill[t]] = s; pcls[fill[t]++] = c; }
        }
    int64_t head = 0, tail = 0;
    for (int32_t s = 0; s < n; s++) {
        bound[s] = acc[s] ? 0 : none;
        next[s] = -1;
        if (acc[s]) queue[tail++] = s;
    }
    while (head < tail) {  /* bound[] holds byte distances here: `none` marks a state not reached yet */
        int32_t t = queue[head++];
        for (int64_t e = start[t]; e < start[t + 1]; e++) {
            int32_t s = pred[e];
            if (bound[s] == none) { bound[s] = bound[t] + 1; next[s] = t; via[s] = pcls[e]; queue[tail++] = s; }
        }
    }
    for (int64_t q = 0; q < tail; q++) {  /* in order of distance: every state on a path is done before it */
        int32_t s = queue[q];
        if (next[s] < 0) continue;  /* accepting */
        int64_t best = bound[next[s]] + 1;
        int32_t lo = root_lo, hi = root_hi, cur = s;
        while (next[cur] >= 0 && rep[via[cur]] >= 0) {
            int32_t node = child_by_byte(node_byte, lo, hi, (uint8_t)rep[via[cur]]);
            if (node < 0) break;
            cur = next[cur];
            if (term_count[node] > 0 && bound[cur] + 1 < best) best = bound[cur] + 1;
            lo = child_start[node];
            hi = lo + child_count[node];
        }
        bound[s] = best;
    }
    rc = 0;
done:
    free(start); free(fill); free(queue); free(next); free(via); free(pred); free(pcls);
    return rc;
}

/* ---- finishing a DFA: trim, minimise, number breadth-first ---- */

/* The minimal DFA of `trans` (n x k, -1 = none) from `start` with `acc`: only states reachable from the start that
   can reach acceptance are kept, equivalent states merged (Hopcroft), and states numbered breadth-first from the start
   (0) over classes ascending. The result (a det_result: 0 states when the language is empty) is read with
   constrain_det_states / constrain_det_copy, its start is 0; NULL when out of memory. */
void *constrain_finish(int32_t n, int32_t k, const int32_t *trans, const uint8_t *acc, int32_t start) {
    /* One read of the dense table into its transitions (src, class, dst) in row order; everything else works on
       them (a 4,004 x 106 table of 11k transitions: eight dense passes took 3.2 ms). */
    det_result *out = (det_result *)calloc(1, sizeof(det_result));
    if (!out) return NULL;
    out->n_classes = k;
    int64_t m = 0;  /* (room for every entry: only the pages the transitions fill are touched) */
    int32_t *e_off = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *e_cls = (int32_t *)malloc(((size_t)n * (size_t)k + 1) * sizeof(int32_t));
    int32_t *e_dst = (int32_t *)malloc(((size_t)n * (size_t)k + 1) * sizeof(int32_t));
    int32_t *rev_off = (int32_t *)calloc((size_t)n + 2, sizeof(int32_t));
    int32_t *rev_src = NULL;
    int32_t *queue = (int32_t *)malloc((size_t)n * sizeof(int32_t) + 4);
    uint8_t *live = (uint8_t *)calloc((size_t)n + 1, 1);
    int32_t *renum = (int32_t *)malloc((size_t)n * sizeof(int32_t) + 4);
    int32_t *tail = NULL, *head = NULL, *label = NULL, *s_off = NULL, *block0 = NULL, *block = NULL, *rep = NULL,
            *bid = NULL;
    uint8_t *sacc = NULL;
    int ok = e_off && e_cls && e_dst && rev_off && queue && live && renum;
    if (!ok) goto fail;
    for (int32_t s = 0; s < n; s++) {
        e_off[s] = (int32_t)m;
        const int32_t *row = trans + (int64_t)s * k;
        for (int32_t c = 0; c < k; c++)
            if (row[c] >= 0) { e_cls[m] = c; e_dst[m] = row[c]; m++; }
    }
    e_off[n] = (int32_t)m;
    rev_src = (int32_t *)malloc((size_t)(m + 1) * sizeof(int32_t));
    if (!rev_src) goto fail;
    /* co-reachable: backwards from the accepting states */
    for (int64_t i = 0; i < m; i++) rev_off[e_dst[i] + 2]++;
    for (int32_t s = 0; s < n; s++) rev_off[s + 2] += rev_off[s + 1];
    for (int32_t s = 0; s < n; s++)
        for (int32_t j = e_off[s]; j < e_off[s + 1]; j++) rev_src[rev_off[e_dst[j] + 1]++] = s;
    int32_t qh = 0, qt = 0;
    for (int32_t s = 0; s < n; s++) if (acc[s]) { live[s] = 1; queue[qt++] = s; }
    while (qh < qt) {
        int32_t t = queue[qh++];
        for (int32_t j = rev_off[t]; j < rev_off[t + 1]; j++) {
            int32_t s = rev_src[j];
            if (!live[s]) { live[s] = 1; queue[qt++] = s; }
        }
    }
    if (n == 0 || !live[start]) {
        free(e_off); free(e_cls); free(e_dst); free(rev_off); free(rev_src); free(queue); free(live); free(renum);
        return out;
    }
    /* reachable from the start through live states, numbered in that order (classes ascending) */
    for (int32_t s = 0; s < n; s++) renum[s] = -1;
    qh = qt = 0;
    renum[start] = 0;
    queue[qt++] = start;
    int64_t m2 = 0;
    while (qh < qt) {
        int32_t s = queue[qh++];
        for (int32_t j = e_off[s]; j < e_off[s + 1]; j++) {
            int32_t t = e_dst[j];
            if (!live[t]) continue;
            m2++;
            if (renum[t] < 0) { renum[t] = qt; queue[qt++] = t; }
        }
    }
    int32_t n2 = qt;
    /* the kept transitions, by new state then class */
    tail = (int32_t *)malloc((size_t)(m2 + 1) * sizeof(int32_t));
    head = (int32_t *)malloc((size_t)(m2 + 1) * sizeof(int32_t));
    label = (int32_t *)malloc((size_t)(m2 + 1) * sizeof(int32_t));
    s_off = (int32_t *)malloc(((size_t)n2 + 1) * sizeof(int32_t));
    block0 = (int32_t *)malloc((size_t)n2 * sizeof(int32_t) + 4);
    block = (int32_t *)malloc((size_t)n2 * sizeof(int32_t) + 4);
    sacc = (uint8_t *)malloc((size_t)n2 + 1);
    if (!tail || !head || !label || !s_off || !block0 || !block || !sacc) goto fail;
    int has_acc = 0, has_rej = 0;
    {
        int64_t t = 0;
        for (int32_t i = 0; i < n2; i++) {
            int32_t s = queue[i];
            s_off[i] = (int32_t)t;
            for (int32_t j = e_off[s]; j < e_off[s + 1]; j++) {
                int32_t d = e_dst[j];
                if (!live[d]) continue;
                tail[t] = i; head[t] = renum[d]; label[t] = e_cls[j]; t++;
            }
            sacc[i] = acc[s] ? 1 : 0;
            if (acc[s]) has_acc = 1; else has_rej = 1;
        }
        s_off[n2] = (int32_t)t;
    }
    for (int32_t i = 0; i < n2; i++) block0[i] = (has_acc && has_rej) ? sacc[i] : 0;
    int32_t n_blocks = hopcroft_edges(n2, k, m2, tail, head, label, block0, (has_acc && has_rej) ? 2 : 1, block);
    if (n_blocks < 0) goto fail;
    /* the quotient, breadth-first from the start's block */
    rep = (int32_t *)malloc((size_t)n_blocks * sizeof(int32_t) + 4);
    bid = (int32_t *)malloc((size_t)n_blocks * sizeof(int32_t) + 4);
    out->trans = (int32_t *)malloc((size_t)n_blocks * (size_t)k * sizeof(int32_t) + 4);
    out->acc = (uint8_t *)malloc((size_t)n_blocks + 1);
    if (!rep || !bid || !out->trans || !out->acc) goto fail;
    for (int32_t b = 0; b < n_blocks; b++) bid[b] = -1;
    for (int32_t i = n2 - 1; i >= 0; i--) rep[block[i]] = i;
    qh = qt = 0;
    bid[block[0]] = 0;
    queue[qt++] = block[0];
    while (qh < qt) {
        int32_t b = queue[qh], r = rep[b];
        int32_t *row = out->trans + (int64_t)qh * k;
        for (int32_t c = 0; c < k; c++) row[c] = -1;
        for (int32_t j = s_off[r]; j < s_off[r + 1]; j++) {
            int32_t tb = block[head[j]];
            if (bid[tb] < 0) { bid[tb] = qt; queue[qt++] = tb; }
            row[label[j]] = bid[tb];
        }
        out->acc[qh] = sacc[r];
        qh++;
    }
    out->n_states = n_blocks;
    out->cap = n_blocks;
    free(e_off); free(e_cls); free(e_dst); free(rev_off); free(rev_src); free(queue); free(live); free(renum);
    free(tail); free(head); free(label); free(s_off); free(block0); free(block); free(rep); free(bid); free(sacc);
    return out;
fail:
    free(e_off); free(e_cls); free(e_dst); free(rev_off); free(rev_src); free(queue); free(live); free(renum);
    free(tail); free(head); free(label); free(s_off); free(block0); free(block); free(rep); free(bid); free(sacc);
    free(out->trans); free(out->acc); free(out);
    return NULL;
}

/* A breadth-first pass's empty result, with its limits in `c` (as in constrain_determinise); NULL when out of
   memory. */
static det_result *pass_begin(int32_t n_classes, det_ctx *c, double deadline, const int64_t *cancel,
                              int32_t n_cancel) {
    memset(c, 0, sizeof *c);
    c->deadline = deadline; c->cancel = cancel; c->n_cancel = n_cancel;
    det_result *out = (det_result *)calloc(1, sizeof(det_result));
    if (out) out->n_classes = n_classes;
    return out;
}

/* ---- product: intersection (keep_b) or difference (not keep_b) of two DFAs, breadth-first ---- */

/* Over nc product classes, class c reads class pa[c] of A and pb[c] of B (-1: that DFA has no such symbol).
   b_start is -1 when B is empty (difference only). Limits as in constrain_determinise (status). */
void *constrain_product(int32_t na, int32_t ka, const int32_t *ta, const uint8_t *acc_a, int32_t a_start,
                        int32_t nb, int32_t kb, const int32_t *tb, const uint8_t *acc_b, int32_t b_start,
                        int32_t nc, const int32_t *pa, const int32_t *pb, int32_t keep_b, int64_t max_states,
                        double deadline, const int64_t *cancel, int32_t n_cancel, int32_t *status) {
    det_ctx c;
    det_result *out = pass_begin(nc, &c, deadline, cancel, n_cancel);
    if (!out) { *status = DET_NOMEM; return NULL; }
    idmap m = {0};
    int32_t *pair_a = NULL, *pair_b = NULL;
    int64_t n = 0;
    int rc = DET_NOMEM;
    const int64_t width = (int64_t)nb + 1;
    if (!idmap_init(&m)) goto done;
    /* s = -1 adds the start pair; each later s adds the pairs its classes reach */
    for (int64_t s = -1; s < n; s++) {
        if (s >= 0 && (rc = det_tick(&c, 1))) goto done;
        int32_t x = s < 0 ? -1 : pair_a[s], y = s < 0 ? -1 : pair_b[s];
        for (int32_t q = 0; q < (s < 0 ? 1 : nc); q++) {
            int32_t tx = s < 0 ? a_start : pa[q] >= 0 ? ta[(int64_t)x * ka + pa[q]] : -1;
            int32_t ty = s < 0 ? b_start : (y >= 0 && pb[q] >= 0) ? tb[(int64_t)y * kb + pb[q]] : -1;
            int32_t id = -1;
            if (s < 0 || (tx >= 0 && !(keep_b && ty < 0))) {
                id = idmap_get_or_add(&m, ((int64_t)tx + 1) * width + ((int64_t)ty + 1), (int32_t)n);
                if (id == -2) { rc = DET_NOMEM; goto done; }
                if (id == -1) {
                    if (n > max_states) { rc = DET_STATES; goto done; }
                    if (n == out->cap) {  /* the pairs grow with the result */
                        if (!result_grow(out, n)) { rc = DET_NOMEM; goto done; }
                        int32_t *p1 = (int32_t *)realloc(pair_a, (size_t)out->cap * sizeof(int32_t));
                        if (p1) pair_a = p1;
                        int32_t *p2 = p1 ? (int32_t *)realloc(pair_b, (size_t)out->cap * sizeof(int32_t)) : NULL;
                        if (!p2) { rc = DET_NOMEM; goto done; }
                        pair_b = p2;
                    }
                    pair_a[n] = tx;
                    pair_b[n] = ty;
                    int yb = ty >= 0 && acc_b[ty];
                    out->acc[n] = acc_a[tx] && (keep_b ? yb : !yb);
                    id = (int32_t)n++;
                }
            }
            if (s >= 0) out->trans[s * nc + q] = id;
        }
    }
    out->n_states = n;
    rc = DET_OK;
done:
    free(m.keys); free(m.vals); free(pair_a); free(pair_b);
    *status = rc;
    return out;
}

/* ---- the code-point-counting product of `constrain.schema._Compiler.length_bounded` ---- */

enum { LP_SATURATED = -1, LP_NONE = -2 };

/* A product state's count as `length_bounded`'s `normal` keeps it: saturated once every continuation of q fits. */
static inline int64_t lp_normal(int32_t q, int64_t c, const int64_t *fewest, const int64_t *most, int64_t lo,
                                int64_t top, int32_t has_hi) {
    if (c == LP_SATURATED) return LP_SATURATED;
    if (top - c < fewest[q]) return LP_NONE;
    if (c >= lo && (!has_hi || top - c >= most[q])) return LP_SATURATED;
    if (c < lo && most[q] < lo - c) return LP_NONE;
    return c;
}

/* States (q, c) of DFA `succ` (n x k targets, -1 none; `weight[j]` 1 when class j's bytes start a code point) and
   a code point count c (or saturated), breadth first from (start, normal(start, 0)), classes in order; accepting
   when q accepts and c is saturated or within lo..hi. `fewest`/`most`: code points from q to acceptance (most
   2^60 when unbounded). The state budget, the deadline and the cancel flags as in `constrain_determinise`. */
void *constrain_length_product(int32_t n, int32_t k, const int32_t *succ, const int32_t *weight,
                               const int64_t *fewest, const int64_t *most, const uint8_t *acc, int32_t start,
                               int64_t lo, int64_t hi, int32_t has_hi, int64_t max_states, double deadline,
                               const int64_t *cancel, int32_t n_cancel, int32_t *status) {
    det_ctx c;
    det_result *out = pass_begin(k, &c, deadline, cancel, n_cancel);
    if (!out) { *status = DET_NOMEM; return NULL; }
    idmap m = {0};
    int32_t *at_q = NULL;
    int64_t *at_c = NULL, count = 0;
    int rc = DET_NOMEM;
    const int64_t top = has_hi ? hi : (int64_t)1 << 60;
    const int64_t width = (has_hi ? hi : lo) + 2;  /* counts -1 (saturated) .. max(lo, hi) */
    if (!idmap_init(&m)) goto done;
    int64_t c0 = lp_normal(start, 0, fewest, most, lo, top, has_hi);
    for (int64_t s = -1; s < count; s++) {
        if (s >= 0 && (rc = det_tick(&c, 1))) goto done;
        int32_t q = s < 0 ? -1 : at_q[s];
        int64_t cq = s < 0 ? 0 : at_c[s];
        for (int32_t j = 0; j < (s < 0 ? 1 : k); j++) {
            int32_t t = s < 0 ? start : succ[(int64_t)q * k + j];
            int64_t ct = s < 0 ? c0 : t < 0 ? LP_NONE : lp_normal(t, cq == LP_SATURATED ? cq : cq + weight[j], fewest,
                                                                  most, lo, top, has_hi);
            int32_t id = -1;
            if (ct != LP_NONE) {
                id = idmap_get_or_add(&m, (int64_t)t * width + ct + 1, (int32_t)count);
                if (id == -2) { rc = DET_NOMEM; goto done; }  /* (rc holds det_tick's DET_OK by now) */
                if (id == -1) {
                    if (count >= max_states) { rc = DET_STATES; goto done; }
                    if (count == out->cap) {  /* the (q, c) arrays grow with the result */
                        if (!result_grow(out, count)) { rc = DET_NOMEM; goto done; }
                        int32_t *q2 = (int32_t *)realloc(at_q, (size_t)out->cap * sizeof(int32_t));
                        if (q2) at_q = q2;
                        int64_t *c2 = q2 ? (int64_t *)realloc(at_c, (size_t)out->cap * sizeof(int64_t)) : NULL;
                        if (!c2) { rc = DET_NOMEM; goto done; }
                        at_c = c2;
                    }
                    at_q[count] = t;
                    at_c[count] = ct;
                    out->acc[count] = acc[t] && (ct == LP_SATURATED || (lo <= ct && ct <= top));
                    id = (int32_t)count++;
                }
            }
            if (s >= 0) out->trans[s * k + j] = id;
        }
    }
    out->n_states = count;
    rc = DET_OK;
done:
    free(m.keys); free(m.vals); free(at_q); free(at_c);
    *status = rc;
    return out;
}

/* ---- merging equal columns ---- */

typedef struct { int64_t key; int32_t col; } col_key;

static int col_key_cmp(const void *a, const void *b) {
    const col_key *x = (const col_key *)a, *y = (const col_key *)b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->col < y->col ? -1 : x->col > y->col;
}

/* The distinct columns of an n x k table (row-major int32) side by side in `out` (n x d, row-major): each column keyed
   by the sum of weights[i] * table[i, j] (the caller's keys, `automaton._unique_columns`: in double while `exact`,
   where every sum is an integer below 2**53, else in wrapping int64), the distinct keys in ascending order, each
   one's first column (`first`) copied, and each column's rank there (`inverse`). Returns d, the distinct count; -1
   when two columns share a key but differ (the caller sorts them instead), -2 when out of memory. */
int32_t constrain_unique_columns(int32_t n, int32_t k, const int32_t *table, const int64_t *weights, int32_t exact,
                                 int32_t *first, int32_t *inverse, int32_t *out) {
    col_key *keys = (col_key *)malloc(((size_t)k + 1) * sizeof(col_key));
    void *sum = calloc((size_t)k + 1, 8);  /* the sums: double when exact, else uint64 */
    double *fsum = (double *)sum;
    uint64_t *isum = (uint64_t *)sum;
    if (!keys || !sum) { free(keys); free(sum); return -2; }
    if (exact) {
        for (int32_t i = 0; i < n; i++) {
            const int32_t *row = table + (int64_t)i * k;
            double w = (double)weights[i];
            for (int32_t j = 0; j < k; j++) fsum[j] += w * (double)row[j];
        }
        for (int32_t j = 0; j < k; j++) keys[j].key = (int64_t)fsum[j];
    } else {
        for (int32_t i = 0; i < n; i++) {
            const int32_t *row = table + (int64_t)i * k;
            uint64_t w = (uint64_t)weights[i];
            for (int32_t j = 0; j < k; j++) isum[j] += w * (uint64_t)(int64_t)row[j];
        }
        for (int32_t j = 0; j < k; j++) keys[j].key = (int64_t)isum[j];
    }
    free(sum);
    for (int32_t j = 0; j < k; j++) keys[j].col = j;
    qsort(keys, (size_t)k, sizeof(col_key), col_key_cmp);
    int32_t d = 0;
    for (int32_t r = 0; r < k; r++) {
        int32_t j = keys[r].col;
        if (r == 0 || keys[r].key != keys[r - 1].key) {
            first[d++] = j;
        } else {
            int32_t f = first[d - 1];
            for (int32_t i = 0; i < n; i++)
                if (table[(int64_t)i * k + j] != table[(int64_t)i * k + f]) { free(keys); return -1; }
        }
        inverse[j] = d - 1;
    }
    free(keys);
    for (int32_t i = 0; i < n; i++) {
        const int32_t *row = table + (int64_t)i * k;
        int32_t *dst = out + (int64_t)i * d;
        for (int32_t c = 0; c < d; c++) dst[c] = row[first[c]];
    }
    return d;
}
"""


class NativeAutomata:
    """The loaded library (see the module docstring)."""

    def __init__(self, lib: ctypes.CDLL):
        p = ctypes.c_void_p
        self._det = lib.constrain_determinise
        self._det.argtypes = [ctypes.c_int32, p, p, p, p, p, p, p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                              ctypes.c_int64, ctypes.c_double, p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
        self._det.restype = ctypes.c_void_p
        self._det_states = lib.constrain_det_states
        self._det_states.argtypes = [p]
        self._det_states.restype = ctypes.c_int64
        self._det_copy = lib.constrain_det_copy
        self._det_copy.argtypes = [p, p, p]
        self._det_copy.restype = None
        self._det_free = lib.constrain_det_free
        self._det_free.argtypes = [p]
        self._det_free.restype = None
        self._walk = lib.constrain_walk
        self._walk.argtypes = [p, ctypes.c_int32, p, p, p, p, p, ctypes.c_int32, p, p, ctypes.c_int32]
        self._walk_delta = lib.constrain_walk_delta
        self._walk_delta.argtypes = [p, ctypes.c_int32, p, p, p, p, p, p, ctypes.c_int32, p, p]
        self._walk_delta.restype = ctypes.c_int64
        self._xflags = lib.constrain_xflags
        self._xflags.argtypes = [ctypes.c_int32, p, p, p, ctypes.c_int32, p, p, p, p]
        self._xflags.restype = ctypes.c_int64
        self._pair_check = lib.constrain_pair_check
        self._pair_check.argtypes = [p, ctypes.c_int32, p, ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32,
                                     ctypes.c_int32, ctypes.c_int32, p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                     ctypes.POINTER(ctypes.c_int32)]
        self._pair_check.restype = ctypes.c_int32
        self._walk_many = lib.constrain_walk_many
        self._walk_many.argtypes = [p, p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_int64, p, p, p, ctypes.c_int32, p, p, p, ctypes.c_int64]
        self._walk_many.restype = ctypes.c_int32
        self._walk_counted = lib.constrain_walk_counted
        self._walk_counted.argtypes = [p, p, p, ctypes.c_int32, ctypes.c_int32, p]
        self._walk_counted.restype = ctypes.c_int64
        # (through a PyDLL handle: the GIL stays held, as a cursor's step is shorter than a GIL hand-over)
        held = ctypes.PyDLL(lib._name)
        self._step = held.constrain_step
        self._step.argtypes = [p, ctypes.c_char_p, ctypes.c_int32, p, p]
        self._step.restype = None
        self._step_plain = held.constrain_step_plain
        self._step_plain.argtypes = [p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64]
        self._step_plain.restype = ctypes.c_int64
        self._first_live = lib.constrain_first_live
        self._first_live.argtypes = [p, ctypes.c_int32]
        self._first_live.restype = ctypes.c_int32
        self._walk.restype = ctypes.c_int64
        self._product = lib.constrain_product
        self._product.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32,
                                  ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32,
                                  ctypes.c_int32, p, p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double, p,
                                  ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
        self._product.restype = ctypes.c_void_p
        self._glue = lib.constrain_glue
        self._glue.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, p, p, p, p, p, p]
        self._glue.restype = ctypes.c_int64
        self._finish = lib.constrain_finish
        self._finish.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32]
        self._finish.restype = ctypes.c_void_p
        self._length_product = lib.constrain_length_product
        self._length_product.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, p, p, p, ctypes.c_int32, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int32, ctypes.c_int64, ctypes.c_double, p,
                                         ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
        self._length_product.restype = ctypes.c_void_p
        self._token_bound = lib.constrain_token_bound
        self._token_bound.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, p, p, p, p, p, p, ctypes.c_int32,
                                      ctypes.c_int32, ctypes.c_int64, p]
        self._token_bound.restype = ctypes.c_int32
        self._min = lib.constrain_minimise
        self._min.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32, p]
        self._min.restype = ctypes.c_int32
        self._unique_cols = lib.constrain_unique_columns
        self._unique_cols.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32, p, p, p]
        self._unique_cols.restype = ctypes.c_int32
        self._tick_gap = lib.constrain_tick_gap
        self._tick_gap.argtypes = [ctypes.c_int32, ctypes.c_int32, p, p, ctypes.c_int32, ctypes.c_int8, ctypes.c_int8,
                                   ctypes.c_int32]
        self._tick_gap.restype = ctypes.c_int32

    def determinise(
        self,
        n_nodes: int,
        eps_src: Sequence[int],
        eps_dst: Sequence[int],
        edge_src: Sequence[int],
        edge_mask: Sequence[int],
        edge_dst: Sequence[int],
        classes_of_mask: Sequence[Sequence[int]],
        n_classes: int,
        start: int,
        final: int,
        max_states: int,
        deadline: float | None,
        cancel_flags: Sequence[ctypes.c_int32],
        blocks: Sequence[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = (),
    ) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """Subset construction of the NFA of `n_nodes` nodes: epsilon moves `eps_src[i] -> eps_dst[i]` and edges
        `edge_src[i] -> edge_dst[i]` reading mask `edge_mask[i]`, whose symbol classes `classes_of_mask` lists per
        mask; a node's moves are taken in the order given. `blocks`: more edges, `(first node, src, dst, mask)` arrays
        per embedded DFA (an edge from node `first + src[g]` to `first + dst[g]` reading mask `mask[g]`), after the
        listed edges of each node.

        Returns (status, transitions [states x n_classes] int32 with -1 for none, accepting bool): status `DET_OK`,
        or `DET_STATES` (more than `max_states` + 1 states), `DET_TIME` (past the `time.monotonic()` instant
        `deadline`), `DET_CANCELLED` (a flag set), with no arrays. Raises MemoryError when C runs out of memory.
        """
        n = int(n_nodes)
        eps_off, order = _by_source(n, np.asarray(eps_src, np.int32))
        eps_to = np.asarray(eps_dst, np.int32)[order]
        srcs, masks, dsts = [np.asarray(edge_src, np.int32)], [np.asarray(edge_mask, np.int32)], [np.asarray(edge_dst, np.int32)]
        for base, src, dst, mask in blocks:
            srcs.append(src + np.int32(base))
            dsts.append(dst + np.int32(base))
            masks.append(np.asarray(mask, np.int32))
        edge_off, order = _by_source(n, np.concatenate(srcs))
        edge_mask_arr = np.concatenate(masks)[order]
        edge_dst_arr = np.concatenate(dsts)[order]
        mask_off = np.zeros(len(classes_of_mask) + 1, np.int32)
        np.cumsum([len(c) for c in classes_of_mask], out=mask_off[1:])
        mask_cls = np.fromiter(chain.from_iterable(classes_of_mask), np.int32, int(mask_off[-1]))
        flags = (ctypes.c_int64 * max(1, len(cancel_flags)))(*[ctypes.addressof(f) for f in cancel_flags])
        status = ctypes.c_int32(DET_NOMEM)
        handle = self._det(n, eps_off.ctypes.data, eps_to.ctypes.data, edge_off.ctypes.data, edge_mask_arr.ctypes.data,
                           edge_dst_arr.ctypes.data, mask_off.ctypes.data, mask_cls.ctypes.data, n_classes, start, final,
                           max_states, -1.0 if deadline is None else float(deadline), flags, len(cancel_flags),
                           ctypes.byref(status))
        return self._result(handle, status.value, n_classes)

    def product(self, a: tuple[np.ndarray, np.ndarray, int], b: tuple[np.ndarray, np.ndarray, int] | None,
                pa: np.ndarray, pb: np.ndarray, keep_b: bool, max_states: int, deadline: float | None,
                cancel_flags: Sequence[ctypes.c_int32]) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """Intersection (`keep_b`) or difference of DFAs `a` and `b` (each (transitions, accepting, start); `b` None
        when empty), breadth-first over product classes: class c reads class `pa[c]` of a and `pb[c]` of b (-1:
        none). Returns (status, transitions, accepting) as `determinise` does (states not trimmed)."""
        ta, acc_a, sa = np.ascontiguousarray(a[0], np.int32), np.ascontiguousarray(a[1], np.uint8), a[2]
        if b is None:
            tb, acc_b, sb = np.zeros((0, 1), np.int32), np.zeros(1, np.uint8), -1
        else:
            tb, acc_b, sb = np.ascontiguousarray(b[0], np.int32), np.ascontiguousarray(b[1], np.uint8), b[2]
        pa = np.ascontiguousarray(pa, np.int32)
        pb = np.ascontiguousarray(pb, np.int32)
        flags = (ctypes.c_int64 * max(1, len(cancel_flags)))(*[ctypes.addressof(f) for f in cancel_flags])
        status = ctypes.c_int32(DET_NOMEM)
        handle = self._product(ta.shape[0], ta.shape[1], ta.ctypes.data, acc_a.ctypes.data, sa,
                               tb.shape[0], tb.shape[1], tb.ctypes.data, acc_b.ctypes.data, sb,
                               len(pa), pa.ctypes.data, pb.ctypes.data, int(keep_b), max_states,
                               -1.0 if deadline is None else float(deadline), flags, len(cancel_flags),
                               ctypes.byref(status))
        return self._result(handle, status.value, len(pa))

    def length_product(self, succ: np.ndarray, weight: np.ndarray, fewest: Sequence[int], most: Sequence[int],
                       accepting: np.ndarray, start: int, lo: int, hi: int | None, max_states: int,
                       deadline: float | None, cancel_flags: Sequence[ctypes.c_int32]
                       ) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        """The code-point-counting product of `constrain.schema._Compiler.length_bounded` over DFA `succ` (int32
        [n x k], -1 none; `weight[j]` 1 when class j starts a code point), `fewest`/`most` code points to acceptance
        per state (2^60 for unbounded). Returns (status, transitions, accepting) as `determinise` does; no states
        when the start itself cannot fit."""
        succ = np.ascontiguousarray(succ, np.int32)
        n, k = succ.shape
        weight = np.ascontiguousarray(weight, np.int32)
        few = np.ascontiguousarray(fewest, np.int64)  # at most 2^60 (the caller's "unbounded")
        mst = np.ascontiguousarray(most, np.int64)
        acc = np.ascontiguousarray(accepting, np.uint8)
        flags = (ctypes.c_int64 * max(1, len(cancel_flags)))(*[ctypes.addressof(f) for f in cancel_flags])
        status = ctypes.c_int32(DET_NOMEM)
        handle = self._length_product(n, k, succ.ctypes.data, weight.ctypes.data, few.ctypes.data, mst.ctypes.data,
                                      acc.ctypes.data, start, lo, 0 if hi is None else hi, int(hi is not None),
                                      max_states, -1.0 if deadline is None else float(deadline), flags,
                                      len(cancel_flags), ctypes.byref(status))
        return self._result(handle, status.value, k)

    def _result(self, handle, status: int, n_classes: int) -> tuple[int, np.ndarray | None, np.ndarray | None]:
        try:
            if status == DET_NOMEM or not handle:
                raise MemoryError("a native automaton pass ran out of memory")
            if status != DET_OK:
                return status, None, None
            n_states = int(self._det_states(handle))
            trans = np.empty((n_states, n_classes), np.int32)
            acc = np.empty(n_states, np.uint8)
            self._det_copy(handle, trans.ctypes.data, acc.ctypes.data)
            return DET_OK, trans, acc.astype(bool)
        finally:
            if handle:
                self._det_free(handle)

    def finish(self, trans: np.ndarray, accepting: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """The minimal DFA of (`trans`, `accepting`, `start`): trimmed, minimised, states numbered breadth-first from
        the start (state 0) over classes ascending. Returns (transitions int32 [n' x k], accepting bool [n']); no
        states when the language is empty."""
        trans = np.ascontiguousarray(trans, dtype=np.int32)
        n, k = trans.shape
        acc = np.ascontiguousarray(accepting, dtype=np.uint8)
        handle = self._finish(n, k, trans.ctypes.data, acc.ctypes.data, int(start))
        if not handle:
            raise MemoryError("the native DFA minimisation ran out of memory")
        try:
            n_states = int(self._det_states(handle))
            out = np.empty((n_states, k), np.int32)
            out_acc = np.empty(n_states, np.uint8)
            self._det_copy(handle, out.ctypes.data, out_acc.ctypes.data)
            return out, out_acc.astype(bool)
        finally:
            self._det_free(handle)

    def unique_columns(self, table: np.ndarray, weights: np.ndarray, exact: bool) -> tuple[np.ndarray, np.ndarray] | None:
        """`automaton._unique_columns` of the int32 table (C-contiguous n x k) keyed with int64 `weights` [n], summed
        in double when `exact` (every key an integer below 2**53): (the distinct columns side by side, ascending by
        key, int32 [n x d]; each column's index there, int32 [k]), or None when two columns share a key but differ."""
        n, k = table.shape
        first = np.empty(max(k, 1), np.int32)
        inverse = np.empty(max(k, 1), np.int32)
        out = np.empty(max(n * k, 1), np.int32)
        d = self._unique_cols(n, k, table.ctypes.data, weights.ctypes.data, int(exact), first.ctypes.data,
                              inverse.ctypes.data, out.ctypes.data)
        if d == -2:
            raise MemoryError("the native column merge ran out of memory")
        if d < 0:
            return None
        return out[: n * d].reshape(n, d), inverse[:k]

    def token_bound(self, trans: np.ndarray, use: np.ndarray, rep: np.ndarray, accepting: np.ndarray, trie,
                    none: int) -> np.ndarray:
        """Per state of `trans`, an upper bound on the fewest tokens to acceptance along a shortest path over the
        classes `use` marks (`rep[c]`: a byte of class c that is a token by itself, -1 for a special symbol's class),
        its bytes split into `trie`'s tokens; `none` where no such path exists (int64 [n])."""
        trans = np.ascontiguousarray(trans, dtype=np.int32)
        n, k = trans.shape
        arrays = [np.ascontiguousarray(use, dtype=np.uint8), np.ascontiguousarray(rep, dtype=np.int32),
                  np.ascontiguousarray(accepting, dtype=np.uint8), np.ascontiguousarray(trie.node_byte, np.uint8),
                  *(np.ascontiguousarray(a, dtype=np.int32) for a in (trie.child_start, trie.child_count,
                                                                      trie.term_count))]
        out = np.empty(n, np.int64)
        ds = trie.depth_start
        if self._token_bound(n, k, trans.ctypes.data, *(a.ctypes.data for a in arrays), int(ds[0]),
                             int(ds[1]) if len(ds) > 1 else int(ds[0]), int(none), out.ctypes.data):
            raise MemoryError("the native token bound ran out of memory")
        return out

    def glue(self, tables: Sequence[np.ndarray], accepting: Sequence[np.ndarray], starts: Sequence[int],
             skips: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """`automaton._glue_all` of the parts (tables int32 [n_i x k], accepting bool [n_i], start states; `skips[i]`
        the part i's accepting states also step into, or -1) in C: (table, accepting) of the glued automaton, or None
        when two parts overlap."""
        n_parts = len(tables)
        k = tables[0].shape[1]
        sizes = [t.shape[0] for t in tables]
        starts, skips = [int(x) for x in starts], [int(x) for x in skips]
        if (len(starts), len(skips), len(accepting)) != (n_parts, n_parts, n_parts) or any(
                t.shape[1] != k or not 0 <= st < n or a.shape != (n,) or t.dtype != np.int32 or a.dtype != bool
                for t, a, st, n in zip(tables, accepting, starts, sizes)):
            # (the C pass reads them unchecked)
            raise ValueError("glue: int32 tables of k columns, one bool flag a state, one start inside and one skip "
                             "per part")
        # each distinct array's address once (a part repeated, an array's item, is one object; ~3 us a lookup)
        address: dict[int, int] = {}
        keep = []  # (contiguous copies of the flags, alive through the call)
        for t, a in zip(tables, accepting):
            if id(t) not in address:
                address[id(t)] = t.ctypes.data  # (any layout: strides below)
            if id(a) not in address:
                flags = a if a.flags.c_contiguous else np.ascontiguousarray(a)
                keep.append(flags)
                address[id(a)] = flags.ctypes.data
        room = sum(sizes)
        out = np.empty((room, k), np.int32)
        acc = np.empty(room, np.uint8)
        ints, vp = ctypes.c_int32 * n_parts, ctypes.c_void_p * n_parts
        strides = (ctypes.c_int64 * (2 * n_parts))(*[x // 4 for t in tables for x in t.strides])
        rows = int(self._glue(n_parts, k, vp(*[address[id(t)] for t in tables]), strides,
                              vp(*[address[id(a)] for a in accepting]), ints(*sizes), ints(*starts), ints(*skips),
                              out.ctypes.data, acc.ctypes.data))
        if rows == -2:
            raise MemoryError("the native glue ran out of memory")
        if rows < 0:
            return None
        return out[:rows], acc[:rows].view(bool)

    def minimise(self, trans: np.ndarray, block0: np.ndarray, n0: int) -> tuple[np.ndarray, int]:
        """Each state's block in the coarsest congruence of the trimmed DFA `trans` that refines `block0` (ids
        0..n0-1, all used), and the number of blocks. Block ids are arbitrary (not in order of first appearance).
        The partition `finish` minimises with; exposed so tests can hold it against the exact Moore refinement."""
        trans = np.ascontiguousarray(trans, dtype=np.int32)
        n, k = trans.shape
        b0 = np.ascontiguousarray(block0, dtype=np.int32)
        out = np.empty(n, np.int32)
        n_blocks = int(self._min(n, k, trans.ctypes.data, b0.ctypes.data, n0, out.ctypes.data))
        if n_blocks < 0:
            raise MemoryError("the native minimisation ran out of memory")
        return out.astype(np.int64), n_blocks


    def tick_gap(self, trans: np.ndarray, effect: np.ndarray, cap: int, tick: int, none: int, start: int = -1) -> int:
        """`index._tick_gap` in C: the fewest bytes from a state right after a `tick` transition (from `start`, if
        given) to the next one, that tick's byte included, stepping on `none` transitions in between, or `cap` when it
        is `cap` or more (`effect`: int8, the shape of `trans`)."""
        trans = np.ascontiguousarray(trans, dtype=np.int32)
        effect = np.ascontiguousarray(effect, dtype=np.int8)
        n, k = trans.shape
        if not -1 <= start < n or effect.shape != trans.shape:
            raise ValueError(f"tick_gap: start {start} outside -1..{n - 1}, or effect {effect.shape} is not the "
                             f"table's {trans.shape}")  # (the C search indexes its buffers by state unchecked)
        gap = int(self._tick_gap(n, k, trans.ctypes.data, effect.ctypes.data, int(cap), int(tick), int(none),
                                 int(start)))
        if gap < 0:
            raise MemoryError("the native tick gap ran out of memory")
        return gap

    def walker(self, tflat: np.ndarray, n_classes: int, byte_class: np.ndarray, trie, n_words: int,
               accepting: np.ndarray, eos: Sequence[int], specials: Sequence[int], special_classes: Sequence[int]
               ) -> "TrieWalker":
        """A walker of the int32 transition table `tflat` (row-major, n_classes per state, the last row dead) over
        `trie`, whose bytes have the DFA classes `byte_class` (256); masks of `n_words` words with the `eos` ids
        allowed in `accepting` states and each of `specials` allowed where its class (`special_classes`) has a
        transition."""
        return TrieWalker(self, tflat, n_classes, byte_class, trie, n_words, accepting, eos, specials,
                          special_classes)

    def stepper(self, tflat: np.ndarray, n_classes: int, byte_class: np.ndarray, effect: np.ndarray | None = None,
                limits: Sequence[int] | None = None, spill: np.ndarray | None = None,
                refill: np.ndarray | None = None, max_spilled: int = 0) -> "Stepper":
        """A cursor's byte walk over the int32 table `tflat` (see `Stepper`); with counters, their flat `effect` and
        `limits`; with deep values, their flat `spill` and `refill` (`automaton.Counters`) and the most kinds the
        stack holds (`automaton.MAX_SPILLED`)."""
        return Stepper(self, tflat, n_classes, byte_class, effect, limits, spill, refill, max_spilled)


class Stepper:
    """`automaton.walk_counted` in C for one index's tables (kept alive here): a cursor's step over one token."""

    __slots__ = ("_keep", "_ctx", "_plain", "_step", "_stacked")

    def __init__(self, lib: NativeAutomata, tflat: np.ndarray, n_classes: int, byte_class: np.ndarray,
                 effect: np.ndarray | None, limits: Sequence[int] | None, spill: np.ndarray | None,
                 refill: np.ndarray | None, max_spilled: int = 0):
        if tflat.dtype != np.int32 or not tflat.flags.c_contiguous:
            raise ValueError(f"the stepper walks a contiguous int32 table, got {tflat.dtype} "
                             f"({'' if tflat.flags.c_contiguous else 'not '}contiguous)")
        self._stacked = spill is not None
        keep = [tflat, np.ascontiguousarray(byte_class[:256], np.int32)]
        for arr, dtype in ((effect, np.int8), (None if limits is None else np.asarray(limits), np.int64),
                           (spill, np.int8), (refill, np.int64)):
            keep.append(None if arr is None else np.ascontiguousarray(np.ravel(arr), dtype))
        self._keep = keep
        address = [0 if a is None else a.ctypes.data for a in keep]
        self._ctx = np.array([address[0], n_classes, *address[1:], max_spilled], np.int64)
        ctx = self._ctx.ctypes.data
        self._plain = functools.partial(lib._step_plain, ctx)
        self._step = functools.partial(lib._step, ctx)

    def addresses(self) -> tuple[int, int, int]:
        """The addresses of the C walks `counted` and `plain` call and of this stepper's context (alive while it is):
        what `stepping.module().walker` takes."""
        return (ctypes.cast(self._step.func, ctypes.c_void_p).value, ctypes.cast(self._plain.func, ctypes.c_void_p).value,
                int(self._ctx.ctypes.data))

    def plain(self, data: bytes, state: int) -> int:
        """The state after `data` from `state` (no counters read), or `-2 - at` where it dies at byte `at`."""
        return self._plain(data, len(data), state)

    def counted(self, data: bytes, state: int, count: int, limit: int, stack: tuple[int, ...]
                ) -> tuple[int, int, int, int, tuple[int, ...]]:
        """`walk_counted` of `data` from `state`: `(state, count, limit, at, stack)`, the stack as a new tuple when
        the index keeps deep values (else `stack` itself)."""
        n = len(data)
        io = array.array("q", (state, count, limit, -1, len(stack)))
        if not self._stacked:
            self._step(data, n, io.buffer_info()[0], None)
            return io[0], io[1], io[2], io[3], stack
        buf = array.array("i", stack)
        buf.frombytes(bytes(4 * n))
        self._step(data, n, io.buffer_info()[0], buf.buffer_info()[0])
        return io[0], io[1], io[2], io[3], tuple(buf[: io[4]])


def _by_source(n: int, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Moves grouped by source node, each node's in the order given: `(off, order)`, node v's moves being
    `order[off[v] .. off[v + 1]]` (a stable sort by source)."""
    off = np.zeros(n + 1, np.int32)
    if len(src):
        np.cumsum(np.bincount(src, minlength=n), out=off[1:])
    return off, np.argsort(src, kind="stable")


def sparse_key(mask: np.ndarray) -> bytes:
    """A mask's key for deduplication: its nonzero words (index, value) when at most `SPARSE_MAX`, else its bytes
    (what `TrieWalker.mask` gives without reading the whole mask again in Python)."""
    words = mask.view(np.int32)
    nz = np.flatnonzero(words)
    if nz.shape[0] > SPARSE_MAX:
        return b"f" + words.tobytes()
    return b"s" + np.column_stack([nz.astype(np.int32), words[nz]]).tobytes()


SPARSE_MAX = 64
# The token lengths `TrieWalker._derive_short` splits a vocabulary at (`_short_flags`: one flag set per trie and
# length); the first is also where a pair search without X stops (`TrieWalker._DEEP_AGREE`).
_SHORT_DEPTHS = (12, 16, 24, 32, 48, 64, 96)


class TrieWalker:
    """One index's trie walk in C: the arrays it reads are held here (contiguous) and passed by address.

    Shared walks. A wide state (string content, free text: most of the trie live) costs a walk of most of the trie
    (0.3-1 ms on 128k-262k vocabularies). Its mask is instead derived from an earlier wide state p of this DFA, or
    from a reference state of another DFA over the same trie (`use_references`: a JSON string's content), when the
    two keep the same byte strings live, up to the longest token, except strings through a small byte set X
    (`constrain_pair_check`; X is grown from the disagreements found, e.g. the closing quote of two string fields
    followed by different properties, or a byte only one of them takes): the tokens without a byte of X take p's
    bits, the others are walked from the state (`constrain_walk_delta`), visiting only the trie nodes that lead to
    them. With X empty, the same acceptance and the same live special tokens the state simply has p's row. When the
    search without X first fails d >= `_DEEP_AGREE` bytes deep (a string's content within the longest token of its
    maxLength: every content byte tells the two apart, but only past d of them), every string of at most d bytes
    agrees: the tokens that short take p's bits and only the longer ones are walked (`_derive_short`). Exact by
    construction; `tests/test_native.py` compares every state's mask with the full walk's.
    """

    # Depth first while at most n_nodes / _DENSE_SHARE nodes are live, else every node in order (see the C source).
    _DENSE_SHARE = 16
    # A state may take its mask from an earlier one's when its live first bytes lead to n_nodes / _WIDE_NODES nodes
    # or more, or once more than n_nodes / _SHARE_NODES nodes are live (a depth-first walk that far: 20-50 us on
    # Qwen3's 333k nodes).
    _WIDE_NODES = 8
    _SHARE_NODES = 64
    # The most recent walked or derived wide states kept, their masks copied; tried newest first.
    _REPS_MAX = 16
    # The pair search's bounds: state pairs reached, and classes added to X (one per round).
    _MAX_PAIRS = 4096
    _MAX_ROUNDS = 4
    # A pair search without X that fails this deep or deeper stops there: the tokens longer than it are walked
    # (`_derive_short`; a content state of a string within 128 characters of its maxLength, where X would have to
    # hold every content byte: 4-5 failed searches and a full walk before, ~0.5 ms a state on Llama 3).
    _DEEP_AGREE = _SHORT_DEPTHS[0]
    # `masks_many`: room for this many nonzero words per state walked, over its distinct masks together.
    _MANY_WORDS = 256

    def __init__(self, lib: "NativeAutomata", tflat: np.ndarray, n_classes: int, byte_class: np.ndarray,
                 trie, n_words: int, accepting: np.ndarray, eos: Sequence[int], specials: Sequence[int],
                 special_classes: Sequence[int]):
        parent = _parents(trie)
        byte_class = np.asarray(byte_class[:256], np.int64)
        keep = [np.ascontiguousarray(a, dtype=np.int32) for a in (tflat, byte_class, trie.child_start, trie.child_count,
                                                                   trie.term_start, trie.term_count, trie.term_tokens,
                                                                   parent, trie.term_node)]
        acc = np.ascontiguousarray(accepting, dtype=np.uint8)
        eos_arr = np.asarray(list(eos) or [0], np.int32)
        spec = np.asarray(list(specials) or [0], np.int32)
        spec_cls = np.asarray(list(special_classes) or [0], np.int32)
        # the byte classes: one DFA's joint classes with itself (not np.unique: its first call imports numpy.ma, 80 ms)
        own = np.flatnonzero(np.bincount(byte_class, minlength=n_classes)).astype(np.int32)
        first_below = _first_subtrees(trie)
        node_byte = np.ascontiguousarray(trie.node_byte, np.uint8)
        cls_bytes = np.argsort(byte_class, kind="stable").astype(np.uint8)  # the bytes of each class, class by class
        cls_off = np.zeros(n_classes + 1, np.int32)
        np.cumsum(np.bincount(byte_class, minlength=n_classes), out=cls_off[1:])
        runs = _digit_runs(trie)
        loop = None if runs is None else _digit_loops(keep[0], n_classes, byte_class)  # (no runs: Qwen, Gemma)
        digits = (0, 0, 0, 0) if loop is None or not loop.any() else (*(r.ctypes.data for r in runs), loop.ctypes.data)
        # alive as long as the walker: C reads them
        self._keep = (keep, acc, eos_arr, spec, spec_cls, own, first_below, node_byte, cls_bytes, cls_off, runs, loop)
        self._lib = lib
        self._fn = lib._walk
        self._trie = trie
        self._tflat = keep[0]
        self._k = n_classes
        self._byte_class = byte_class
        self._n_nodes = trie.n_nodes
        self._n_states = len(accepting)
        self._accepting = np.asarray(accepting, bool).tolist()
        self._n_words = n_words
        n_first = trie.depth_start[1] if trie.max_depth else 0
        self._dense_after = max(trie.n_nodes // self._DENSE_SHARE, 1)
        self._share_after = max(trie.n_nodes // self._SHARE_NODES, 1)
        self._args = (ctypes.c_int64 * 32)(
            keep[0].ctypes.data, n_classes, *(a.ctypes.data for a in keep[1:]), trie.n_nodes,
            int(trie.term_tokens.shape[0]), self._dense_after, n_first, max(trie.max_depth - 1, 0), n_words,
            acc.ctypes.data, len(eos), eos_arr.ctypes.data, len(specials), spec.ctypes.data, spec_cls.ctypes.data,
            self._share_after, first_below.ctypes.data, max(trie.n_nodes // self._WIDE_NODES, 1),
            node_byte.ctypes.data, cls_off.ctypes.data, cls_bytes.ctypes.data, *digits)
        self._live_bits: dict[int, int] = {}  # state -> `_live_classes`
        on_bytes = np.zeros(n_classes, np.uint8)
        on_bytes[own] = 1
        self._byte_classes = int.from_bytes(on_bytes.tobytes(), "little")  # `_live_classes`: byte classes only
        # the remembered states' live classes (how many of them have each): a state whose first bytes are exactly
        # one's looks for a mask to share before walking (it had walked n_nodes / _SHARE_NODES nodes first, 5,200 on
        # Qwen3: 40-160 us of the 90-230 us its derived mask cost on `required_50`)
        self._rep_live: dict[int, int] = {}
        self._local = threading.local()  # per thread: scratch buffers and their addresses
        self._reps: list[tuple[int, np.ndarray]] = []
        self._n_specials = len(specials)
        self._own_joint = (own, own, np.searchsorted(own, byte_class))
        self._refs: list[tuple[Reference, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
        self._reps_lock = threading.Lock()
        self.shared = 0  # masks derived from an earlier state's (for tests and benchmarks)

    def _buffers(self) -> tuple:
        b = getattr(self._local, "b", None)
        if b is None:
            nodes = np.empty(max(self._n_nodes, 1), np.int32)
            words = np.zeros(self._n_words, np.uint32)
            sparse = np.empty(1 + 2 * SPARSE_MAX, np.int32)
            touched = np.zeros(self._n_words + 1, np.int32)  # touched[0] = 0: `words` is all zero
            seen = np.zeros(self._n_states + 1, np.uint8)
            dests = np.zeros(self._n_states + 2, np.int32)  # dests[0] = 0: `seen` is all zero
            b = self._local.b = (nodes, words, sparse, touched, dests, seen,  # all kept alive: C holds addresses
                                 tuple(a.ctypes.data for a in (nodes, words, seen, sparse, touched, dests)))
        return b

    def mask(self, state: int, share: bool = True) -> tuple[np.ndarray | None, bytes | None, np.ndarray, int]:
        """The state's mask (uint32 words; a per-thread buffer, overwritten by the next call), its `sparse_key`, the
        distinct states its allowed non-EOS tokens lead to (in the order found), and -1. With `share` (a wide state
        may take its mask from an earlier one's) the destinations may be only some, and the result may instead be
        (None, None, no states, p): the mask is exactly that of the earlier state p."""
        _, words, sparse, _, dests, _, (nodes_at, words_at, seen_at, sparse_at, touched_at, dests_at) = self._buffers()
        if share and self._reps and self._live_classes(state) in self._rep_live:
            live = -2  # a remembered wide state's first bytes exactly: look for a mask to share before any walk
        else:
            live = self._fn(self._args, state, nodes_at, words_at, seen_at, None, sparse_at, SPARSE_MAX, touched_at,
                            dests_at, int(share))
        if live == -2:
            got = self._shared(state, self._candidates(state))
            if got is not None:
                self.shared += 1
            if got is not None and got >= 0:
                return None, None, dests[:0], got
            if got is None:
                live = self._fn(self._args, state, nodes_at, words_at, seen_at, None, sparse_at, SPARSE_MAX,
                                touched_at, dests_at, 0)
                if live > self._share_after:
                    self._remember(state, words)
        if live < 0 and live != -2:
            raise MemoryError("the native trie walk ran out of memory")
        n = int(sparse[0])
        key = b"f" + words.tobytes() if n < 0 else b"s" + sparse[1 : 1 + 2 * n].tobytes()
        return words, key, dests[1 : 1 + int(dests[0])], -1

    def masks_many(self, states: np.ndarray, max_first: int, live_max: int, live_floor: int | None = None,
                   waste_budget: int = 2**62) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The masks of many states from the C walk (`constrain_walk_many`): of those that at most `max_first` bytes
        leave live and whose walk keeps at most `live_max` trie nodes live (`live_floor` once the walks given up
        have found `waste_budget` nodes), while their distinct masks' nonzero words fit in `_MANY_WORDS` per state.

        At least `_SPLIT_STATES` states are walked as two halves at once, the second on a worker thread (the call
        releases the GIL), where this process may run on two cores: each half has its own share of `waste_budget`
        and of the words' room, and the same mask may come back from both halves as two distinct masks.

        Returns:
            `(local, off, data)`: `local[i]` the distinct mask of `states[i]` (-1: not computed), distinct mask u
            being its nonzero words' (index, value) pairs `data[off[u] : off[u + 1]]`, by index.
        """
        states = np.ascontiguousarray(states, np.int32)
        n = int(states.shape[0])
        pool = _walk_pool() if n >= _SPLIT_STATES else None
        # (one split at a time: an index built on another thread meanwhile walks in one call, not behind this one)
        if pool is None or not _SPLIT_FREE.acquire(blocking=False):
            return self._masks_many(states, max_first, live_max, live_floor, waste_budget)
        cut = n // 2
        try:
            later = pool.submit(self._masks_many, states[cut:], max_first, live_max, live_floor,
                                waste_budget - waste_budget * cut // n)
            first = self._masks_many(states[:cut], max_first, live_max, live_floor, waste_budget * cut // n)
            second = later.result()
        finally:
            _SPLIT_FREE.release()
        (local_a, off_a, data_a), (local_b, off_b, data_b) = first, second
        n_a = off_a.shape[0] - 1
        local = np.concatenate([local_a, np.where(local_b >= 0, local_b + n_a, -1).astype(np.int32)])
        off = np.concatenate([off_a, off_b[1:] + off_a[-1]])
        return local, off, np.concatenate([data_a, data_b])

    def _masks_many(self, states: np.ndarray, max_first: int, live_max: int, live_floor: int | None,
                    waste_budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`masks_many` of contiguous `states` in one C call (on the calling thread's buffers)."""
        n = int(states.shape[0])
        local = np.empty(n, np.int32)
        off = np.empty(n + 1, np.int32)
        cap = int(n * 2 * self._MANY_WORDS)
        data = np.empty(max(cap, 1), np.int32)  # virtual memory: pages are touched as filled
        sparse = np.empty(1 + 2 * self._n_words, np.int32)
        _, _, _, _, _, _, (_, words_at, _, _, touched_at, _) = self._buffers()
        floor = live_max if live_floor is None else live_floor
        got = self._lib._walk_many(self._args, states.ctypes.data, n, max_first, live_max, floor, waste_budget,
                                   words_at, touched_at, sparse.ctypes.data, self._n_words, local.ctypes.data,
                                   off.ctypes.data, data.ctypes.data, cap)
        if got < 0:
            raise MemoryError("the native trie walk ran out of memory")
        return local, off[: got + 1], data[: int(off[got])].copy()

    def counted(self, effect: np.ndarray, need: np.ndarray, state: int, room: int) -> tuple[np.ndarray, int]:
        """`constrain_walk_counted`: (the bits of the tokens from `state` that keep within `room` counts, as uint32
        words; the most counts any live token makes). `effect` int8 per (state, class) with the dead row last, `need`
        uint8 per state with the dead state last; both contiguous, kept by the caller."""
        words = np.zeros(self._n_words, np.uint32)
        most = self._lib._walk_counted(self._args, effect.ctypes.data, need.ctypes.data, int(state), int(room),
                                       words.ctypes.data)
        if most < 0:
            raise MemoryError("the native counted walk ran out of memory")
        return words, int(most)

    def _pattern(self, state: int) -> bytes:
        return (self._tflat[state * self._k : (state + 1) * self._k] >= 0).tobytes()

    def _remember(self, state: int, words: np.ndarray) -> None:
        bits = self._live_classes(state)
        with self._reps_lock:
            if len(self._reps) == self._REPS_MAX:
                # the oldest: the newest are likelier to be near the states still to come
                old = self._live_classes(self._reps.pop(0)[0])
                self._rep_live[old] -= 1
                if not self._rep_live[old]:
                    del self._rep_live[old]
            self._reps.append((state, words.copy()))
            self._rep_live[bits] = self._rep_live.get(bits, 0) + 1

    def _live_classes(self, state: int) -> int:
        """`state`'s live byte classes (`_own_joint`'s, as the pair search reads them), one byte of an int each
        (cached)."""
        bits = self._live_bits.get(state)
        if bits is None:  # `_pattern`'s bytes (~1 us): the XOR of two counts their differing classes
            bits = self._live_bits[state] = int.from_bytes(self._pattern(state), "little") & self._byte_classes
        return bits

    def _candidates(self, state: int) -> tuple[list, list]:
        """The remembered states (`(p, mask)`, newest first) and the reference states (`(ref, joint, p, mask)`) that
        `state` may share a mask with: those whose first bytes are live in at most `_MAX_ROUNDS` classes where
        `state`'s are not, or the other way round. More, and the pair search would fail for sure: each such class
        takes one of its rounds (on `nested_table`, Qwen3: 579 pair searches failed, every one with 6 or more such
        classes, 294 succeeded, with none; ~10 us each)."""
        mine = self._live_classes(state)
        own = [(p, base) for p, base in reversed(tuple(self._reps))  # a snapshot: another thread may replace one
               if (self._live_classes(p) ^ mine).bit_count() <= self._MAX_ROUNDS]
        refs = []
        if self._refs:
            row = self._tflat[state * self._k : (state + 1) * self._k] >= 0
            for ref, joint in self._refs:
                ja, jb, _ = joint
                for p, base in ref.states:
                    if int(np.count_nonzero((ref.tflat[p * ref.n_classes + ja] >= 0) != row[jb])) <= self._MAX_ROUNDS:
                        refs.append((ref, joint, p, base))
        return own, refs

    def _shared(self, state: int, candidates: tuple[list, list]) -> int | None:
        """A remembered state whose mask `state` has exactly, or -1 having filled this thread's buffers with
        `state`'s mask derived from a remembered state's or a reference state's (`use_references`); None when none
        fits. `candidates`: `_candidates(state)`."""
        own, refs = candidates
        for p, base in own:
            in_x, agree = self._pair(self._tflat, self._k, self._own_joint, p, state, self._DEEP_AGREE)
            if in_x is not None and not in_x.any() and self._accepting[p] == self._accepting[state] and (
                    not self._n_specials or self._pattern(p) == self._pattern(state)):
                return p
            if self._derived(state, base, in_x, agree):
                self._remember(state, self._buffers()[1])  # the states after it likely equal it: no walk at all
                return -1
        for ref, joint, p, base in refs:
            if self._derived(state, base, *self._pair(ref.tflat, ref.n_classes, joint, p, state, self._DEEP_AGREE)):
                self._remember(state, self._buffers()[1])  # this index's own states now derive from it
                return -1
        return None

    def _pair(self, tflat: np.ndarray, k: int, joint: tuple, p: int, state: int,
              stop_depth: int = 0) -> tuple[np.ndarray | None, int]:
        """`(X, 0)`: the byte set X (256 flags) that state p of `tflat` and `state` of this walker's DFA agree outside
        of (`constrain_pair_check`; `joint`: ja, jb, each byte's joint class), X None when there is none; or
        `(None, d)` when the search without X (its first round) fails d >= `stop_depth` (> 0) bytes deep: every
        string of at most d bytes then has the same liveness from both states."""
        ja, jb, of_byte = joint
        xj = np.zeros(ja.shape[0], np.uint8)
        agree = ctypes.c_int32(0)
        n_x = self._lib._pair_check(tflat.ctypes.data, k, self._tflat.ctypes.data, self._k, ja.shape[0],
                                    ja.ctypes.data, jb.ctypes.data, p, state, self._trie.max_depth, xj.ctypes.data,
                                    self._MAX_PAIRS, self._MAX_ROUNDS, stop_depth, ctypes.byref(agree))
        if n_x == -3:
            raise MemoryError("the native pair search ran out of memory")
        if n_x == -4:
            return None, int(agree.value)
        return (None if n_x < 0 else xj[of_byte]), 0

    def _derived(self, state: int, base: np.ndarray, in_x: np.ndarray | None, agree: int) -> bool:
        """`_derive` outside the byte set `in_x`, else `_derive_short` from the depth `agree` (0: neither)."""
        if in_x is not None:
            return self._derive(state, base, in_x)
        return agree > 0 and self._derive_short(state, base, agree)

    def _derive(self, state: int, base: np.ndarray, in_x: np.ndarray) -> bool:
        """Fill this thread's buffers with `state`'s mask from `base` outside the byte set `in_x` and a walk of the
        tokens through it; False when too much of the trie leads to such tokens for that to pay."""
        return self._from_base(state, base, _x_flags(self._lib, self._trie, in_x.tobytes(), self._n_words))

    def _derive_short(self, state: int, base: np.ndarray, agree: int) -> bool:
        """`_derive` for a state that agrees with `base`'s on every string of at most `agree` bytes: the tokens that
        short (`_SHORT_DEPTHS`: the longest listed depth within it) take `base`'s bits, the longer ones are walked."""
        depth = max((d for d in _SHORT_DEPTHS if d <= agree), default=0)
        return self._from_base(state, base, _short_flags(self._trie, depth, self._n_words) if depth else None)

    def _from_base(self, state: int, base: np.ndarray, x: tuple[np.ndarray, np.ndarray] | None) -> bool:
        """`constrain_walk_delta` into this thread's buffers: `x` is (the trie's node flags, the bits of the tokens
        that keep `base`'s); False for no `x` (the walk would not pay)."""
        if x is None:
            return False
        flags, kept = x
        _, _, _, _, _, _, (_, words_at, seen_at, sparse_at, touched_at, dests_at) = self._buffers()
        if self._lib._walk_delta(self._args, state, flags.ctypes.data, base.ctypes.data, kept.ctypes.data, words_at,
                                 seen_at, sparse_at, SPARSE_MAX, touched_at, dests_at) < 0:
            raise MemoryError("the native trie walk ran out of memory")
        return True

    def use_references(self, refs: Sequence["Reference"]) -> None:
        """Let wide states also derive their masks from these states of other DFAs over the same trie."""
        out = []
        for ref in refs:
            pairs = ref.byte_class.astype(np.int64) * self._k + self._byte_class
            uniq = np.flatnonzero(np.bincount(pairs, minlength=ref.n_classes * self._k))
            of_byte = np.searchsorted(uniq, pairs)
            out.append((ref, ((uniq // self._k).astype(np.int32), (uniq % self._k).astype(np.int32), of_byte)))
        self._refs = out

    def first_live(self, state: int) -> int:
        """How many first bytes of a token keep the DFA live from `state`."""
        return int(self._lib._first_live(self._args, state))

    def token_states(self, state: int, tok_state: np.ndarray) -> None:
        """Set `tok_state[t]` (int32 [n_tokens], -1 filled) to the state each live byte token t ends in."""
        words = np.empty(self._n_words, np.uint32)  # not the `mask` buffer, which is kept zero by its touched list
        nodes_at = self._buffers()[6][0]
        if self._fn(self._args, state, nodes_at, words.ctypes.data, None, tok_state.ctypes.data, None, 0, None,
                    None, 0) < 0:
            raise MemoryError("the native trie walk ran out of memory")


class Reference:
    """Wide states of a DFA (transitions `tflat`, row-major with a dead row last; `byte_class`: 256) and their
    masks over one trie, which the walkers of other DFAs over that trie may derive masks from."""

    def __init__(self, tflat: np.ndarray, n_classes: int, byte_class: np.ndarray,
                 states: Sequence[tuple[int, np.ndarray]]):
        self.tflat = np.ascontiguousarray(tflat, np.int32)
        self.n_classes = n_classes
        self.byte_class = np.asarray(byte_class[:256], np.int64)
        self.states = tuple((int(s), np.ascontiguousarray(words, np.uint32)) for s, words in states)


# A derived mask pays when the walk of X's tokens visits at most n_nodes / _X_NODES_SHARE trie nodes: that walk is
# depth first (~25-50 ns a node), a full walk of a wide state reads every node in order (~3 ns); at n_nodes / 8 a
# derived mask cost 2.0-3.2 ms where the full walk costs ~1 ms (nested_table, Qwen3 / Gemma 4: the slowest lazy row,
# 2.1 / 3.2 ms -> 0.35 / 0.70 ms at n_nodes / 16).
_X_NODES_SHARE = 16
_X_PER_TRIE = 16
_X_FLAGS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _x_flags(lib: "NativeAutomata", trie, in_x: bytes, n_words: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The trie's node flags and no-X token bits for the byte set `in_x` (256 flags), once per (trie, byte set,
    width); None when too many nodes lead to a token with a byte of X for a derived mask to pay."""
    with _lock:
        cache = _X_FLAGS.setdefault(trie, {})
        key = (in_x, n_words)
        if key in cache:
            return cache[key]
    n = trie.n_nodes
    flags = np.empty(max(n, 1), np.uint8)
    nox = np.zeros(n_words, np.uint32)
    node_byte = np.ascontiguousarray(trie.node_byte, np.uint8)
    term_node = np.ascontiguousarray(trie.term_node, np.int32)
    term_tokens = np.ascontiguousarray(trie.term_tokens, np.int32)
    x = np.frombuffer(in_x, np.uint8).copy()
    below = lib._xflags(n, node_byte.ctypes.data, _parents(trie).ctypes.data, x.ctypes.data,
                        int(term_tokens.shape[0]), term_node.ctypes.data, term_tokens.ctypes.data, flags.ctypes.data,
                        nox.ctypes.data)
    hit = (flags, nox) if below <= n // _X_NODES_SHARE else None
    with _lock:
        if len(cache) >= _X_PER_TRIE:
            cache.pop(next(iter(cache)))
        cache[key] = hit
    return hit


_SHORT_FLAGS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _short_flags(trie, depth: int, n_words: int) -> tuple[np.ndarray, np.ndarray] | None:
    """`_x_flags` for the tokens longer than `depth` bytes instead of those through a byte set: X_ON_PATH on the
    nodes deeper than `depth`, X_BELOW on those and their ancestors, and the bits of the tokens of at most `depth`
    bytes; None when too many nodes lead to a longer token for a derived mask to pay. Built for every depth of
    `_SHORT_DEPTHS` at once, once per (trie, width)."""
    with _lock:
        cache = _SHORT_FLAGS.get(trie, {}).get(n_words)
    if cache is None:
        ds = np.asarray(trie.depth_start, np.int64)
        node_depth = np.repeat(np.arange(1, len(ds), dtype=np.int32), np.diff(ds))
        deepest = node_depth.copy()  # the depth of the deepest node in each subtree, filled bottom-up
        parent = _parents(trie)
        for d in range(len(ds) - 1, 1, -1):
            nodes = np.arange(ds[d - 1], ds[d])
            np.maximum.at(deepest, parent[nodes], deepest[nodes])
        term_depth = node_depth[trie.term_node]
        cache = {}
        for d in _SHORT_DEPTHS:
            flags = np.where(node_depth > d, 3, np.where(deepest > d, 2, 0)).astype(np.uint8)  # X_ON_PATH | X_BELOW
            short = np.zeros(n_words * 32, bool)
            short[trie.term_tokens[term_depth <= d]] = True
            paying = np.count_nonzero(flags) <= trie.n_nodes // _X_NODES_SHARE
            cache[d] = (flags, np.packbits(short, bitorder="little").view(np.uint32)) if paying else None
        with _lock:
            _SHORT_FLAGS.setdefault(trie, {})[n_words] = cache
    return cache[depth]


_PARENTS: "weakref.WeakKeyDictionary[Any, np.ndarray]" = weakref.WeakKeyDictionary()


_FIRST_SUBTREES: "weakref.WeakKeyDictionary[Any, np.ndarray]" = weakref.WeakKeyDictionary()


def _first_subtrees(trie) -> np.ndarray:
    """int64 [n_first]: how many nodes each first-byte node's subtree holds (itself included), once per trie."""
    with _lock:
        hit = _FIRST_SUBTREES.get(trie)
    if hit is None:
        ds = trie.depth_start
        size = np.ones(trie.n_nodes, np.int64)
        for d in range(trie.max_depth - 1, 0, -1):  # depth d's parents are depth d-1's nodes, parent_local offsets
            size[ds[d - 1] : ds[d]] += np.bincount(trie.parent_local[ds[d] : ds[d + 1]],
                                                   weights=size[ds[d] : ds[d + 1]],
                                                   minlength=ds[d] - ds[d - 1]).astype(np.int64)
        hit = np.ascontiguousarray(size[: ds[1] if trie.max_depth else 0])
        with _lock:
            _FIRST_SUBTREES[trie] = hit
    return hit


def _parents(trie) -> np.ndarray:
    """int32 [n_nodes]: each node's parent as a global id (-1 for the first-byte nodes), once per trie."""
    with _lock:
        hit = _PARENTS.get(trie)
    if hit is None:
        ds = trie.depth_start
        hit = np.full(trie.n_nodes, -1, np.int32)
        for d in range(1, trie.max_depth):
            hit[ds[d] : ds[d + 1]] = trie.parent_local[ds[d] : ds[d + 1]] + ds[d - 1]
        with _lock:
            _PARENTS[trie] = hit
    return hit


# A node of at least this many descendants, all reading digits, is a digit run (`_digit_runs`).
_RUN_MIN_TOKENS = 4
_DIGIT_RUNS: "weakref.WeakKeyDictionary[Any, tuple | None]" = weakref.WeakKeyDictionary()


def _digit_runs(trie) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The trie's digit runs, once per trie: `(run_of, run_off, run_tok)`, `run_of[node]` (int32 [n_nodes]) the run
    of a node whose descendants (at least `_RUN_MIN_TOKENS` tokens) all read ASCII digits, else -1; run r's tokens
    `run_tok[run_off[r] : run_off[r + 1]]`. None when the vocabulary has none (digits are single tokens: Qwen, Gemma).

    A walk that reaches such a node in a state every digit leads back to (`_digit_loops`) sets those tokens' bits
    without walking the subtree (see `walk` in the C source): Llama 3 merges up to three digits into one of 1,110
    tokens, and each JSON number state kept ~1,100 trie nodes live (10-20 us a walk)."""
    with _lock:
        if trie in _DIGIT_RUNS:
            return _DIGIT_RUNS[trie]
    parent = _parents(trie)
    node_byte = np.asarray(trie.node_byte)
    digit = (node_byte >= 0x30) & (node_byte <= 0x39)
    ds = trie.depth_start
    mixed = np.zeros(trie.n_nodes, bool)  # a descendant reads a non-digit
    for d in range(trie.max_depth - 1, 0, -1):  # children before their parents
        lo, hi = ds[d], ds[d + 1]
        up = parent[lo:hi][~digit[lo:hi] | mixed[lo:hi]]
        mixed[up] = True
    # the tokens below each candidate: up from every token that ends in a digit, through digit nodes only
    cand = ~mixed & (np.asarray(trie.child_count) > 0)
    term_node = np.asarray(trie.term_node)
    pick = digit[term_node]
    node, tok = term_node[pick], np.asarray(trie.term_tokens)[pick]
    owners, toks = [], []
    while node.shape[0]:
        up = parent[node]
        ok = up >= 0
        node, tok, up = node[ok], tok[ok], up[ok]
        hit = cand[up]
        owners.append(up[hit])
        toks.append(tok[hit])
        keep = digit[up]  # above a non-digit node no ancestor is a candidate
        node, tok = up[keep], tok[keep]
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    tokens = np.concatenate(toks) if toks else np.zeros(0, np.int64)
    count = np.bincount(owner, minlength=trie.n_nodes)
    runs_at = np.flatnonzero(count >= _RUN_MIN_TOKENS)
    hit = None
    if runs_at.shape[0]:
        run_of = np.full(trie.n_nodes, -1, np.int32)
        run_of[runs_at] = np.arange(runs_at.shape[0], dtype=np.int32)
        keep = run_of[owner] >= 0
        order = np.argsort(run_of[owner[keep]], kind="stable")
        run_tok = np.ascontiguousarray(tokens[keep][order], np.int32)
        run_off = np.zeros(runs_at.shape[0] + 1, np.int32)
        np.cumsum(count[runs_at], out=run_off[1:])
        hit = (run_of, run_off, run_tok)
    with _lock:
        _DIGIT_RUNS[trie] = hit
    return hit


def _digit_loops(tflat: np.ndarray, n_classes: int, byte_class: np.ndarray) -> np.ndarray:
    """uint8 [rows of `tflat`]: 1 for each state that every ASCII digit leads back to."""
    rows = tflat.reshape(-1, n_classes)
    back = rows[:, byte_class[0x30:0x3A]] == np.arange(rows.shape[0], dtype=rows.dtype)[:, None]
    return np.ascontiguousarray(back.all(axis=1), np.uint8)


# `TrieWalker.masks_many` walks this many states or more as two halves on two threads. On this 2-core VM two halves
# at once took 2.0-2.5 ms where one call took 2.9 (nested_table, Llama 3: the structural fill of 3,016 states; each
# half alone 1.6 ms), and handing a half to the worker costs ~0.1-0.2 ms: a walk of ~0.7 ms (parallel_1to5_of_5's
# 2,012 states) gained nothing (TTFM, 15 interleaved compiles: 5.98 ms split, 5.72 not; nested_table 15.6 vs 16.7).
_SPLIT_STATES = 2048
_POOL: list = []  # [(pid, executor)]: the walk's worker thread, made on first use, anew in a forked child
_SPLIT_FREE = threading.Semaphore(1)  # held while a split walk uses the worker


def _walk_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """The one worker thread `masks_many` splits its walks with, or None where this process may use one core only."""
    return one_worker(_POOL, "constrain-walk")


def one_worker(slot: list, name: str) -> concurrent.futures.ThreadPoolExecutor | None:
    """The single-thread executor kept in `slot` (`[(pid, executor)]`: made on first use, anew in a forked child,
    which has the executor but not its thread), its thread named `name`; None where this process may use one core
    only."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2:
        return None
    pid = os.getpid()
    with _lock:
        if not slot or slot[0][0] != pid:
            slot[:] = [(pid, concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name))]
        return slot[0][1]


_lock = threading.Lock()
# Linux's madvise(MADV_POPULATE_READ) (5.14+): map every page of a range now, unwritten ones to the zero page.
_MADV_POPULATE_READ = 22


@functools.cache
def _libc(name: str, argtypes: tuple) -> Any:
    """libc's function `name` (returning int), or None where it cannot be loaded."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = list(argtypes)
    fn.restype = ctypes.c_int
    return fn


def _madvise() -> Any:
    """libc's madvise(addr, length, advice), or None."""
    return _libc("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))


def _mincore() -> Any:
    """libc's mincore(addr, length, vec), or None."""
    return _libc("mincore", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p))


def populate(arr: np.ndarray) -> None:
    """Map the pages of `arr`'s memory now, so that the first reads of a fresh zeroed array do not fault page by page
    (4,740-word rows: 3.4 -> 0.8 us a copy at p50). Does nothing where madvise or that advice is missing, or where
    every page is mapped already (memory the allocator reused, zeroed by calloc: the usual case once a process has
    dropped an index; the advice still walked every page there, ~0.19 ms for 2.9 MiB, where mincore takes ~0.02)."""
    madvise = _madvise()
    if madvise is None or not arr.nbytes:
        return
    page = mmap.PAGESIZE
    start = arr.ctypes.data - arr.ctypes.data % page
    end = arr.ctypes.data + arr.nbytes
    mincore = _mincore()
    if mincore is not None:
        mapped = np.zeros((end - start + page - 1) // page, np.uint8)
        if mincore(start, end - start, mapped.ctypes.data) == 0 and (mapped & 1).all():
            return
    madvise(start, end - start, _MADV_POPULATE_READ)  # the length need not be a whole number of pages


_state: dict[str, NativeAutomata | None] = {}


def automata() -> NativeAutomata | None:
    """The native automaton passes, built on first use; None where they cannot be built (or `CONSTRAIN_NATIVE=0`)."""
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            lib = cbuild.build("automata", _SOURCE, fallback="compiling automata with the slower numpy passes")
            _state["lib"] = None if lib is None else NativeAutomata(lib)
        return _state["lib"]
