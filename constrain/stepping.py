"""A cursor's per-token work in C: a mask written into the caller's buffer from its row's patch (the words that differ
from an all-0 or all-1 row), and a byte token walked through the DFA. A CPython extension module, not ctypes: a call
costs ~0.05 us instead of ~0.6, less than the work; None where it cannot be built (the callers' numpy paths then)."""

from __future__ import annotations

import struct
import threading
from types import ModuleType

import numpy as np
from constrain_kernels import cbuild

__all__ = ["module", "patch_limit", "patch_of"]


def patch_limit(n_words: int) -> int:
    """The most words a patch of a row `n_words` wide sets: a quarter of them (its pairs half the row's bytes), at most
    1,024 (8 KiB of pairs) and at least 64. A row read for the first time comes from another core's cache or memory
    (the index's rows are made on a worker thread): a patch is that much less to read, and its fill writes a buffer in
    this core's cache. On the engine benchmark's rows: 97-98 % have a patch of at most 64 words (median 3); most of the
    rest 70-350 (the words holding a digit or letter token after an opening quote), 530-570 (`nested_users`' e-mail
    and date-time characters on Llama 3, over the eighth of a row the limit was until session 40: their first reads
    were the replay's slowest steps after the fill's wait, cold p99 4.98 -> 3.68 us and 3.64 -> 3.07 in two runs of 7
    and 9 cold compiles), or, string content, 800-2,600 (Gemma 4, Llama 3)."""
    return max(64, min(n_words // 4, 1024))


_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The caller's mask buffer: writable, C-contiguous, `n_words` 4-byte words (-1: any width). */
static int out_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t n_words) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != 4 || (n_words >= 0 && view->len != n_words * 4)) {
        PyErr_Format(PyExc_ValueError, "the mask buffer must hold %zd 4-byte words, got %zd items of %zd bytes",
                     n_words, view->len / (view->itemsize ? view->itemsize : 1), view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* fill(out, patch): patch = int32 n_words, int32 base (0 or -1), then (word, value) int32 pairs; out (a writable
   C-contiguous buffer of n_words 4-byte items) becomes base in every word, then value at each word named. A mask
   (any buffer of 4-byte words) instead of a patch is copied into out, which must be as wide. */
static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "fill(out, patch or mask)");
        return NULL;
    }
    Py_buffer view;
    if (!PyBytes_CheckExact(args[1])) {
        Py_buffer src;
        if (PyObject_GetBuffer(args[1], &src, PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        if (src.itemsize != 4 || out_buffer(args[0], &view, src.len / 4) < 0) {
            if (src.itemsize != 4)
                PyErr_SetString(PyExc_ValueError, "a mask is 4-byte words");
            PyBuffer_Release(&src);
            return NULL;
        }
        memcpy(view.buf, src.buf, (size_t)src.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    const char *patch = PyBytes_AS_STRING(args[1]);
    Py_ssize_t plen = PyBytes_GET_SIZE(args[1]);
    if (plen < 8 || plen % 8) {
        PyErr_SetString(PyExc_ValueError, "a patch holds a header and whole (word, value) pairs");
        return NULL;
    }
    int32_t head[2];
    memcpy(head, patch, 8);
    if (out_buffer(args[0], &view, head[0]) < 0)
        return NULL;
    int32_t *out = (int32_t *)view.buf;
    memset(out, head[1] ? 0xFF : 0, (size_t)view.len);
    const int32_t *pairs = (const int32_t *)(patch + 8);
    Py_ssize_t n = plen / 8 - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t at = pairs[2 * i];
        if (at < 0 || at >= head[0]) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "a patch names a word outside the mask");
            return NULL;
        }
        out[at] = pairs[2 * i + 1];
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* patch(mask, limit): fill's patch of an int32 mask buffer (base -1 when fewer words differ from all 1 than from all 0),
   or None when more than `limit` differ from both; stops reading at that point. */
static PyObject *patch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "patch(mask, limit)");
        return NULL;
    }
    long limit = PyLong_AsLong(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (view.itemsize != 4 || limit < 0 || view.len / 4 > INT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "patch() reads a mask of 4-byte words under a limit >= 0");
        return NULL;
    }
    const int32_t *w = (const int32_t *)view.buf;
    int32_t n = (int32_t)(view.len / 4);
    long zeros_off = 0, ones_off = 0; /* words that are not 0, words that are not -1 */
    for (int32_t i = 0; i < n && (zeros_off <= limit || ones_off <= limit); i++) {
        zeros_off += w[i] != 0;
        ones_off += w[i] != -1;
    }
    if (zeros_off > limit && ones_off > limit) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    int32_t base = zeros_off <= ones_off ? 0 : -1;
    long count = base ? ones_off : zeros_off;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 8 + 8 * count);
    if (!out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int32_t *o = (int32_t *)PyBytes_AS_STRING(out);
    o[0] = n;
    o[1] = base;
    long j = 0;
    for (int32_t i = 0; i < n; i++)
        if (w[i] != base) {
            o[2 + 2 * j] = i;
            o[3 + 2 * j] = w[i];
            j++;
        }
    PyBuffer_Release(&view);
    return out;
}

