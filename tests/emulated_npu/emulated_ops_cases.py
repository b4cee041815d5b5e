"""Unit tests of the emulated torch_npu (tests/emulated_npu/site): every op against an independent formulation.

The emulation is imported through the `tnpu` fixture, which puts site/ on sys.path only for this module and
afterwards removes torch_npu / torchair from sys.modules and `torch.npu`, so no other test can see it.
"""
import importlib
import importlib.machinery
import os
import sys

import pytest
import torch
import torch.nn.functional as F

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


@pytest.fixture(scope="module")
def tnpu():
    saved_path = list(sys.path)
    had_npu = hasattr(torch, "npu")
    old_npu = getattr(torch, "npu", None)
    before = set(sys.modules)
    sys.path.insert(0, SITE)
    try:
        mod = importlib.import_module("torch_npu")
        importlib.import_module("torchair")
        yield mod
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("torch_npu", "torchair"):
                del sys.modules[name]
        if had_npu:
            torch.npu = old_npu
        elif hasattr(torch, "npu"):
            del torch.npu


# ---------------------------------------------------------------------------------------------------------------
# independent reference: SDPA with an explicit boolean "may attend" mask
def keep_mask(sq, sk, mode, pre=2147483647, nxt=2147483647):
    ones = torch.ones(sq, sk, dtype=torch.bool)
    if mode == "full":
        return ones
    if mode == "causal_tl":
        return torch.tril(ones)
    if mode == "causal_br":
        return torch.tril(ones, diagonal=sk - sq)
    if mode == "band_br":
        return torch.tril(ones, diagonal=sk - sq + nxt) & torch.triu(ones, diagonal=sk - sq - pre)
    if mode == "band_tl":
        return torch.tril(ones, diagonal=nxt) & torch.triu(ones, diagonal=-pre)
    raise ValueError(mode)


