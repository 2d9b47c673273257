"""document_attention: packed (varlen) attention equals attention on every example alone."""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lightning_varbatch.attention as attention_module
import lightning_varbatch.attention.choice as choice_module
import lightning_varbatch.attention.flash as flash_module
import lightning_varbatch.attention.flex as flex_backend
import lightning_varbatch.attention.sdpa as sdpa_module
import lightning_varbatch.attention.sdpa_cost as sdpa_cost
from lightning_varbatch.attention import (
    BACKENDS,
    document_attention,
    document_ids,
    select_backend,
)
from lightning_varbatch.errors import SettingTypeError, SettingValueError

LENGTHS = [5, 1, 9, 3, 2]  # includes a length-1 example
PAD = 3  # trailing alignment padding
HEADS, DIM = 3, 8


def _flex_importable() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:
        return False
    return True


# Backends that run on CPU. FlexAttention runs here eagerly, forward only (no CPU backward).
CPU_BACKENDS = ["sdpa"] + (["flex"] if _flex_importable() else [])
FORWARD_ONLY = {"flex"}


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _qkv(
    lengths: list[int] = LENGTHS,
    pad: int = PAD,
    heads: int = HEADS,
    kv_heads: int | None = None,
    seed: int = 0,
    requires_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths) + pad
    shapes = [(total, heads, DIM), *[(total, kv_heads or heads, DIM)] * 2]
    return tuple(  # type: ignore[return-value]
        torch.randn(s, generator=g, dtype=torch.float64).requires_grad_(requires_grad)
        for s in shapes
    )


def _reference(q, k, v, lengths, causal, scale=None):
    """Each example alone through plain SDPA (heads first), concatenated; no padding rows."""
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        outs.append(
            F.scaled_dot_product_attention(
                q[sl].transpose(0, 1),
                k[sl].transpose(0, 1),
                v[sl].transpose(0, 1),
                is_causal=causal,
                scale=scale,
            ).transpose(0, 1)
        )
        start += n
    return torch.cat(outs)