/* The automata library's (`native.py`) byte walks, called here without a ctypes call each. */
typedef void (*step_fn)(const int64_t *ctx, const uint8_t *data, int32_t n, int64_t *io, int32_t *stack);
typedef int64_t (*plain_fn)(const int64_t *ctx, const uint8_t *data, int32_t n, int64_t state);

typedef struct {
    step_fn step;         /* constrain_step */
    plain_fn plain;       /* constrain_step_plain */
    const int64_t *ctx;   /* a `native.Stepper`'s context (kept alive by the caller) */
    int64_t n_states;
} walk_ctx;

static void drop_ctx(PyObject *capsule) { PyMem_Free(PyCapsule_GetPointer(capsule, "constrain.walk")); }

/* walker(step, plain, ctx, n_states): a capsule for walk() and walk_counted() (addresses: the two functions and a
   Stepper's context array). */
static PyObject *walker(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "walker(step, plain, ctx, n_states)");
        return NULL;
    }
    walk_ctx *ctx = PyMem_Malloc(sizeof(walk_ctx));
    if (!ctx)
        return PyErr_NoMemory();
    ctx->step = (step_fn)PyLong_AsVoidPtr(args[0]);
    ctx->plain = (plain_fn)PyLong_AsVoidPtr(args[1]);
    ctx->ctx = (const int64_t *)PyLong_AsVoidPtr(args[2]);
    ctx->n_states = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred() || !ctx->step || !ctx->plain || !ctx->ctx) {
        PyMem_Free(ctx);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "walker() needs nonzero addresses");
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(ctx, "constrain.walk", drop_ctx);
    if (!capsule)
        PyMem_Free(ctx);
    return capsule;
}

/* The context and a checked state of a walk called with `usage` (`want` arguments: the context, the state, ...,
   the token's bytes at `at_data`), or NULL with an error set. */
static const walk_ctx *walk_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage,
                                 Py_ssize_t at_data, long long *state) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    PyObject *data = args[at_data];
    if (!PyBytes_CheckExact(data)) {
        PyErr_SetString(PyExc_TypeError, "a token's bytes must be bytes");
        return NULL;
    }
    const walk_ctx *ctx = PyCapsule_GetPointer(args[0], "constrain.walk");
    if (!ctx)
        return NULL;
    *state = PyLong_AsLongLong(args[1]);
    if (*state == -1 && PyErr_Occurred())
        return NULL;
    if (*state < 0 || *state >= ctx->n_states || PyBytes_GET_SIZE(data) > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a walk starts at a state of the DFA");
        return NULL;
    }
    return ctx;
}

/* walk(ctx, state, data): the state after the bytes `data` from `state` (counters not read), or -1 where the DFA
   dies on them or `data` is empty. */
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long s;
    const walk_ctx *ctx = walk_args(args, nargs, 3, "walk(ctx, state, data: bytes)", 2, &s);
    if (!ctx)
        return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(args[2]);
    int64_t out = n ? ctx->plain(ctx->ctx, (const uint8_t *)PyBytes_AS_STRING(args[2]), (int32_t)n, s) : -1;
    return PyLong_FromLongLong(out < 0 ? -1 : out);
}

/* walk_counted(ctx, state, count, limit, data, stack): `automaton.walk_counted` of `data`: (state, count, limit, at,
   stack), state -1 and `at` the byte where the walk died, passed its bound or spilled onto a full stack, else at -1.
   stack: the deep values' spilled kinds (a tuple of ints; the same object back when the walk leaves it as it was;
   passed through where the automaton has no deep values). */