def sdpa_ref(q, k, v, keep, scale):
    """q [B,N,S,D], k/v [B,Nkv,S,D], keep broadcastable to [B,N,Sq,Sk] (True = attend)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def to_layout(x, layout):
    b, n, s, d = x.shape
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d).contiguous()
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d).contiguous()
    raise ValueError(layout)


COMPRESSED = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
LAYOUTS = ["BNSD", "BSND", "BSH", "SBH"]


def qkv(b=2, n=4, nkv=2, sq=6, sk=6, d=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, n, sq, d, generator=g, dtype=dtype), torch.randn(b, nkv, sk, d, generator=g, dtype=dtype),
            torch.randn(b, nkv, sk, d, generator=g, dtype=dtype))


def random_keep(b, sq, sk, seed=1):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, 1, sq, sk, generator=g) > 0.4
    keep[..., torch.arange(sq), torch.arange(sq) % sk] = True  # no fully masked row
    return keep


# ---------------------------------------------------------------------------------------------------------------
def test_import_surface(tnpu):
    assert tnpu.EMULATED is True and tnpu.__version__.endswith("+emulated")
    assert torch.npu is tnpu.npu
    assert tnpu.npu.is_available() is False and tnpu.npu.device_count() == 0
    assert tnpu.npu.default_generators[0] is torch.default_generator
    tnpu.npu.manual_seed(123)
    a = torch.rand(3)
    tnpu.npu.manual_seed(123)
    assert torch.equal(a, torch.rand(3))
    from torch_npu.contrib import transfer_to_npu
    from torch_npu.npu import _lazy_call, device
    assert transfer_to_npu.PATCHED is False
    hits = []
    _lazy_call(lambda: hits.append(1))
    with device(0):
        pass
    assert hits == [1]
    assert tnpu.npu.current_device() == 0  # an index, as the real one returns
    assert torch.tensor([1], device=tnpu.npu.current_device()).device.type == "cpu"
    assert not hasattr(tnpu._C._distributed_c10d.ProcessGroupHCCL.Options, "hccl_config")
    assert torch.qint8 in tnpu.unsupported_dtype
    assert "Ascend910_95" not in tnpu.npu.get_device_name()
    s = tnpu.npu.Stream()
    with tnpu.npu.stream(s):
        s.wait_stream(tnpu.npu.current_stream())
    tnpu.npu.mstx.range_end(tnpu.npu.mstx.range_start("x"))


def test_refuses_unknown_attributes_so_hasattr_probes_fall_back(tnpu):
    # MindSpeed probes these and falls back to Megatron's permute when absent (features_manager/fusions)
    assert not hasattr(tnpu, "npu_moe_token_permute_with_routing_map")
    assert not hasattr(tnpu, "npu_moe_token_unpermute_with_routing_map")
    assert not hasattr(tnpu, "empty_with_swapped_memory")
    with pytest.raises(AttributeError, match="not emulated"):
        _ = tnpu.npu_dynamic_mx_quant
    with pytest.raises(NotImplementedError):
        tnpu._C._distributed_c10d.ProcessGroupHCCL.Options()
    with pytest.raises(NotImplementedError):
        tnpu.npu.Event().elapsed_time(tnpu.npu.Event())


def test_torchair_stub_registers_but_refuses_graphs(tnpu):
    import torchair
    from torchair.ge import DataType, Tensor, TensorSpec  # noqa: F401

    def conv(x):
        return x
    assert torchair.register_fx_node_ge_converter(object())(conv) is conv
    assert DataType.DT_BF16 != DataType.DT_FLOAT
    with pytest.raises(NotImplementedError):
        torchair.ge.custom_op("Fill")
    with pytest.raises(NotImplementedError):
        torchair.get_npu_backend()


def test_call_counters(tnpu):
    tnpu.emulation.reset_counts()
    x = torch.randn(3, 4)
    tnpu.npu_swiglu(x)
    tnpu.npu_swiglu(x)
    tnpu.npu_rms_norm(x, torch.ones(4))
    assert tnpu.emulation.call_counts() == {"npu_swiglu": 2, "npu_rms_norm": 1}
    tnpu.emulation.reset_counts()
    assert tnpu.emulation.call_counts() == {}
    # the attention ops are counted per variant too: which layout and sparse_mode a run took
    t = torch.randn(5, 2, 4)
    tnpu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=COMPRESSED, sparse_mode=2, actual_seq_qlen=[2, 5],
                              actual_seq_kvlen=[2, 5])
    from parity.engines.fused_ops import attention_variant
    assert tnpu.emulation.call_counts() == {"npu_fusion_attention": 1, "npu_fusion_attention[TND, sparse_mode=2]": 1}
    assert attention_variant("npu_fusion_attention", (t, t, t, 2, "TND"), {"sparse_mode": 2}) == \
        "npu_fusion_attention[TND, sparse_mode=2]"  # the real torch_npu's counting wrapper names them alike
    tnpu.emulation.reset_counts()


# ---------------------------------------------------------------------------------------------------------------
CASES = [  # (sparse_mode, atten_mask kind, pre, next, sq, sk, reference keep)
    ("none", 0, None, 2147483647, 2147483647, 6, 6),
    ("none_ignores_band", 0, None, 1, 0, 6, 6),  # no mask: pre/next ignored (CANN doc, sparse_mode 0)
    ("given_full_band", 0, "random", 2147483647, 2147483647, 6, 6),
    ("given_with_band", 0, "random", 2, 1, 6, 6),
    ("allmask", 1, "random", 1, 0, 6, 6),  # mode 1 ignores pre/next
    ("causal_tl", 2, "compressed", 0, 0, 5, 7),
    ("causal_br", 3, "compressed", 0, 0, 5, 7),
    ("causal_br_square", 3, "compressed", 6, 0, 6, 6),
    ("band_br", 4, "compressed", 2, 1, 5, 7),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fusion_attention_matches_sdpa(tnpu, layout, case):
    _name, mode, kind, pre, nxt, sq, sk = case
    b, n, nkv, d = 2, 4, 2, 8
    q, k, v = qkv(b, n, nkv, sq, sk, d)
    if kind == "random":
        given_keep = random_keep(b, sq, sk)
        given_keep[..., torch.arange(sq), torch.arange(sq)] = True
        atten = ~given_keep
        keep = given_keep & keep_mask(sq, sk, "band_tl", pre, nxt) if mode == 0 else given_keep
    elif kind == "compressed":
        atten = COMPRESSED
        keep = keep_mask(sq, sk, {2: "causal_tl", 3: "causal_br", 4: "band_br"}[mode], pre, nxt)
    else:
        atten, keep = None, keep_mask(sq, sk, "full")
    scale = d ** -0.5
    out, smax, ssum, sout, seed, offset, numels = tnpu.npu_fusion_attention(
        to_layout(q, layout), to_layout(k, layout), to_layout(v, layout), n, layout, atten_mask=atten, scale=scale,
        pre_tockens=pre, next_tockens=nxt, sparse_mode=mode)
    ref = sdpa_ref(q, k, v, keep, scale)
    torch.testing.assert_close(out, to_layout(ref, layout), atol=1e-5, rtol=1e-5)
    # statistics: fp32 [B, N, Sq, 8] replicated; max + log(sum) = logsumexp of the visible scaled scores
    assert smax.shape == (b, n, sq, 8) and ssum.shape == (b, n, sq, 8) and smax.dtype == torch.float32
    assert torch.equal(smax, smax[..., :1].expand_as(smax))
    scores = (q @ k.repeat_interleave(n // nkv, 1).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(smax[..., 0] + ssum[..., 0].log(), torch.logsumexp(scores, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(smax[..., 0], scores.amax(-1))
    assert (seed, offset, numels) == (0, 0, 0) and sout.numel() == 0


def _tnd(x, ends):  # [1, N, T, D] reference pieces per sequence
    return [x[:, :, a:b_] for a, b_ in zip([0, *ends[:-1]], ends)]


@pytest.mark.parametrize("mode", [0, 3, 2])
def test_fusion_attention_tnd_varlen(tnpu, mode):
    n, nkv, d = 4, 2, 8
    ends = [3, 8, 12]
    q, k, v = qkv(1, n, nkv, 12, 12, d, seed=3)
    scale = 0.4
    tq, tk, tv = (x[0].permute(1, 0, 2).contiguous() for x in (q, k, v))  # [T, N, D]
    for t in (tq, tk, tv):
        t.requires_grad_(True)
    atten = None if mode == 0 else COMPRESSED
    out, smax, ssum = tnpu.npu_fusion_attention(tq, tk, tv, n, "TND", atten_mask=atten, scale=scale,
                                                 actual_seq_qlen=ends, actual_seq_kvlen=ends,
                                                 sparse_mode=mode, pre_tockens=65536, next_tockens=0)[:3]
    assert out.shape == (12, n, d) and smax.shape == (12, n, 8) and ssum.shape == (12, n, 8)
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    pieces = [sdpa_ref(qs, ks, vs, keep_mask(qs.shape[2], ks.shape[2], "full" if mode == 0 else "causal_tl"), scale)
              for qs, ks, vs in zip(_tnd(qr, ends), _tnd(kr, ends), _tnd(vr, ends))]
    ref = torch.cat(pieces, dim=2)[0].permute(1, 0, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(tq.grad, qr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tk.grad, kr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tv.grad, vr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("mode", [0, 3])
def test_fusion_attention_tnd_with_other_kv_lengths_and_its_grad_op(tnpu, mode):
    """What MindSpeed's ring-causal TND path asks (ring_context_parallel.py tnd_forward_fetch): each query sequence
    against a kv sequence of ANOTHER length (the first halves of a KV block: actual_seq_kvlen halved), with no mask
    (sparse_mode 0) or bottom-right causal (3); then the grad op from the statistics the forward returned, [T, N, 8]
    as tnd_out_update views them. Reference: SDPA per sequence pair. Bottom-right causal with the shorter side the
    query (a longer query would leave its first rows with no key: poisoned, see the fully masked row cases)."""
    n, nkv, d = 4, 2, 8
    q_ends, kv_ends = ([4, 10, 12], [2, 7, 12]) if mode == 0 else ([2, 6, 12], [3, 8, 15])
    q, _, _ = qkv(1, n, nkv, 12, 12, d, seed=13)
    _, k, v = qkv(1, n, nkv, 12, kv_ends[-1], d, seed=14)
    scale = 0.3
    tq, tk, tv = (x[0].permute(1, 0, 2).contiguous() for x in (q, k, v))
    atten = None if mode == 0 else COMPRESSED
    out, smax, ssum = tnpu.npu_fusion_attention(tq, tk, tv, n, "TND", atten_mask=atten, scale=scale,
                                                 actual_seq_qlen=q_ends, actual_seq_kvlen=kv_ends, sparse_mode=mode,
                                                 pre_tockens=65536, next_tockens=0 if mode else 65536)[:3]
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    pieces = [sdpa_ref(qs, ks, vs, keep_mask(qs.shape[2], ks.shape[2], "full" if mode == 0 else "causal_br"), scale)
              for qs, ks, vs in zip(_tnd(qr, q_ends), _tnd(kr, kv_ends), _tnd(vr, kv_ends))]
    ref = torch.cat(pieces, dim=2)[0].permute(1, 0, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert smax.shape == ssum.shape == (12, n, 8) and torch.equal(smax, smax[..., :1].expand_as(smax))
    dy = torch.randn_like(out)
    ref.backward(dy)
    dq, dk, dv, _ = tnpu.npu_fusion_attention_grad(
        tq, tk, tv, dy, n, "TND", atten_mask=atten, softmax_max=smax, softmax_sum=ssum, attention_in=out,
        scale_value=scale, actual_seq_qlen=q_ends, actual_seq_kvlen=kv_ends, sparse_mode=mode, pre_tockens=65536,
        next_tockens=0 if mode else 65536)
    torch.testing.assert_close(dq, qr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dk, kr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dv, vr.grad[0].permute(1, 0, 2), atol=1e-5, rtol=1e-4)


def test_fusion_attention_tnd_statistics_are_per_sequence_head_major(tnpu):
    """CANN's TND softmax_max / softmax_sum: shaped [T, N, 8], laid out per query sequence, head-major inside it;
    MindSpeed's TND ring merge reads them so (context_parallel/utils.py flatten_softmax: each sequence's s * N rows
    viewed [N, s, 8], transposed to token order). Token-major statistics would merge the wrong rows."""
    n, d = 3, 4
    ends = [2, 7, 9]
    q, k, v = qkv(1, n, n, 9, 9, d, seed=19)
    tq, tk, tv = (x[0].permute(1, 0, 2).contiguous() for x in (q, k, v))
    smax, ssum = tnpu.npu_fusion_attention(tq, tk, tv, n, "TND", atten_mask=COMPRESSED, scale=0.5, sparse_mode=2,
                                           actual_seq_qlen=ends, actual_seq_kvlen=ends)[1:3]
    assert smax.shape == ssum.shape == (9, n, 8)
    rows = smax.reshape(-1, 8)
    token_major = torch.cat([rows[a * n:b * n].view(n, b - a, 8).transpose(0, 1) for a, b in zip([0, 2, 7], ends)])
    scores = torch.full((n, 9, 9), float("-inf"))
    for a, b in zip([0, 2, 7], ends):
        block = (q[0, :, a:b] @ k[0, :, a:b].transpose(-1, -2)) * 0.5
        scores[:, a:b, a:b] = block.masked_fill(~torch.ones(b - a, b - a, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(token_major[..., 0], scores.amax(-1).transpose(0, 1))


def test_fusion_attention_tnd_takes_cu_seqlens_with_their_leading_zero(tnpu):
    """MindSpeed's TE attention passes `cu_seqlens_q.tolist()` — Megatron's cu_seqlens, which start at 0 — as
    actual_seq_qlen (mindspeed/te/pytorch/attention/dot_product_attention/backend.py): the leading 0 ends an empty
    first sequence and changes nothing."""
    n, d = 2, 4
    q, k, v = qkv(1, n, n, 9, 9, d, seed=17)
    tq, tk, tv = (x[0].permute(1, 0, 2).contiguous() for x in (q, k, v))

    def run(ends):
        return tnpu.npu_fusion_attention(tq, tk, tv, n, "TND", atten_mask=COMPRESSED, scale=0.5, sparse_mode=2,
                                         actual_seq_qlen=ends, actual_seq_kvlen=ends)[0]
    assert torch.equal(run([0, 4, 9]), run([4, 9]))
    assert not torch.equal(run([4, 9]), run([5, 9]))  # the boundaries matter


@pytest.mark.parametrize("ends,kv_ends,match", [
    ([4, 8], [4, 9], "finishing at T=9"),  # q lengths sum to 8, T is 9
    ([4, 9], [4, 8], "finishing at T=9"),
    ([5, 4, 9], [5, 4, 9], "non-decreasing"),
    ([4, 9], [9], "query sequences but"),
])
def test_fusion_attention_tnd_refuses_lengths_that_do_not_describe_t(tnpu, ends, kv_ends, match):
    t = torch.randn(9, 2, 4)
    with pytest.raises(NotImplementedError, match=match):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=COMPRESSED, sparse_mode=2, actual_seq_qlen=ends,
                                  actual_seq_kvlen=kv_ends)


@pytest.mark.parametrize("mode", [0, 1])
def test_fusion_attention_tnd_refuses_an_explicit_mask(tnpu, mode):
    """TND takes no [Sq, Skv] / [B, 1, Sq, Skv] mask (there is no batch dimension to index it by): only the
    compressed causal mask with sparse_mode 2/3/4, or none."""
    t = torch.randn(9, 2, 4)
    for mask in (torch.zeros(9, 9, dtype=torch.bool), torch.zeros(1, 1, 9, 9, dtype=torch.bool)):
        with pytest.raises(NotImplementedError, match="TND with an explicit atten_mask"):
            tnpu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=mask, sparse_mode=mode, actual_seq_qlen=[4, 9],
                                      actual_seq_kvlen=[4, 9])


@pytest.mark.parametrize("layout,mode", [("BNSD", 3), ("SBH", 1), ("BSH", 0), ("BSND", 4)])
def test_fusion_attention_gradcheck(tnpu, layout, mode):
    q, k, v = qkv(1, 2, 1, 3, 4, 4, dtype=torch.float64, seed=5)
    atten = {3: COMPRESSED, 4: COMPRESSED, 1: ~random_keep(1, 3, 4), 0: None}[mode]
    args = [to_layout(x, layout).requires_grad_(True) for x in (q, k, v)]

    def f(a, b_, c):
        return tnpu.npu_fusion_attention(a, b_, c, 2, layout, atten_mask=atten, scale=0.7, sparse_mode=mode,
                                         pre_tockens=1, next_tockens=0)[0]
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fusion_attention_grad_op_matches_autograd(tnpu, layout):
    n, nkv, d = 4, 2, 8
    q, k, v = qkv(2, n, nkv, 6, 6, d, seed=7)
    scale = d ** -0.5
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref = sdpa_ref(qr, kr, vr, keep_mask(6, 6, "causal_br"), scale)
    dy = torch.randn_like(ref)
    ref.backward(dy)
    L = lambda x: to_layout(x, layout)  # noqa: E731
    out, smax, ssum = tnpu.npu_fusion_attention(L(q), L(k), L(v), n, layout, atten_mask=COMPRESSED, scale=scale,
                                                 sparse_mode=3)[:3]
    for kwargs in ({"softmax_max": smax, "softmax_sum": ssum, "attention_in": out}, {}):
        dq, dk, dv, _ = tnpu.npu_fusion_attention_grad(L(q), L(k), L(v), L(dy), n, layout, atten_mask=COMPRESSED,
                                                       scale_value=scale, sparse_mode=3, **kwargs)
        torch.testing.assert_close(dq, L(qr.grad), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(dk, L(kr.grad), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(dv, L(vr.grad), atol=1e-5, rtol=1e-4)


def test_ring_style_blockwise_merge_and_grad(tnpu):
    """Two KV blocks attended separately, merged with the online-softmax rule MindSpeed uses
    (context_parallel/utils.py forward_update_without_fused), then each block's grad from the MERGED statistics:
    must equal full attention. Every query keeps at least one key in each block (a block that masks some rows whole:
    test_online_softmax_merge_discards_a_fully_masked_block_and_naive_merges_do_not)."""
    n, d, s = 2, 4, 4
    q, k, v = qkv(1, n, n, s, 2 * s, d, seed=11)
    scale = 0.5
    second = torch.ones(1, 1, s, s, dtype=torch.bool)
    second[..., torch.arange(s), (torch.arange(s) * 3) % s] = False  # one key per query, not the diagonal
    blocks = [(k[:, :, :s], v[:, :, :s], torch.zeros(1, 1, s, s, dtype=torch.bool)), (k[:, :, s:], v[:, :, s:], second)]
    outs = [tnpu.npu_fusion_attention(q, kb, vb, n, "BNSD", atten_mask=m, scale=scale, sparse_mode=1)[:3]
            for kb, vb, m in blocks]
    merged, mx, tot = merge(outs, "online_softmax")
    keep = torch.cat([torch.ones(s, s, dtype=torch.bool), ~second[0, 0]], dim=1)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref = sdpa_ref(qr, kr, vr, keep, scale)
    torch.testing.assert_close(merged, ref, atol=1e-5, rtol=1e-5)
    assert_block_grads(tnpu, q, blocks, (merged, mx, tot), ref, (qr, kr, vr), n, scale)


# --- the op reference's edges (docs/ascend.md, "The emulated ops against the op reference"): each refusal next to
# --- the clean call one step inside the rule

FLOAT32_LOWEST = torch.finfo(torch.float32).min


def assert_poison(rows):
    """What the emulation returns where the reference leaves an output undefined: finite, and far beyond any
    attention output (a convex combination of value rows)."""
    from torch_npu._attention import POISON_MIN

    assert rows.numel() and torch.isfinite(rows).all() and (rows.abs() >= POISON_MIN).all(), rows


def one_row_masked(s=4, row=2):
    mask = torch.zeros(1, 1, s, s, dtype=torch.bool)
    mask[..., row, :] = True
    return mask


@pytest.mark.parametrize("inner_precise", [0, 1])
@pytest.mark.parametrize("layout", ["BNSD", "SBH"])
def test_fusion_attention_poisons_a_fully_masked_row(tnpu, inner_precise, layout):
    """A fully masked query row is legal input whose output the reference leaves undefined (inner_precise 2 "enables
    invalid-row computation"; 0/1 say nothing): attention_out is poison there, the statistics are the empty row's
    (sum 0, max the lowest fp32), every other row is exact. The clean twin: that row keeps one key, no poison."""
    n = 2
    q, k, v = qkv(1, n, n, 4, 4, 4, seed=3)
    masked = one_row_masked()
    kept = masked.clone()
    kept[..., 2, 3] = False

    def call(mask):
        out, smax, ssum = tnpu.npu_fusion_attention(to_layout(q, layout), to_layout(k, layout), to_layout(v, layout),
                                                    n, layout, atten_mask=mask, scale=0.5, sparse_mode=1,
                                                    inner_precise=inner_precise)[:3]
        out = out if layout == "BNSD" else out.reshape(4, 1, n, 4).permute(1, 2, 0, 3)
        return out, smax[..., 0], ssum[..., 0]
    out, smax, ssum = call(masked)
    assert_poison(out[:, :, 2])
    assert (smax[:, :, 2] == FLOAT32_LOWEST).all() and (ssum[:, :, 2] == 0).all()
    live = [0, 1, 3]
    ref = sdpa_ref(q, k, v, ~kept, 0.5)  # rows 0, 1, 3 as masked; row 2 of ref is the clean twin's
    torch.testing.assert_close(out[:, :, live], ref[:, :, live], atol=1e-6, rtol=1e-6)
    assert (ssum[:, :, live] >= 1).all()
    out, smax, ssum = call(kept)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert (out.abs() < 10).all() and (ssum >= 1).all()


def test_fusion_attention_poison_is_reproducible_per_call_and_leaves_the_global_rng(tnpu):
    """Seeded per call by a per-process counter: the same call number draws the same poison (runs reproduce), the
    next call another; the global RNG, which the harness's runs share with the reference, does not move."""
    import itertools

    from torch_npu import _attention

    q, k, v = qkv(1, 2, 2, 4, 4, 4, seed=3)
    whole = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    rng = torch.get_rng_state()

    def call():
        return tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=whole, sparse_mode=1)[0]
    _attention._POISON_CALLS = itertools.count(1000)
    first, second = call(), call()
    _attention._POISON_CALLS = itertools.count(1000)
    assert torch.equal(call(), first)
    assert not torch.equal(first, second)
    assert torch.equal(torch.get_rng_state(), rng)
    assert_poison(first)
    assert (first > 0).any() and (first < 0).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fusion_attention_poison_is_finite_in_every_dtype(tnpu, dtype):
    q, k, v = qkv(1, 2, 2, 4, 4, 4, dtype=dtype, seed=3)
    out = tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool),
                                    sparse_mode=1)[0]
    assert out.dtype == dtype
    assert_poison(out.float())