def _naive(q, k, v, lengths, causal, scale=None):
    """Explicit softmax(q k^T) v per example, repeating k/v heads for grouped queries."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (x[start : start + n] for x in (q, k, v))
        scores = torch.einsum("ihd,jhd->hij", qs, ks) * scale
        if causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        outs.append(torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs))
        start += n
    return torch.cat(outs)


def _run(backend, q, k, v, cu, **kwargs):
    if backend in FORWARD_ONLY:
        with torch.no_grad():
            return document_attention(q, k, v, cu, backend=backend, **kwargs)
    return document_attention(q, k, v, cu, backend=backend, **kwargs)


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_forward_equals_each_example_alone(backend, causal):
    q, k, v = _qkv()
    cu, n = _cu(LENGTHS), sum(LENGTHS)
    out = _run(backend, q, k, v, cu, max_seqlen=max(LENGTHS), causal=causal)
    assert out.shape == q.shape and out.dtype == torch.float64
    torch.testing.assert_close(out[:n], _reference(q, k, v, LENGTHS, causal), rtol=0, atol=1e-12)
    torch.testing.assert_close(out[:n], _naive(q, k, v, LENGTHS, causal), rtol=0, atol=1e-12)
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))


@pytest.mark.parametrize("causal", [True, False])
def test_backward_equals_each_example_alone(causal):
    q, k, v = _qkv(requires_grad=True)
    n = sum(LENGTHS)
    weights = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = document_attention(q, k, v, _cu(LENGTHS), causal=causal, backend="sdpa")
    (out * weights).sum().backward()

    for reference in (_reference, _naive):  # per-example SDPA, and explicit softmax
        rq, rk, rv = (x.detach()[:n].clone().requires_grad_() for x in (q, k, v))
        (reference(rq, rk, rv, LENGTHS, causal) * weights[:n]).sum().backward()
        for got, want in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
            torch.testing.assert_close(got[:n], want, rtol=0, atol=1e-12)
            assert torch.equal(got[n:], torch.zeros_like(got[n:]))  # padding: no gradient


def test_flex_has_no_cpu_backward_and_says_so():
    if "flex" not in CPU_BACKENDS:
        pytest.skip("this torch has no FlexAttention")
    q, k, v = _qkv(requires_grad=True)
    with pytest.raises(RuntimeError, match=r"no backward on cpu.*torch.no_grad.*'sdpa'"):
        document_attention(q, k, v, _cu(LENGTHS), backend="flex")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_grouped_query_heads_scale_and_batch_dim(backend):
    q, k, v = _qkv(heads=4, kv_heads=2)
    n = sum(LENGTHS)
    out = _run(backend, q[None], k[None], v[None], _cu(LENGTHS), scale=0.3, causal=True)
    assert out.shape == (1, *q.shape)
    want = _naive(q, k, v, LENGTHS, True, scale=0.3)
    torch.testing.assert_close(out[0, :n], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_empty_examples_and_no_padding(backend):
    q, k, v = _qkv(pad=0)
    with_empty = torch.tensor([0, 0, 5, 6, 6, 15, 18, 20, 20], dtype=torch.int32)
    out = _run(backend, q, k, v, with_empty)
    torch.testing.assert_close(out, _reference(q, k, v, LENGTHS, True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_all_padding_and_empty_row(backend):
    q, k, v = _qkv(lengths=[], pad=4)
    out = _run(backend, q, k, v, torch.zeros(1, dtype=torch.int32))
    assert torch.equal(out, torch.zeros_like(q))
    q, k, v = _qkv(lengths=[], pad=0)
    assert _run(backend, q, k, v, torch.zeros(1, dtype=torch.int32)).shape == (0, HEADS, DIM)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_validate_false_gives_the_same_result(backend):
    q, k, v = _qkv()
    cu = _cu(LENGTHS)
    assert torch.equal(_run(backend, q, k, v, cu, validate=False), _run(backend, q, k, v, cu))


# --------------------------------------------------------------------------- isolation


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_no_attention_across_examples(backend, causal):
    q, k, v = _qkv()
    cu = _cu(LENGTHS)
    base = _run(backend, q, k, v, cu, causal=causal)
    for j, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for x in (q2, k2, v2):
            x[a:b] = 1e3 * torch.randn_like(x[a:b])  # large: any leak would show
        out = _run(backend, q2, k2, v2, cu, causal=causal)
        assert not torch.equal(out[a:b], base[a:b])  # the perturbation did something
        outside = torch.ones(q.shape[0], dtype=torch.bool)
        outside[a:b] = False
        assert torch.equal(out[outside], base[outside]), f"example {j} leaked"


@pytest.mark.parametrize("causal", [True, False])
def test_loss_on_one_example_has_no_gradient_elsewhere(causal):
    cu = _cu(LENGTHS)
    bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    for a, b in bounds:
        q, k, v = _qkv(requires_grad=True)
        out = document_attention(q, k, v, cu, causal=causal, backend="sdpa")
        out[a:b].pow(2).sum().backward()
        for x in (q, k, v):
            elsewhere = torch.ones(x.shape[0], dtype=torch.bool)
            elsewhere[a:b] = False
            assert torch.equal(x.grad[elsewhere], torch.zeros_like(x.grad[elsewhere]))
        # (a length-1 example's output is its own v: no gradient reaches its q and k)
        assert v.grad[a:b].abs().sum() > 0 and (b - a == 1 or q.grad[a:b].abs().sum() > 0)


def test_causal_outputs_ignore_later_tokens():
    q, k, v = _qkv()
    cu = _cu(LENGTHS)
    base = document_attention(q, k, v, cu, backend="sdpa")
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[10:] += 5.0  # inside example 2 (tokens 6..14) and after
    out = document_attention(q2, k2, v2, cu, backend="sdpa")
    assert torch.equal(out[:10], base[:10])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_padding_does_not_affect_real_tokens(backend):
    q, k, v = _qkv()
    n, cu = sum(LENGTHS), _cu(LENGTHS)
    base = _run(backend, q, k, v, cu)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[n:] = 1e6 * torch.randn_like(x[n:])
    out = _run(backend, q2, k2, v2, cu)
    assert torch.equal(out[:n], base[:n])
    assert torch.isfinite(out).all() and torch.equal(out[n:], torch.zeros_like(out[n:]))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_non_finite_padding_does_not_leak(backend):
    q, k, v = _qkv(requires_grad=backend not in FORWARD_ONLY)
    n = sum(LENGTHS)
    with torch.no_grad():
        for x, value in zip((q, k, v), (math.nan, math.inf, math.nan), strict=True):
            x[n:] = value
    out = _run(backend, q, k, v, _cu(LENGTHS))
    assert torch.isfinite(out).all() and torch.equal(out[n:], torch.zeros_like(out[n:]))
    if backend not in FORWARD_ONLY:
        out.sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


# --------------------------------------------------------------------------- sdpa strategies

STRATEGIES = ["loop", "batched"]
# uneven lengths (the batch pads them), with empty examples; equal lengths (no padding)
SDPA_CASES = {
    "uneven": ([0, 0, 5, 6, 6, 15, 18, 20, 20], 3),
    "equal": ([0, 4, 8, 12], 2),
    "one": ([0, 7], 1),
}


@pytest.fixture(params=STRATEGIES)
def strategy(request, monkeypatch):
    """Force the per-example loop or the padded single call of backend='sdpa'."""
    monkeypatch.setattr(sdpa_cost, "_SDPA_STRATEGY", request.param)
    return request.param


def _lengths(cu_list):
    return [b - a for a, b in itertools.pairwise(cu_list)]


@pytest.mark.parametrize("case", list(SDPA_CASES))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads", "scale"), [(3, 3, None), (4, 2, 0.3)])
def test_sdpa_strategies_equal_reference_with_gradients(
    strategy, case, causal, heads, kv_heads, scale, monkeypatch
):
    cu_list, pad = SDPA_CASES[case]
    lengths = _lengths(cu_list)
    n = sum(lengths)
    calls = []
    for name in ("sdpa_loop", "sdpa_padded"):
        original = getattr(sdpa_module, name)
        monkeypatch.setattr(
            sdpa_module, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)
        )
    q, k, v = _qkv(lengths, pad, heads, kv_heads, requires_grad=True)
    weights = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor(cu_list, dtype=torch.int32)
    out = document_attention(q, k, v, cu, causal=causal, scale=scale, backend="sdpa")
    assert calls == [f"sdpa_{'padded' if strategy == 'batched' else 'loop'}"]
    (out * weights).sum().backward()
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))

    rq, rk, rv = (x.detach()[:n].clone().requires_grad_() for x in (q, k, v))
    want = _naive(rq, rk, rv, lengths, causal, scale)
    torch.testing.assert_close(out[:n], want, rtol=0, atol=1e-12)
    (want * weights[:n]).sum().backward()
    for got, expected in ((q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
        torch.testing.assert_close(got[:n], expected, rtol=0, atol=1e-12)
        assert torch.equal(got[n:], torch.zeros_like(got[n:]))


def test_sdpa_strategies_agree_on_many_short_examples(monkeypatch):
    lengths = [1, 7, 3, 8, 8, 2, 5, 1, 6, 4] * 4
    q, k, v = _qkv(lengths, pad=5, heads=2, requires_grad=True)
    results = []
    for strategy in STRATEGIES:
        monkeypatch.setattr(sdpa_cost, "_SDPA_STRATEGY", strategy)
        for causal in (True, False):
            out = document_attention(q, k, v, _cu(lengths), causal=causal, backend="sdpa")
            grads = torch.autograd.grad(out.pow(2).sum(), (q, k, v))
            results.append((out, *grads))
    for loop, batched in zip(results[:2], results[2:], strict=True):
        for a, b in zip(loop, batched, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_sdpa_strategies_no_leak_between_examples_or_from_padding(strategy, causal):
    # A long example next to short ones: the batch pads the short ones with many slots (whose
    # query rows, for non-causal, see only the real keys); nothing may reach other examples,
    # the padded slots or the trailing padding (NaN/inf there), forward or backward.
    lengths = [9, 1, 2, 5]
    n = sum(lengths)
    cu = _cu(lengths)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        q, k, v = _qkv(lengths, pad=3, requires_grad=True)
        with torch.no_grad():
            for x, value in zip((q, k, v), (math.nan, math.inf, math.nan), strict=True):
                x[n:] = value
        out = document_attention(q, k, v, cu, causal=causal, backend="sdpa")
        assert torch.isfinite(out).all() and torch.equal(out[n:], torch.zeros_like(out[n:]))
        out[a:b].pow(2).sum().backward()
        for x in (q, k, v):
            assert torch.isfinite(x.grad).all()
            elsewhere = torch.ones(x.shape[0], dtype=torch.bool)
            elsewhere[a:b] = False
            assert torch.equal(x.grad[elsewhere], torch.zeros_like(x.grad[elsewhere]))
        assert v.grad[a:b].abs().sum() > 0


def test_sdpa_batches_rule():
    batches = sdpa_cost.sdpa_batches
    assert batches([64] * 32) and batches([4] * 512)  # equal lengths: no padding, fewer calls
    assert batches([6, 8, 7, 5, 8, 3, 8, 6] * 30)  # many short, similar examples
    assert not batches([700, 500, 400, 400])  # few long examples: the loop's overhead is small
    assert not batches([1000] + [4] * 200)  # one long example would pad 200 short ones
    assert not batches([60] + [1] * 300)  # cheap in time, but 60 x 300 slots for 360 tokens
    assert not batches([2048])  # one example: nothing to batch


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [([6, 8, 7, 5, 8, 3, 8, 6] * 30, "sdpa_padded"), ([900, 4, 3], "sdpa_loop")],
)
def test_auto_strategy_follows_the_rule(sizes, expected, monkeypatch):
    assert sdpa_cost._SDPA_STRATEGY == "auto"
    calls = []
    for name in ("sdpa_loop", "sdpa_padded"):
        original = getattr(sdpa_module, name)
        monkeypatch.setattr(
            sdpa_module, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a)
        )
    q, k, v = _qkv(sizes, pad=0, heads=1)
    document_attention(q, k, v, _cu(sizes))
    assert calls == [expected]


# --------------------------------------------------------------------------- end to end


class PackedSelfAttention(nn.Module):
    """One multi-head self-attention layer on a packed row (a user's model, in miniature)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, -1).unbind(1)
        return self.out(document_attention(q, k, v, cu_seqlens, max_seqlen).flatten(1))


def test_one_layer_model_packed_equals_examples_alone():
    torch.manual_seed(0)
    width, heads = 12, 3
    layer = PackedSelfAttention(width, heads).double()
    n = sum(LENGTHS)
    x = torch.randn(n + PAD, width, dtype=torch.float64)
    packed = layer(x, _cu(LENGTHS), max(LENGTHS))
    packed[:n].pow(2).sum().backward()
    packed_grads = [p.grad.clone() for p in layer.parameters()]

    # The same layer on every example alone, and torch's own MultiheadAttention (same weights).
    mha = nn.MultiheadAttention(width, heads, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(layer.qkv.weight)
        mha.in_proj_bias.copy_(layer.qkv.bias)
        mha.out_proj.weight.copy_(layer.out.weight)
        mha.out_proj.bias.copy_(layer.out.bias)
    layer.zero_grad()
    start = 0
    for length in LENGTHS:
        xs = x[start : start + length]
        alone = layer(xs, torch.tensor([0, length], dtype=torch.int32), length)
        mask = torch.ones(length, length, dtype=torch.bool).triu(1)  # True = masked
        with torch.no_grad():
            torch_out = mha(xs[None], xs[None], xs[None], attn_mask=mask, need_weights=False)[0]
        torch.testing.assert_close(packed[start : start + length], alone, rtol=0, atol=1e-12)
        torch.testing.assert_close(alone, torch_out[0], rtol=0, atol=1e-12)
        alone.pow(2).sum().backward()  # gradients accumulate over the examples
        start += length
    for got, want in zip(packed_grads, (p.grad for p in layer.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


# --------------------------------------------------------------------------- backends


def test_auto_is_sdpa_on_cpu():
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        for grad in (False, True):
            q = torch.zeros(4, 2, 8, dtype=dtype, requires_grad=grad)
            assert select_backend(q) == "sdpa"
            assert select_backend(q, backend="sdpa") == "sdpa"
    q, k, v = _qkv()
    torch.testing.assert_close(
        document_attention(q, k, v, _cu(LENGTHS)),
        document_attention(q, k, v, _cu(LENGTHS), backend="sdpa"),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_flash_without_cuda_says_why(dtype):
    q = torch.zeros(4, 2, 8, dtype=dtype)
    needs = r"backend='flash' needs the flash_attn package and CUDA tensors in fp16/bf16: "
    why = r"(flash_attn cannot be imported .*; )?the tensors are on cpu, not CUDA"
    if dtype == torch.float64:
        why += "; the tensors are torch.float64, not float16/bfloat16"
    with pytest.raises(RuntimeError, match=needs + why):
        document_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32), backend="flash")


def test_flash_problem_names_each_missing_piece(monkeypatch):
    monkeypatch.setattr(choice_module, "flash_varlen", lambda: (lambda *a, **k: None, ""))
    with pytest.raises(RuntimeError, match=r"fp16/bf16: the tensors are on cpu, not CUDA\.$"):
        select_backend(torch.zeros(2, 1, 4, dtype=torch.float16), backend="flash")
    monkeypatch.setattr(choice_module, "flash_varlen", lambda: (None, "no flash_attn"))
    with pytest.raises(RuntimeError, match=r"fp16/bf16: no flash_attn; the tensors are on cpu"):
        select_backend(torch.zeros(2, 1, 4, dtype=torch.float16), backend="flash")


def test_package_imports_only_torch_stdlib_and_the_settings_checks():
    files = sorted(Path(attention_module.__file__).parent.glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "choice", "document", "sdpa", "flex", "flash"}
    roots, ours = set(), set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0
                roots.add(node.module.split(".")[0])
                if node.module.startswith("lightning_varbatch"):
                    ours.add(node.module)
    stdlib = {"__future__", "collections", "functools", "itertools", "math", "typing", "warnings"}
    assert "torch" in roots
    # flash_attn: optional, imported lazily; the settings vocabulary needs numpy only
    assert roots <= stdlib | {"torch", "flash_attn", "lightning_varbatch"}
    outside = {m for m in ours if not m.startswith("lightning_varbatch.attention.")}
    assert outside == {"lightning_varbatch.checks", "lightning_varbatch.errors"}


def test_the_public_face_keeps_every_name_and_the_old_private_entry_points_are_gone():
    """``lightning_varbatch.attention`` re-exports the names docs, examples and tests import."""
    from lightning_varbatch.attention.choice import select_backend as choice_select
    from lightning_varbatch.attention.document import document_attention as entry
    from lightning_varbatch.attention.packed_row import document_ids as ids

    assert attention_module.__all__ == [
        "BACKENDS",
        "Backend",
        "document_attention",
        "document_ids",
        "select_backend",
    ]
    assert (document_attention, document_ids, select_backend) == (entry, ids, choice_select)
    assert BACKENDS == choice_module.BACKENDS == ("auto", "flash", "flex", "sdpa")
    assert attention_module.Backend is choice_module.Backend  # the type of ``backend=``


# --------------------------------------------------------------------------- document_ids


def test_document_ids():
    cu = torch.tensor([0, 3, 3, 4, 6], dtype=torch.int32)
    assert document_ids(cu, 8).tolist() == [0, 0, 0, 2, 3, 3, -1, -1]
    assert document_ids(cu.long(), 6).dtype == torch.int64
    assert document_ids(torch.zeros(1, dtype=torch.int32), 3).tolist() == [-1, -1, -1]
    assert document_ids(torch.zeros(1, dtype=torch.int32), 0).tolist() == []
    with pytest.raises(ValueError, match="exceeds the number of tokens T = 5"):
        document_ids(cu, 5)
    with pytest.raises(SettingValueError, match="total_tokens must be a non-negative integer"):
        document_ids(cu, -1)
    with pytest.raises(TypeError, match="int32"):
        document_ids(cu.float(), 8)


# --------------------------------------------------------------------------- bad inputs


def _good():
    q, k, v = _qkv(lengths=[3, 2], pad=1)
    return {"q": q, "k": k, "v": v, "cu_seqlens": torch.tensor([0, 3, 5], dtype=torch.int32)}


def _with(**changes):
    args = _good()
    args.update(changes)
    return args


BAD = [
    (lambda g: _with(q=g["q"].tolist()), TypeError, "q must be a tensor"),
    (lambda g: _with(q=g["q"][0]), ValueError, r"all be \(total_tokens, heads, head_dim\)"),
    (lambda g: _with(q=g["q"][None]), ValueError, "all be"),
    (
        lambda g: {
            k: (x[None].expand(2, *x.shape) if k != "cu_seqlens" else x) for k, x in g.items()
        },
        ValueError,
        "a packed row has batch size 1",
    ),
    (lambda g: _with(v=g["v"][:, :, :4]), ValueError, "k and v must have the same shape"),
    (
        lambda g: _with(k=g["k"][:5], v=g["v"][:5]),
        ValueError,
        "q has 6 tokens but k and v have 5",
    ),
    (
        lambda g: _with(k=g["k"][..., :4], v=g["v"][..., :4]),
        ValueError,
        "q and k head_dim differ: 8 vs 4",
    ),
    (
        lambda g: _with(k=g["k"][:, :2], v=g["v"][:, :2]),
        ValueError,
        r"q's heads \(3\) must be a multiple of k/v's heads \(2\)",
    ),
    (lambda g: _with(v=g["v"].float()), TypeError, "share one floating dtype"),
    (
        lambda g: {**g, **{n: g[n].long() for n in "qkv"}},
        TypeError,
        "share one floating dtype",
    ),
    (lambda g: _with(cu_seqlens=[0, 3, 5]), TypeError, "cu_seqlens must be a 1-D int32 tensor"),
    (
        lambda g: _with(cu_seqlens=g["cu_seqlens"].float()),
        TypeError,
        "cu_seqlens must be int32",
    ),
    (
        lambda g: _with(cu_seqlens=g["cu_seqlens"][None]),
        ValueError,
        r"1-D tensor .* got shape \(1, 3\)",
    ),
    (
        lambda g: _with(cu_seqlens=torch.zeros(0, dtype=torch.int32)),
        ValueError,
        r"got shape \(0,\)",
    ),
    (
        lambda g: _with(cu_seqlens=torch.tensor([1, 3, 5], dtype=torch.int32)),
        ValueError,
        r"must start at 0, got cu_seqlens\[0\] = 1",
    ),
    (
        lambda g: _with(cu_seqlens=torch.tensor([0, 4, 3], dtype=torch.int32)),
        ValueError,
        r"non-decreasing .* cu_seqlens\[1\] = 4 > cu_seqlens\[2\] = 3",
    ),
    (
        lambda g: _with(cu_seqlens=torch.tensor([0, 3, 7], dtype=torch.int32)),
        ValueError,
        r"cu_seqlens\[-1\] = 7 exceeds the number of tokens T = 6",
    ),
    (
        lambda g: _with(max_seqlen=2),
        SettingValueError,
        r"max_seqlen = 2 is smaller than the longest example \(3 tokens\)",
    ),
    (lambda g: _with(max_seqlen=3.0), SettingTypeError, "max_seqlen must be a non-negative int"),
    (lambda g: _with(max_seqlen=True), SettingTypeError, "max_seqlen must be a non-negative"),
    (lambda g: _with(max_seqlen=-1), SettingValueError, "max_seqlen must be a non-negative"),
    (lambda g: _with(scale=0.0), SettingValueError, "scale must be a finite number > 0"),
    (lambda g: _with(scale=math.inf), SettingValueError, "scale must be a finite number > 0"),
    (lambda g: _with(scale="1"), SettingTypeError, "scale must be a real number"),
    (lambda g: _with(causal=1), SettingTypeError, "causal must be True or False"),
    (lambda g: _with(validate="yes"), SettingTypeError, "validate must be True or False"),
    (lambda g: _with(backend="xformers"), SettingValueError, r"backend must be one of 'auto'"),
    (lambda g: _with(backend=None), SettingTypeError, r"backend must be one of 'auto'"),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD)
def test_bad_inputs_raise_clearly(make, error, message):
    with pytest.raises(error, match=message) as caught:
        document_attention(**make(_good()))
    assert type(caught.value) is error  # the exact type, not a subclass


def test_good_inputs_pass():
    assert document_attention(**_good()).shape == (6, HEADS, DIM)
    assert set(BACKENDS) == {"auto", "flash", "flex", "sdpa"}


# -- the backend modules on their own ------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_flash_backend_passes_only_real_tokens_and_zeroes_the_padding(monkeypatch, causal):
    """flash_attn leaves rows outside cu_seqlens uninitialised: only real tokens go in."""
    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal):
        calls.append((q.shape[0], cu_q.dtype, max_q, max_k, dropout_p))
        lengths = (cu_q[1:] - cu_q[:-1]).tolist()
        return _reference(q, k, v, lengths, causal, softmax_scale)

    monkeypatch.setattr(flash_module, "flash_varlen", lambda: (fake_varlen, ""))
    q, k, v = _qkv()
    cu = _cu(LENGTHS)
    out = flash_module.flash_attention(q, k, v, cu, cu.tolist(), None, causal, None)
    assert calls == [(sum(LENGTHS), torch.int32, max(LENGTHS), max(LENGTHS), 0.0)]
    assert out.shape == (sum(LENGTHS) + PAD, HEADS, DIM)
    torch.testing.assert_close(out[: sum(LENGTHS)], _reference(q, k, v, LENGTHS, causal))
    assert out[sum(LENGTHS) :].abs().sum().item() == 0.0
    # no real token: zeros, and the kernel is not called
    empty = flash_module.flash_attention(q, k, v, _cu([]), [0], None, causal, None)
    assert len(calls) == 1 and empty.abs().sum().item() == 0.0


@pytest.mark.skipif(not _flex_importable(), reason="torch without FlexAttention")
@pytest.mark.parametrize("causal", [False, True])
def test_flex_backend_on_cpu_equals_each_example_alone(causal):
    q, k, v = _qkv(kv_heads=1, heads=HEADS)
    q, k, v = (x.float() for x in (q, k, v))
    v[sum(LENGTHS) :] = float("nan")  # a non-finite padding value must not leak
    out = flex_backend.flex_attention(q, k, v, _cu(LENGTHS), causal, None)
    kv = [x.repeat_interleave(HEADS, 1) for x in (k, v)]
    want = _reference(q, kv[0], kv[1], LENGTHS, causal)
    torch.testing.assert_close(out[: sum(LENGTHS)], want, atol=1e-5, rtol=1e-5)
    assert out[sum(LENGTHS) :].abs().sum().item() == 0.0
    none = flex_backend.flex_attention(q, k, v, torch.tensor([0]), causal, None)
    assert none.abs().sum().item() == 0.0