static PyObject *walk_counted(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long s;
    const walk_ctx *ctx = walk_args(args, nargs, 6, "walk_counted(ctx, state, count, limit, data: bytes, stack: tuple)",
                                    4, &s);
    if (!ctx)
        return NULL;
    if (!PyTuple_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "walk_counted(ctx, state, count, limit, data: bytes, stack: tuple)");
        return NULL;
    }
    int64_t io[5] = {s, PyLong_AsLongLong(args[2]), PyLong_AsLongLong(args[3]), -1, 0};
    if (PyErr_Occurred())
        return NULL;
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(args[4]);
    int32_t n = (int32_t)PyBytes_GET_SIZE(args[4]);
    PyObject *stack = args[5];
    if (!ctx->ctx[5]) { /* no deep values: no stack to keep */
        ctx->step(ctx->ctx, data, n, io, NULL);
        return Py_BuildValue("(LLLLO)", (long long)io[0], (long long)io[1], (long long)io[2], (long long)io[3], stack);
    }
    Py_ssize_t depth = PyTuple_GET_SIZE(stack), cap = depth + n; /* a byte spills at most one kind */
    int32_t small[64];
    int32_t *buf = cap <= 64 ? small : PyMem_Malloc(sizeof(int32_t) * (size_t)cap);
    if (!buf)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < depth; i++) {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(stack, i));
        if (kind == -1 && PyErr_Occurred()) {
            if (buf != small)
                PyMem_Free(buf);
            return NULL;
        }
        buf[i] = (int32_t)kind;
    }
    io[4] = depth;
    ctx->step(ctx->ctx, data, n, io, buf);
    int same = io[4] == depth;
    for (Py_ssize_t i = 0; same && i < depth; i++)
        same = PyLong_AsLong(PyTuple_GET_ITEM(stack, i)) == buf[i];
    PyObject *after = stack;
    if (same)
        Py_INCREF(after);
    else {
        after = PyTuple_New((Py_ssize_t)io[4]);
        for (Py_ssize_t i = 0; after && i < (Py_ssize_t)io[4]; i++) {
            PyObject *kind = PyLong_FromLong(buf[i]);
            if (!kind) {
                Py_CLEAR(after);
                break;
            }
            PyTuple_SET_ITEM(after, i, kind);
        }
    }
    if (buf != small)
        PyMem_Free(buf);
    if (!after)
        return NULL;
    PyObject *out = Py_BuildValue("(LLLLN)", (long long)io[0], (long long)io[1], (long long)io[2], (long long)io[3],
                                  after);
    return out;
}

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL, "fill(out, patch): write a patched mask"},
    {"patch", (PyCFunction)(void (*)(void))patch, METH_FASTCALL, "patch(mask, limit): a mask's patch or None"},
    {"walker", (PyCFunction)(void (*)(void))walker, METH_FASTCALL, "walker(step, plain, ctx, n_states): a context"},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, "walk(ctx, state, data): the state after data"},
    {"walk_counted", (PyCFunction)(void (*)(void))walk_counted, METH_FASTCALL,
     "walk_counted(ctx, state, count, limit, data, stack): (state, count, limit, at, stack)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "constrain_stepping", NULL, -1, methods};

PyMODINIT_FUNC PyInit_constrain_stepping(void) { return PyModule_Create(&module_def); }
"""

_state: dict[str, ModuleType | None] = {}
_lock = threading.Lock()


def module() -> ModuleType | None:
    """The extension, built on first use; None where it cannot be built (or `CONSTRAIN_NATIVE=0`)."""
    if "mod" in _state:
        return _state["mod"]
    with _lock:
        if "mod" not in _state:
            _state["mod"] = cbuild.build_module("constrain_stepping", _SOURCE,
                                                fallback="cursors copy masks and walk tokens in numpy and Python")
        return _state["mod"]


def patch_of(key: bytes, mask: np.ndarray | None, n_words: int) -> bytes | None:
    """The patch of a row (`fill`'s second argument), from its `native.sparse_key` (and its words, read only when the
    key is dense): None when more than `patch_limit(n_words)` words differ from both all 0 and all 1."""
    if key[:1] == b"s":
        return struct.pack("<ii", n_words, 0) + key[1:]
    if mask is None:
        return None
    ext = module()
    if ext is not None:
        return ext.patch(mask, patch_limit(n_words))
    words = mask.view(np.int32)
    base = 0 if (words != 0).sum() <= (words != -1).sum() else -1  # (as the C patch: fewer words to write)
    off = np.flatnonzero(words != base)
    if off.shape[0] > patch_limit(n_words):
        return None
    return struct.pack("<ii", n_words, base) + np.column_stack([off.astype(np.int32), words[off]]).tobytes()