def test_fusion_attention_poisons_rows_a_bottom_right_causal_mask_leaves_empty(tnpu):
    """sparse_mode 3 with Sq > Skv masks every key of the first Sq - Skv queries (the reference: the kernel then
    enables invalid-row computation by itself, values not documented): those rows are poison, the rest exact."""
    q, k, v = qkv(1, 2, 2, 6, 4, 4)
    out, smax, ssum = tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=COMPRESSED, sparse_mode=3,
                                                scale=0.5)[:3]
    assert_poison(out[:, :, :2])
    assert (ssum[:, :, :2] == 0).all() and (smax[:, :, :2] == FLOAT32_LOWEST).all()
    ref = sdpa_ref(q[:, :, 2:], k, v, keep_mask(4, 4, "causal_br"), 0.5)  # the last 4 queries, aligned bottom-right
    torch.testing.assert_close(out[:, :, 2:], ref, atol=1e-6, rtol=1e-6)


def test_fusion_attention_tnd_refuses_a_query_sequence_without_kv(tnpu):
    """The reference does not support Sq > 0 with Skv = 0 in a varlen batch (MindSpeed docs/zh/ops/
    fusion_attention.md, input limits): refused, not poisoned. An empty QUERY sequence is supported: it runs."""
    t = torch.randn(9, 2, 4)
    with pytest.raises(NotImplementedError, match="no kv token"):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[4, 6, 9], actual_seq_kvlen=[4, 4, 9])
    out = tnpu.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[4, 4, 9], actual_seq_kvlen=[4, 6, 9])[0]
    assert torch.isfinite(out).all() and (out.abs() < 10).all()


