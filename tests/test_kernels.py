"""Mask kernels: torch reference vs a plain-Python loop, Triton vs the reference bit for bit, real index tables."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

import constrain_kernels
from constrain_kernels import cpu_mask, cpu_native, torch_ref

if not torch.cuda.is_available():
    # Triton's interpreter runs the kernel on CPU tensors; it is read when the kernel is first launched.
    os.environ.setdefault("TRITON_INTERPRET", "1")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def triton_apply():
    """The Triton kernel; a missing Triton fails under CI (env CI set) and skips elsewhere, saying so."""
    try:
        from constrain_kernels import triton_mask
    except ImportError as err:
        message = f"Triton is not importable ({err}); the Triton kernel is untested here"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return triton_mask.apply_token_mask


def device_or_skip(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(device)


def loop_reference(logits: torch.Tensor, table: torch.Tensor, row_ids: torch.Tensor) -> torch.Tensor:
    """The docstring's plain-Python loop, on a copy."""
    out = logits.clone()
    n_words = table.shape[1]
    words_of = table.tolist()
    for r, row in enumerate(row_ids.tolist()):
        if row == -1:
            continue
        words = words_of[row]
        for t in range(out.shape[1]):
            if t >= 32 * n_words or not (words[t // 32] >> (t % 32)) & 1:
                out[r, t] = float("-inf")
    return out


def random_case(rows: int, vocab: int, n_words: int, n_table: int, dtype, device, *, seed: int, layout: str):
    """Random logits in `layout` (contiguous, a strided column view, a transposed view), table and row ids."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(-(2**31), 2**31 - 1, (n_table, n_words), generator=g, dtype=torch.int32)
    # A few rows all zero / all one / single bit: the densities a real index produces.
    table[0] = 0
    if n_table > 1:
        table[1] = -1
    if n_table > 2:
        table[2] = 0
        table[2, n_words // 2] = 1 << 5
    row_ids = torch.randint(0, n_table, (rows,), generator=g, dtype=torch.int32)
    if rows > 2:
        row_ids[1] = torch_ref.UNCONSTRAINED
    if layout == "contiguous":
        logits = torch.randn(rows, vocab, generator=g)
    elif layout == "strided":  # every other column of a wider buffer, starting at an offset
        logits = torch.randn(rows, 2 * vocab + 3, generator=g)[:, 3::2]
    elif layout == "transposed":  # column-major: stride (1, rows)
        logits = torch.randn(vocab, rows, generator=g).t()
    else:
        raise ValueError(layout)
    return logits.to(dtype).to(device), table.to(device), row_ids.to(device)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit patterns, so that equality is bit for bit (also for -inf and NaN)."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float16: torch.int16,
                                torch.bfloat16: torch.int16}[t.dtype]).cpu()


# ---- torch reference vs the plain loop (tiny sizes)


@pytest.mark.parametrize("vocab,n_words", [(1, 1), (31, 1), (32, 1), (33, 2), (70, 3), (100, 2), (64, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_reference_matches_plain_loop(vocab, n_words, dtype, layout):
    logits, table, row_ids = random_case(4, vocab, n_words, 5, dtype, "cpu", seed=vocab * 7 + n_words, layout=layout)
    want = loop_reference(logits, table, row_ids)
    torch_ref.apply_token_mask(logits, table, row_ids)
    assert torch.equal(bits(logits), bits(want))


def test_reference_keeps_nan_and_inf_where_allowed():
    logits = torch.tensor([[float("nan"), float("inf"), -1.0, 2.0]])
    table = torch.tensor([[0b0011]], dtype=torch.int32)
    torch_ref.apply_token_mask(logits, table, torch.tensor([0], dtype=torch.int32))
    assert torch.isnan(logits[0, 0]) and logits[0, 1] == float("inf") and torch.isinf(logits[0, 2:]).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab,n_words", [(33, 2), (1000, 31), (128256, 4008), (151936, 4748), (262144, 8192)])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_fused_matches_reference(device, vocab, n_words, rows):
    dev = device_or_skip(device)
    for dtype in DTYPES:
        layout = ["contiguous", "strided", "transposed"][(rows + vocab) % 3]
        logits, table, row_ids = random_case(rows, vocab, n_words, 6, dtype, dev, seed=rows + vocab, layout=layout)
        want = logits.clone()
        torch_ref.apply_token_mask(want, table, row_ids)
        torch_ref.apply_token_mask_fused(logits, table, row_ids)
        assert torch.equal(bits(logits), bits(want)), dtype


# ---- Triton vs the torch reference, bit for bit (CPU: Triton's interpreter)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab", [33, 1000, 128256, 151936, 262144])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_matches_reference(device, vocab, rows, dtype):
    apply = triton_apply()
    dev = device_or_skip(device)
    layout = ["contiguous", "strided", "transposed"][(rows + vocab) % 3]
    # The table is one word narrower than the vocabulary needs when vocab > 1000: the tail must be -inf.
    n_words = (vocab + 31) // 32 - (vocab > 1000)
    logits, table, row_ids = random_case(rows, vocab, n_words, 6, dtype, dev, seed=rows * 31 + vocab, layout=layout)
    want = logits.clone()
    torch_ref.apply_token_mask(want, table, row_ids)
    apply(logits, table, row_ids)
    assert torch.equal(bits(logits), bits(want))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["strided", "transposed"])
def test_triton_matches_reference_on_views(device, layout):
    apply = triton_apply()
    dev = device_or_skip(device)
    for dtype in DTYPES:
        logits, table, row_ids = random_case(5, 4099, 129, 7, dtype, dev, seed=3, layout=layout)
        want = logits.clone()
        torch_ref.apply_token_mask(want, table, row_ids)
        apply(logits, table, row_ids)
        assert torch.equal(bits(logits), bits(want)), dtype


# ---- CPU path: sparse rows by ids, dense rows by the compiled pass (planned per call or cached)


def density_table(n_words: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows of every density the CPU path tells apart: none, one, a few, all but one, all but a few, half, all."""
    g = np.random.default_rng(seed)
    width = min(vocab, 32 * n_words)
    allowed = np.zeros((8, 32 * n_words), dtype=bool)
    allowed[1, g.integers(0, width)] = True
    allowed[2, g.choice(width, size=min(width, 40), replace=False)] = True
    allowed[3, :width] = True
    allowed[3, g.integers(0, width)] = False
    allowed[4, :width] = True
    allowed[4, g.choice(width, size=min(width, 40), replace=False)] = False
    allowed[5, :width] = g.random(width) < 0.5
    allowed[6, :] = True  # bits past the logits' width set too: they must not matter
    allowed[7, :] = g.random(32 * n_words) < 0.5
    return torch.from_numpy(np.packbits(allowed, axis=1, bitorder="little").view("<i4").astype(np.int32))


CPU_CASES = [(1, 1), (33, 2), (70, 3), (100, 2), (4099, 129), (4099, 128), (128256, 4008), (128320, 4009),
             (151936, 4748), (262144, 8192)]


@pytest.mark.parametrize("vocab,n_words", CPU_CASES)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_cpu_path_matches_reference(vocab, n_words, rows):
    table = density_table(n_words, vocab, seed=vocab + rows)
    g = torch.Generator().manual_seed(vocab * rows)
    cache = cpu_mask.PlanCache(max_entries=3)  # smaller than the table: plans are evicted and rebuilt
    for dtype in DTYPES:
        for layout in ["contiguous", "strided", "transposed"]:
            logits, _, _ = random_case(rows, vocab, n_words, 1, dtype, "cpu", seed=rows + vocab, layout=layout)
            row_ids = torch.randint(-1, table.shape[0], (rows,), generator=g, dtype=torch.int32)
            want = logits.clone()
            torch_ref.apply_token_mask(want, table, row_ids)
            got = logits.clone()
            constrain_kernels.apply_token_mask(got, table, row_ids)
            assert torch.equal(bits(got), bits(want)), (dtype, layout, "per call")
            got = logits.clone()
            plans = [None if i < 0 else cache.get(i, table[i].numpy(), vocab) for i in row_ids.tolist()]
            cpu_mask.apply_planned(got, plans)
            assert torch.equal(bits(got), bits(want)), (dtype, layout, "cached plans")


@pytest.fixture(params=["native", "avx2", "portable", "torch"])
def cpu_pass(request, monkeypatch):
    """Each dense CPU pass in turn: the native one as this CPU runs it, its AVX2 and portable C loops (where they are
    not what it runs anyway), and the compiled torch pass (no native pass)."""
    native = cpu_native.load()
    if request.param == "torch":
        monkeypatch.setattr(cpu_native, "load", lambda: None)
    elif native is None:
        message = "the native CPU mask pass did not build here (no C compiler?)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    elif request.param == "avx2":
        if native.native_isa < 1:
            pytest.skip("this CPU has no AVX2")
        monkeypatch.setattr(native, "isa", 1)
    elif request.param == "portable":
        monkeypatch.setattr(native, "isa", 0)
    return request.param


@pytest.mark.parametrize("vocab,n_words", CPU_CASES)
def test_cpu_dense_passes_match_reference(cpu_pass, vocab, n_words):
    table = density_table(n_words, vocab, seed=vocab)
    row_ids = torch.tensor([5, 7, -1, 0, 6, 3, 1, 5, 2, 4], dtype=torch.int32)  # every density, one unconstrained
    g = torch.Generator().manual_seed(vocab)
    for dtype in DTYPES:
        # Unit column stride (the native pass's layout), rows further apart than the vocabulary, at an odd offset.
        buffer = torch.randn(len(row_ids), vocab + 7, generator=g).to(dtype)
        want = buffer[:, 1:vocab + 1].clone()
        torch_ref.apply_token_mask(want, table, row_ids)
        whole = buffer.clone()
        got = whole[:, 1:vocab + 1]
        assert got.stride() == (vocab + 7, 1)
        constrain_kernels.apply_token_mask(got, table, row_ids)
        assert torch.equal(bits(got), bits(want)), (dtype, "per call")
        outside = torch.ones(vocab + 7, dtype=torch.bool)
        outside[1:vocab + 1] = False
        assert torch.equal(bits(whole[:, outside]), bits(buffer[:, outside])), (dtype, "wrote outside the view")
        got = buffer.clone()[:, 1:vocab + 1]
        cpu_mask.apply_planned(got, [None if i < 0 else cpu_mask.plan_row(table[i].numpy(), vocab)
                                     for i in row_ids.tolist()])
        assert torch.equal(bits(got), bits(want)), (dtype, "planned")
        got = buffer.clone()[:, 1:vocab + 1]  # plans that went through pickle (their addresses are remade)
        cpu_mask.apply_planned(got, [None if i < 0 else pickle.loads(pickle.dumps(
            cpu_mask.plan_row(table[i].numpy(), vocab))) for i in row_ids.tolist()])
        assert torch.equal(bits(got), bits(want)), (dtype, "unpickled plans")


def test_cpu_plans_cover_every_kind():
    vocab, n_words = 128320, 4009
    table = density_table(n_words, vocab, seed=0).numpy()
    thorough = [cpu_mask.plan_row(row, vocab).kind for row in table]
    assert thorough == ["allowed", "allowed", "allowed", "blocked", "blocked", "dense", "blocked", "dense"]
    quick = [cpu_mask.plan_row(row, vocab, thorough=False).kind for row in table]
    assert quick[:2] == ["allowed", "allowed"] and quick[3] == "blocked" and quick[5] == "dense"


def test_cpu_path_keeps_nan_and_inf_where_allowed():
    for dtype in DTYPES:
        logits = torch.tensor([[float("nan"), float("inf"), -1.0, 2.0, float("inf"), float("nan")]], dtype=dtype)
        table = torch.tensor([[0b000011], [0b111100]], dtype=torch.int32)
        for row, allowed in ((0, [0, 1]), (1, [2, 3, 4, 5])):
            got = logits.clone()
            constrain_kernels.apply_token_mask(got, table, torch.tensor([row], dtype=torch.int32))
            want = logits.clone()
            want[0, [t for t in range(6) if t not in allowed]] = float("-inf")
            assert torch.equal(bits(got), bits(want)), (dtype, row)


def test_cpu_path_bad_inputs_raise():
    logits, table = torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32)
    for ids in ([0, 3], [-2, 0]):
        with pytest.raises(ValueError):
            constrain_kernels.apply_token_mask(logits, table, torch.tensor(ids, dtype=torch.int32))
    plan = cpu_mask.plan_row(table[0].numpy(), 64)
    with pytest.raises(ValueError):
        cpu_mask.apply_planned(torch.zeros(2, 65), [plan, plan])  # planned for another width
    with pytest.raises(ValueError):
        cpu_mask.apply_planned(logits, [plan])  # one plan for two rows
    with pytest.raises(ValueError):
        cpu_mask.apply_planned(logits.double(), [plan, plan])
    # Plans the native pass would read or write out of bounds by are refused when made.
    for kind, kwargs in ((cpu_mask.ALLOWED, {"ids": np.array([3, 64])}), (cpu_mask.BLOCKED, {"ids": np.array([-1])}),
                         (cpu_mask.BLOCKED, {"ids": np.array([5, 5])}), (cpu_mask.ALLOWED, {"ids": np.array([7, 2])}),
                         (cpu_mask.DENSE, {"words": np.zeros(1, dtype=np.int32)}), ("sparse", {"ids": np.array([1])})):
        with pytest.raises(ValueError):
            cpu_mask.RowPlan(kind, 64, 64, **kwargs)


# ---- real index tables: padding ids and EOS


@pytest.mark.parametrize("device", DEVICES)
def test_index_table_masks_exactly_the_allowed_ids(llama3_vocab, device):
    from constrain.compiler import compile_json_schema

    dev = device_or_skip(device)
    index = compile_json_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, llama3_vocab)
    cursors, prefix = [], []
    cursor = index.start()
    for text in (b"[", b"1", b",", b"2", b"]"):
        tok = llama3_vocab.token_bytes.index(text)
        cursors.append(cursor.fork())
        cursor.advance(tok)
        prefix.append(tok)
    cursors.append(cursor)
    row_ids = [c.mask_row() for c in cursors]
    table = torch.from_numpy(np.array(index.mask_table()[0])).to(dev)
    vocab = llama3_vocab.vocab_size + 45  # a model whose logits are wider than the tokenizer
    appliers = [torch_ref.apply_token_mask, torch_ref.apply_token_mask_fused, constrain_kernels.apply_token_mask, triton_apply()]
    results = []
    for apply in appliers:
        logits = torch.zeros(len(row_ids), vocab, device=dev)
        apply(logits, table, torch.tensor(row_ids, dtype=torch.int32, device=dev))
        results.append(bits(logits))
        for r, c in enumerate(cursors):
            got = np.flatnonzero(torch.isfinite(logits[r]).cpu().numpy())
            np.testing.assert_array_equal(got, c.allowed_token_ids())
    assert all(torch.equal(results[0], other) for other in results[1:])
    # The accepting state allows EOS and nothing past the tokenizer ever is.
    assert set(llama3_vocab.eos_ids) <= set(cursors[-1].allowed_token_ids().tolist())


# ---- input checks


@pytest.mark.parametrize("apply", ["torch", "fused", "triton"])
def test_bad_inputs_raise(apply):
    fn = {"torch": torch_ref.apply_token_mask, "fused": torch_ref.apply_token_mask_fused}.get(apply) or triton_apply()
    logits, table, ids = torch.zeros(2, 64), torch.zeros(3, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    for bad in [
        (logits.to(torch.float64), table, ids),
        (logits[0], table, ids),
        (logits, table.long(), ids),
        (logits, table, ids.long()),
        (logits, table, ids[:1]),
    ]:
        with pytest.raises(ValueError):
            fn(*bad)