@pytest.mark.parametrize("stats", ["given", "recomputed"])
def test_fusion_attention_grad_of_a_fully_masked_row_follows_the_statistics_it_gets(tnpu, stats):
    """The grad op's P = exp(S - softmax_max) / softmax_sum. With the empty row's own statistics (sum 0) P is 0/0:
    poisoned, and the poison reaches the grads only through that row's dy. dy 0 there (a caller that discarded the
    row): every grad exact, i.e. the grads of the other rows' loss. dy non-zero there: poisoned grads."""
    n, row = 2, 2
    q, k, v = qkv(1, n, n, 4, 4, 4, seed=5)
    masked = one_row_masked(row=row)
    out, smax, ssum = tnpu.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=masked, scale=0.5, sparse_mode=1)[:3]
    given = {"softmax_max": smax, "softmax_sum": ssum, "attention_in": out} if stats == "given" else {}
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    live = [0, 1, 3]
    dy = torch.randn_like(q)
    dy[:, :, row] = 0
    sdpa_ref(qr, kr, vr, ~masked, 0.5)[:, :, live].backward(dy[:, :, live])
    dq, dk, dv, _ = tnpu.npu_fusion_attention_grad(q, k, v, dy, n, "BNSD", atten_mask=masked, scale_value=0.5,
                                                   sparse_mode=1, **given)
    torch.testing.assert_close(dq, qr.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dk, kr.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dv, vr.grad, atol=1e-5, rtol=1e-4)
    assert (dq[:, :, row] == 0).all()
    dy[:, :, row] = 1.0  # the planted caller: it used the undefined row
    dq, dk, dv, _ = tnpu.npu_fusion_attention_grad(q, k, v, dy, n, "BNSD", atten_mask=masked, scale_value=0.5,
                                                   sparse_mode=1, **given)
    assert (dq[:, :, row].abs() > 1e3).all() and (dv.abs() > 1e3).any()


def test_fusion_attention_autograd_through_a_poisoned_row(tnpu):
    """The same through autograd: a loss that weights the poisoned row by 0 gets exact grads; one that uses it
    gets poison."""
    n, row = 2, 2
    q, k, v = qkv(1, n, n, 4, 4, 4, seed=5)
    masked = one_row_masked(row=row)
    weight = torch.randn(1, n, 4, 4)
    weight[:, :, row] = 0
    qt, kt, vt = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = tnpu.npu_fusion_attention(qt, kt, vt, n, "BNSD", atten_mask=masked, scale=0.5, sparse_mode=1)[0]
    (out * weight).sum().backward()
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    (sdpa_ref(qr, kr, vr, ~masked, 0.5)[:, :, [0, 1, 3]] * weight[:, :, [0, 1, 3]]).sum().backward()
    for got, want in ((qt, qr), (kt, kr), (vt, vr)):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-5, rtol=1e-4)
    qt.grad = None
    out = tnpu.npu_fusion_attention(qt, kt, vt, n, "BNSD", atten_mask=masked, scale=0.5, sparse_mode=1)[0]
    out.sum().backward()
    assert (qt.grad[:, :, row].abs() > 1e3).all()


def merge(blocks, how):
    """Block outputs [(out, softmax_max, softmax_sum)] merged over KV blocks. 'online_softmax': MindSpeed's rule
    (context_parallel/utils.py forward_update_without_fused, folded over the blocks in ring order): each block
    weighted by softmax_sum * exp(softmax_max - max). The planted naive merges read attention_out as it is,
    without the statistics: 'sum' and 'mean' of the block outputs."""
    if how in ("sum", "mean"):
        return sum(b[0] for b in blocks) / (len(blocks) if how == "mean" else 1), None, None
    out, mx, tot = blocks[0]
    for o2, m2, l2 in blocks[1:]:
        new = torch.maximum(mx, m2)
        w1, w2 = tot * torch.exp(mx - new), l2 * torch.exp(m2 - new)
        tot = w1 + w2
        out = out * (w1 / tot)[..., :1] + o2 * (w2 / tot)[..., :1]
        mx = new
    return out, mx, tot


def assert_block_grads(tnpu, q, blocks, merged_stats, ref, leaves, n, scale):
    """Each KV block's grad from the MERGED output and statistics (as ring_context_parallel.py hands them to
    npu_fusion_attention_grad) against autograd through full attention (`ref` over `leaves` q, k, v)."""
    merged, mx, tot = merged_stats
    qr, kr, vr = leaves
    dy = torch.randn_like(ref)
    ref.backward(dy)
    grads = [tnpu.npu_fusion_attention_grad(q, kb, vb, dy, n, "BNSD", atten_mask=m, softmax_max=mx, softmax_sum=tot,
                                            attention_in=merged, scale_value=scale, sparse_mode=1)
             for kb, vb, m in blocks]
    torch.testing.assert_close(grads[0][0] + grads[1][0], qr.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([grads[0][1], grads[1][1]], 2), kr.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([grads[0][2], grads[1][2]], 2), vr.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("masked", ["whole_block", "some_rows"])
@pytest.mark.parametrize("first", ["masked_block", "live_block"])
def test_online_softmax_merge_discards_a_fully_masked_block_and_naive_merges_do_not(tnpu, masked, first):
    """What MindSpeed's general ring strategy asks of the op (compute_mask: kv_block_id > q_block_id masks the
    whole block; a left-padded batch masks some rows of a block): the online-softmax merge over the blocks equals
    full attention, forward and each block's grad from the MERGED statistics (ring_context_parallel.py hands them
    to npu_fusion_attention_grad); the masked block first or second in the ring. The planted merges that read the
    poisoned attention_out directly are off by the poison."""
    n, d, s = 2, 4, 4
    q, k, v = qkv(1, n, n, s, 2 * s, d, seed=11)
    scale = 0.5
    live = torch.zeros(1, 1, s, s, dtype=torch.bool)
    live[..., 1, 0] = True  # some masking in the live block too
    dead = torch.ones(1, 1, s, s, dtype=torch.bool)
    if masked == "some_rows":
        dead[..., 2:, :2] = False  # rows 0, 1 fully masked in this block, rows 2, 3 keep two keys
    blocks = [(k[:, :, :s], v[:, :, :s], live), (k[:, :, s:], v[:, :, s:], dead)]
    keep = torch.cat([~live[0, 0], ~dead[0, 0]], dim=1)
    if first == "masked_block":
        blocks, keep = blocks[::-1], torch.cat([keep[:, s:], keep[:, :s]], dim=1)
    k_full, v_full = torch.cat([b[0] for b in blocks], 2), torch.cat([b[1] for b in blocks], 2)
    outs = [tnpu.npu_fusion_attention(q, kb, vb, n, "BNSD", atten_mask=m, scale=scale, sparse_mode=1)[:3]
            for kb, vb, m in blocks]
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k_full, v_full))
    ref = sdpa_ref(qr, kr, vr, keep, scale)
    merged, mx, tot = merge(outs, "online_softmax")
    torch.testing.assert_close(merged, ref, atol=1e-5, rtol=1e-5)
    for naive in ("sum", "mean"):
        assert (merge(outs, naive)[0] - ref).abs().max() > 1e3, naive
    assert_block_grads(tnpu, q, blocks, (merged, mx, tot), ref, (qr, kr, vr), n, scale)


def test_fusion_attention_tnd_takes_trailing_zeros(tnpu):
    """Trailing zeros pad an actual_seq_qlen / kvlen list (legal on the device): the same result as without them;
    a zero in the middle is still not a cumulative list."""
    n, d = 2, 4
    q, k, v = qkv(1, n, n, 9, 9, d, seed=17)
    tq, tk, tv = (x[0].permute(1, 0, 2).contiguous() for x in (q, k, v))

    def run(ends, kv_ends):
        return tnpu.npu_fusion_attention(tq, tk, tv, n, "TND", atten_mask=COMPRESSED, scale=0.5, sparse_mode=2,
                                         actual_seq_qlen=ends, actual_seq_kvlen=kv_ends)[0]
    assert torch.equal(run([4, 9, 0, 0], [4, 9, 0, 0]), run([4, 9], [4, 9]))
    assert torch.equal(run([4, 9, 0], [4, 9]), run([4, 9], [4, 9]))
    with pytest.raises(NotImplementedError, match="non-decreasing"):
        run([4, 0, 9], [4, 0, 9])


@pytest.mark.parametrize("name", ["actual_seq_qlen", "actual_seq_kvlen", "prefix"])
def test_fusion_attention_refuses_a_tensor_where_it_takes_int_list(tnpu, name):
    """`int[]` arguments are host lists (MindSpeed passes cu_seqlens.tolist()); a Tensor is refused, the list runs."""
    t = torch.randn(9, 2, 4)
    lists = {"actual_seq_qlen": [4, 9], "actual_seq_kvlen": [4, 9]}
    given = {**lists, name: torch.tensor([4, 9])}
    with pytest.raises(NotImplementedError, match=f"{name} as a Tensor"):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=COMPRESSED, sparse_mode=2, **given)
    tnpu.npu_fusion_attention(t, t, t, 2, "TND", atten_mask=COMPRESSED, sparse_mode=2, **lists)


def test_fusion_attention_takes_softmax_layout_in_its_signature(tnpu):
    """op-plugin's signature ends in softmax_layout="" (op_plugin/python/meta/_fake_registrations.py); the default
    runs, a layout of the statistics the emulation does not implement is refused."""
    q, k, v = qkv(1, 2, 2, 4, 4, 4)
    tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", softmax_layout="")
    tnpu.npu_fusion_attention_grad(q, k, v, q, 2, "BNSD", softmax_layout="")
    with pytest.raises(NotImplementedError, match="softmax_layout='TND'"):
        tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", softmax_layout="TND")


def test_rms_norm_refuses_a_gamma_of_another_dtype(tnpu):
    """The reference: gamma's dtype must be self's. verl's npu_patch passed an fp32 weight with bf16 activations
    before it cast x to the weight's dtype (verl/models/transformers/npu_patch.py rms_norm_forward_npu)."""
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    mixed = r"gamma of dtype torch\.float32 for an input of dtype torch\.bfloat16"
    with pytest.raises(NotImplementedError, match=mixed):
        tnpu.npu_rms_norm(x, torch.ones(8, dtype=torch.float32))
    y, _ = tnpu.npu_rms_norm(x.float(), torch.ones(8, dtype=torch.float32))  # verl main's call: x cast first
    assert y.dtype == torch.float32
    with pytest.raises(NotImplementedError, match="9-d input"):
        tnpu.npu_rms_norm(torch.randn(*[1] * 8, 8), torch.ones(8))


def test_rotary_mul_takes_only_the_documented_4d_layouts_and_sizes(tnpu):
    """The reference: input, r1, r2 4-D; r1/r2 one of the listed shapes per layout; D even and < 896; B, N < 1000
    (half) or B*N < 1000 (interleave). HF's q/k with unsqueezed cos/sin ([B, N, S, D] with [B, 1, S, D]) run."""
    x = torch.randn(2, 3, 5, 8)
    cos, sin = torch.rand(2, 1, 5, 8), torch.rand(2, 1, 5, 8)
    tnpu.npu_rotary_mul(x, cos, sin)  # BNSD with B1SD
    tnpu.npu_rotary_mul(x, cos[:1], sin[:1])  # 11SD
    with pytest.raises(NotImplementedError, match="4-D each"):
        tnpu.npu_rotary_mul(x[0], cos[0], sin[0])  # 3-D: broadcasts in torch, not a documented call
    with pytest.raises(NotImplementedError, match="documented layouts"):
        tnpu.npu_rotary_mul(x, torch.rand(1, 3, 5, 8), torch.rand(1, 3, 5, 8))  # [1, N, S, D]: no layout lists it
    with pytest.raises(NotImplementedError, match="D=7"):
        tnpu.npu_rotary_mul(torch.randn(1, 1, 2, 7), torch.rand(1, 1, 2, 7), torch.rand(1, 1, 2, 7))
    with pytest.raises(NotImplementedError, match="r1 of shape"):
        tnpu.npu_rotary_mul(x, cos, sin[:1])
    wide = torch.randn(1, 1000, 2, 8)  # N = 1000 in BNSD (and S of BSND: r 11SD names none of those)
    with pytest.raises(NotImplementedError, match="beyond the reference's bounds"):
        tnpu.npu_rotary_mul(wide, torch.rand(1, 1, 2, 8), torch.rand(1, 1, 2, 8))
    tnpu.npu_rotary_mul(wide[:, :999], torch.rand(1, 1, 2, 8), torch.rand(1, 1, 2, 8))
    with pytest.raises(NotImplementedError, match="interleave"):
        tnpu.npu_rotary_mul(torch.randn(40, 25, 2, 8), torch.rand(1, 1, 2, 8), torch.rand(1, 1, 2, 8),
                            rotary_mode="interleave")  # B*N = 1000
    tnpu.npu_rotary_mul(torch.randn(37, 27, 2, 8), torch.rand(1, 1, 2, 8), torch.rand(1, 1, 2, 8),
                        rotary_mode="interleave")  # B*N = 999


@pytest.mark.parametrize("mode", [2, 3, 4])
def test_refuses_padding_mask_with_compressed_modes(tnpu, mode):
    q, k, v = qkv(2, 2, 2, 4, 4, 4)
    padding = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    for bad in (padding, None, torch.tril(torch.ones(2048, 2048, dtype=torch.bool)),
                torch.triu(torch.ones(1024, 1024, dtype=torch.bool), 1)):
        with pytest.raises(AssertionError, match="compressed"):
            tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", atten_mask=bad, sparse_mode=mode)
        with pytest.raises(AssertionError, match="compressed"):
            tnpu.npu_fusion_attention_grad(q, k, v, q, 2, "BNSD", atten_mask=bad, sparse_mode=mode)


@pytest.mark.parametrize("kwargs,match", [
    ({"keep_prob": 0.9}, "keep_prob"),
    ({"pse": torch.zeros(1)}, "pse"),
    ({"padding_mask": torch.zeros(1)}, "padding_mask"),
    ({"prefix": [1]}, "prefix"),
    ({"sparse_mode": 5}, "sparse_mode=5"),
    ({"sparse_mode": 7}, "sparse_mode=7"),
    ({"actual_seq_qlen": [4], "actual_seq_kvlen": [4]}, "TND only"),
    ({"atten_mask": torch.zeros(2, 1, 4, 4)}, "dtype"),
    ({"atten_mask": torch.zeros(2, 1, 4, 5, dtype=torch.bool)}, "shape"),
    ({"inner_precise": 2}, "inner_precise"),
])
def test_fusion_attention_refuses(tnpu, kwargs, match):
    q, k, v = qkv(2, 2, 2, 4, 4, 4)
    with pytest.raises(NotImplementedError, match=match):
        tnpu.npu_fusion_attention(q, k, v, 2, "BNSD", **kwargs)


def test_fusion_attention_refuses_bad_shapes(tnpu):
    q, k, v = qkv(1, 3, 2, 4, 4, 4)
    with pytest.raises(NotImplementedError, match="GQA"):
        tnpu.npu_fusion_attention(q, k, v, 3, "BNSD")
    q, k, v = qkv(1, 2, 2, 4, 4, 4)
    with pytest.raises(NotImplementedError, match="input_layout"):
        tnpu.npu_fusion_attention(q, k, v, 2, "NSD")
    t = torch.randn(6, 2, 4)
    with pytest.raises(NotImplementedError, match="actual_seq_qlen"):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND")
    with pytest.raises(NotImplementedError, match="cumulative"):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[2, 4], actual_seq_kvlen=[2, 4])
    with pytest.raises(NotImplementedError, match="TND with an explicit atten_mask"):
        tnpu.npu_fusion_attention(t, t, t, 2, "TND", actual_seq_qlen=[6], actual_seq_kvlen=[6],
                                  atten_mask=torch.zeros(6, 6, dtype=torch.bool), sparse_mode=1)
    with pytest.raises(NotImplementedError, match="some of"):
        tnpu.npu_fusion_attention_grad(q, k, v, q, 2, "BNSD", softmax_max=torch.zeros(1, 2, 4, 8))


# ---------------------------------------------------------------------------------------------------------------
def test_rms_norm(tnpu):
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    gamma = torch.randn(8, dtype=torch.float64)
    y, rstd = tnpu.npu_rms_norm(x, gamma, epsilon=1e-5)
    expect = x / torch.sqrt((x * x).sum(-1, keepdim=True) / 8 + 1e-5) * gamma
    torch.testing.assert_close(y, expect)
    assert rstd.shape == (3, 5, 1)
    torch.testing.assert_close(rstd, 1 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5))
    xb = torch.randn(4, 8, dtype=torch.bfloat16)
    yb, rb = tnpu.npu_rms_norm(xb, torch.ones(8, dtype=torch.bfloat16))
    assert yb.dtype == torch.bfloat16 and rb.dtype == torch.float32
    xs, gs = torch.randn(2, 4, dtype=torch.float64, requires_grad=True), torch.randn(4, dtype=torch.float64,
                                                                                    requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: tnpu.npu_rms_norm(a, b)[0], (xs, gs))
    with pytest.raises(NotImplementedError, match="gamma"):
        tnpu.npu_rms_norm(x, torch.ones(7))


def test_swiglu(tnpu):
    x = torch.randn(3, 10, dtype=torch.float64, requires_grad=True)
    a, b = x[:, :5], x[:, 5:]
    torch.testing.assert_close(tnpu.npu_swiglu(x, dim=-1), a * torch.sigmoid(a) * b)
    torch.testing.assert_close(tnpu.npu_swiglu(x.T, dim=0), (a * torch.sigmoid(a) * b).T)
    assert torch.autograd.gradcheck(lambda t: tnpu.npu_swiglu(t), (x,))
    with pytest.raises(NotImplementedError, match="odd"):
        tnpu.npu_swiglu(torch.randn(3, 5))


def _rope_inputs(interleaved):
    g = torch.Generator().manual_seed(2)
    s, d = 5, 8
    x = torch.randn(2, s, 3, d, generator=g, dtype=torch.float64)
    theta = torch.arange(s, dtype=torch.float64)[:, None] / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = theta.repeat_interleave(2, -1) if interleaved else torch.cat([theta, theta], -1)
    return x, theta, freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]


def test_rotary_half_matches_hf_rotate_half(tnpu):
    x, _, cos, sin = _rope_inputs(False)

    def rotate_half(t):  # transformers' apply_rotary_pos_emb helper
        return torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)
    expect = x * cos + rotate_half(x) * sin
    torch.testing.assert_close(tnpu.npu_rotary_mul(x, cos, sin), expect)
    torch.testing.assert_close(tnpu.npu_rotary_mul(x, cos, sin, rotary_mode="half"), expect)
    torch.testing.assert_close(tnpu.npu_rotary_position_embedding(x, cos, sin, mode=0), expect)


def test_rotary_interleaved_matches_complex_rotation(tnpu):
    x, theta, cos, sin = _rope_inputs(True)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    expect = torch.view_as_real(z * torch.polar(torch.ones_like(theta), theta)[None, :, None, :]).flatten(-2)
    torch.testing.assert_close(tnpu.npu_rotary_mul(x, cos, sin, rotary_mode="interleave"), expect)
    torch.testing.assert_close(tnpu.npu_rotary_position_embedding(x, cos, sin, mode=1), expect)
    xs = x[:1, :2, :1].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: tnpu.npu_rotary_position_embedding(t, cos[:, :2], sin[:, :2], 1), (xs,))
    with pytest.raises(NotImplementedError, match="mode=2"):
        tnpu.npu_rotary_position_embedding(x, cos, sin, mode=2)
    with pytest.raises(NotImplementedError, match="rotary_mode"):
        tnpu.npu_rotary_mul(x, cos, sin, rotary_mode="quarter")
    with pytest.raises(NotImplementedError, match="documented layouts"):
        tnpu.npu_rotary_mul(x, cos[:, :, :, :4], sin[:, :, :, :4])


# ---------------------------------------------------------------------------------------------------------------
def test_grouped_matmul_split_m(tnpu):
    g = torch.Generator().manual_seed(4)
    counts = [3, 0, 2, 4]
    x = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    rows, expect = 0, []
    for e, c in enumerate(counts):
        expect.append(x[rows:rows + c] @ w[e])
        rows += c
    expect = torch.cat(expect)
    cum = torch.tensor(counts).cumsum(0)
    out0 = tnpu.npu_grouped_matmul([x], [w], group_list=cum, split_item=3, group_type=0, group_list_type=0)[0]
    out1 = tnpu.npu_grouped_matmul([x], list(w.unbind(0)), group_list=torch.tensor(counts), split_item=2,
                                   group_type=0, group_list_type=1)[0]
    torch.testing.assert_close(out0, expect)
    torch.testing.assert_close(out1, expect)
    per_group = tnpu.npu_grouped_matmul([x], [w], group_list=cum, split_item=1, group_type=0)
    assert [t.shape[0] for t in per_group] == counts
    assert torch.autograd.gradcheck(
        lambda a, b: tnpu.npu_grouped_matmul([a], [b], group_list=cum, split_item=3, group_type=0)[0], (x, w))


def test_grouped_matmul_split_k_is_weight_grad(tnpu):
    g = torch.Generator().manual_seed(6)
    counts = [2, 3, 1]
    x = torch.randn(6, 4, generator=g)
    grad = torch.randn(6, 5, generator=g)
    dw = tnpu.npu_grouped_matmul([x.t()], [grad], group_list=torch.tensor(counts), split_item=3, group_type=2,
                                 group_list_type=1)[0]
    assert dw.shape == (3, 4, 5)
    rows = 0
    for e, c in enumerate(counts):
        torch.testing.assert_close(dw[e], x[rows:rows + c].t() @ grad[rows:rows + c])
        rows += c


def test_grouped_matmul_refuses(tnpu):
    x, w = torch.randn(5, 3), torch.randn(2, 3, 4)
    with pytest.raises(NotImplementedError, match="cover exactly"):
        tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 4]), split_item=3, group_type=0)
    with pytest.raises(NotImplementedError, match="scale"):
        tnpu.npu_grouped_matmul([x], [w], scale=[torch.ones(1)], group_list=torch.tensor([2, 5]), group_type=0)
    with pytest.raises(NotImplementedError, match="group_list_type"):
        tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]), group_type=0, group_list_type=2)
    with pytest.raises(NotImplementedError, match="group_type=1"):
        tnpu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 5]), group_type=1)


def test_moe_permute_unpermute(tnpu):
    g = torch.Generator().manual_seed(8)
    tokens = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([[2, 0], [1, 2], [0, 1], [2, 1], [0, 2]])
    permuted, sorted_idx = tnpu.npu_moe_token_permute(tokens, indices)
    # independent: group by expert, tokens in order inside each expert
    order = [t for e in range(3) for t in range(5) if e in indices[t].tolist()]
    torch.testing.assert_close(permuted, tokens[order])
    probs = torch.rand(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    restored = tnpu.npu_moe_token_unpermute(permuted, sorted_idx, probs)
    torch.testing.assert_close(restored, tokens * probs.sum(1, keepdim=True))
    torch.testing.assert_close(tnpu.npu_moe_token_unpermute(*tnpu.npu_moe_token_permute(tokens, indices[:, 0])),
                               tokens)
    assert torch.autograd.gradcheck(
        lambda t, p: tnpu.npu_moe_token_unpermute(tnpu.npu_moe_token_permute(t, indices)[0], sorted_idx, p),
        (tokens, probs))
    with pytest.raises(NotImplementedError, match="padded_mode"):
        tnpu.npu_moe_token_permute(tokens, indices, padded_mode=True)
    with pytest.raises(NotImplementedError, match="num_out_tokens"):
        tnpu.npu_moe_token_permute(tokens, indices, num_out_tokens=7)


def test_format_and_dtype_ops(tnpu):
    x = torch.randn(2, 3)
    assert tnpu.npu_format_cast(x, 2) is x and tnpu.get_npu_format(x) == 2
    assert tnpu.npu_dtype_cast(x, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(NotImplementedError, match="acl_format=29"):
        tnpu.npu_format_cast(x, 29)


def test_emulation_not_importable_without_site():
    """site/ is no package, pytest ignores it, and nothing installed provides torch_npu in a normal run."""
    assert not os.path.exists(os.path.join(SITE, "__init__.py"))
    with open(os.path.join(os.path.dirname(SITE), "conftest.py")) as handle:
        conftest = handle.read()
    assert 'collect_ignore = ["site"]' in conftest
    outside = [p for p in sys.path if os.path.abspath(p or ".") != SITE]
    assert importlib.machinery.PathFinder.find_spec("torch_npu", outside) is None


def test_npu_is_a_device_type_that_lands_on_the_cpu(tnpu):
    """'npu' is registered as torch_npu registers it (torch FSDP builds torch.device('npu', current_device())),
    with an accelerator that is not available; every npu device lands on the CPU."""
    assert torch.get_device_module("npu") is tnpu.npu
    assert torch._C._get_accelerator().type == "cpu" and torch.accelerator.is_available() is False
    for device in ("npu", "npu:0", torch.device("npu", 0), 0):
        assert torch.empty(2, device=device).device.type == "cpu", device
        assert torch.ones(2).to(device).device.type == "cpu", device


def test_fsdp_device_of_an_npu_mesh_is_the_cpu(tnpu):
    from torch.distributed.fsdp._fully_shard import _fully_shard

    class Mesh:
        device_type = "npu"

    assert _fully_shard._get_device_from_mesh(Mesh()) == torch.device("cpu")


def test_index_copy_takes_int32_indices_as_the_npu_kernel_does(tnpu):
    source = torch.arange(6.0).reshape(3, 2)
    index = torch.tensor([2, 0, 1], dtype=torch.int32)
    want = torch.zeros(3, 2).index_copy_(0, index.long(), source)
    assert torch.equal(torch.zeros(3, 2).index_copy_(0, index, source), want)


def test_backward_maps_npu_devices_as_the_forward_does(tnpu):
    """A custom Function's backward that allocates on the current accelerator index (MindSpeed FSDP's expert
    all-to-all, mindspeed/fsdp/distributed/dist_ops.py) lands on the CPU through every autograd entry point,
    although the mode's handler runs `backward` itself with the mode popped."""

    class OnCurrentIndex(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.new_empty(x.shape, device=torch.accelerator.current_device_index()).copy_(x) * 2

        @staticmethod
        def backward(ctx, grad):
            return grad.new_empty(grad.shape, device=torch.accelerator.current_device_index()).copy_(grad) * 3

    x = torch.ones(3, requires_grad=True)
    OnCurrentIndex.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))
    (grad,) = torch.autograd.grad(OnCurrentIndex.apply(x).sum(), x)
    assert torch.equal(grad, torch.full((3,), 3.0))
    x.grad = None
    torch.autograd.backward([OnCurrentIndex.apply(x).sum()])
    assert torch.equal(x.grad, torch.full((3,), 3.0))
