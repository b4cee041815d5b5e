"""Reference (plain torch, fp32 math) `npu_fusion_attention` / `npu_fusion_attention_grad`.

Contract followed (CANN torch_npu API reference for npu_fusion_attention; MindSpeed docs/zh/ops/fusion_attention.md):
- layouts BNSD, BSND, BSH, SBH, TND; TND takes `actual_seq_qlen` / `actual_seq_kvlen` as CUMULATIVE ends.
- `atten_mask` True/1 = masked (not computed).
- sparse_mode 0: the given mask AND the pre/next band (top-left aligned); with no mask, nothing is masked and
  pre/next are ignored. 1: the given full mask, pre/next ignored (no mask = full attention).
  2: causal top-left, 3: causal bottom-right, 4: band bottom-right. 2/3/4 REQUIRE the compressed 2048x2048
  upper-triangular mask (`torch.triu(ones(2048, 2048), 1)`); anything else (None, a [b,1,s,s] padding mask)
  is refused. Modes 5-8 (prefix / varlen-compressed) are refused.
- keep_prob must be 1.0, pse / padding_mask / prefix must be None (refused otherwise).
- Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels). softmax_max/sum are fp32,
  [B, N, Sq, 8] (TND: [T, N, 8]) with the value replicated over the last dim: this is what MindSpeed's ring
  attention consumes (mindspeed/core/context_parallel/utils.py forward_update_without_fused takes `[..., 0]`;
  ring_context_parallel.py causal_backward_fetch views them as [b, n, 2, s, 8]; tnd_out_update views (-1, n, 8)).
  TND statistics are shaped [T, N, 8] but laid out per query sequence, head-major inside it (sequence k's N x S_k
  block, then the next): MindSpeed's TND ring merge reads them so (context_parallel/utils.py `flatten_softmax`:
  each sequence's `s * N` rows viewed [N, s, 8] and transposed to token order; `unflatten_softmax` writes them back;
  `get_selection_indices_for_tnd_softmax_update` picks a sequence's second half in each head's rows). The grad op
  takes them in the same layout.
- A fully masked row (every key masked for a query) is legal input whose OUTPUT the reference leaves undefined: it
  says only that inner_precise 2 "enables invalid-row computation, which avoids the precision loss a whole-row mask
  causes" and that the kernel enables it by itself where it can tell (sparse_mode 3 with Sq > Skv). The emulation
  returns POISON for such a row's attention_out (`_poison`: large finite random values, seeded per call) and, for
  its softmax_max / softmax_sum, what their definitions give a row no key takes part in (the reference: the Max /
  Sum intermediates of the Softmax, atten_mask 1 = "does not take part in the computation"): the empty sum, 0, and
  the empty max as the lowest finite fp32 (finite, so that an exp(prev_max - max) merge stays free of inf - inf).
  A caller that weights blocks by their statistics, as MindSpeed's online-softmax merge does (context_parallel/
  utils.py forward_update_without_fused: a block's weight is softmax_sum * exp(softmax_max - max)), gives the row
  weight 0 and never sees the poison; one that reads attention_out directly gets poison and fails. MindSpeed's
  general ring strategy passes such rows (AttentionWithCp.compute_mask: kv_block_id > q_block_id -> all masked,
  mindspeed/core/context_parallel/ring_context_parallel/ring_context_parallel.py) with inner_precise 0.
  REFUSED instead where the references forbid the input: in TND (varlen) a query sequence with no kv (Sq > 0,
  Skv = 0: MindSpeed docs/zh/ops/fusion_attention.md, input limits, "不支持某个batch中Sq不为0，但是Skv为0的场景").
- The grad op for such a row: P = exp(S - softmax_max) / softmax_sum is 0 on every masked key when the GIVEN
  statistics are a row's real ones (softmax_sum > 0: ring attention passes the statistics merged over all blocks),
  so the row adds nothing to dq / dk / dv, exactly. Given the empty row's own statistics (softmax_sum 0, as the
  forward returned them), P is 0 / 0, undefined: the emulation poisons that row's P. The gradient formula then
  carries the poison only as far as the caller's dy reaches: with dy 0 on the row (a caller that discarded the
  output) dS = P * (dP - delta) is 0 and every grad is exact; with dy non-zero the grads are poisoned.
- `actual_seq_qlen` / `actual_seq_kvlen` / `prefix` are `int[]` (host lists): a Tensor is refused (it is what the
  separate npu_fusion_attention_v3 takes). Trailing zeros after the last end are legal padding of the list.
- `softmax_layout` (op-plugin's signature, "" by default) is accepted as "" only: another layout of the softmax
  statistics is not emulated.
- The grad op uses the softmax_max / softmax_sum / attention_in it is GIVEN (ring attention passes the statistics
  merged over all KV blocks, so per-block grads add up to the full grads).
"""
import itertools

import torch

from .emulation import note, refuse

LAYOUTS = ("BNSD", "BSND", "BSH", "SBH", "TND")
_BIG = 2147483647
_COMPRESSED = 2048

#: |poison| lies in [POISON_MIN, 2 * POISON_MIN): far outside any attention output (a convex combination of value
#: rows, so never beyond max |v|), finite in every dtype the op takes (fp16's largest is 65504)
POISON_MIN = 1e4
_POISON_SEED = 0x5EED
_POISON_CALLS = itertools.count()


def _poison(shape, dtype, device):
    """Large finite random values, random signs, for what the reference leaves undefined. A fresh draw per call,
    seeded by a per-process call counter (a run is reproducible, two calls never agree) from a private generator:
    the global RNG, which the harness's runs consume, is untouched. Finite, so a caller that weights the values by
    0 gets exactly 0 (NaN * 0 would be NaN)."""
    gen = torch.Generator().manual_seed(_POISON_SEED + next(_POISON_CALLS))
    magnitude = POISON_MIN * (1 + torch.rand(shape, generator=gen, dtype=torch.float64))
    sign = torch.randint(0, 2, shape, generator=gen).to(torch.float64) * 2 - 1
    return (magnitude * sign).to(dtype=dtype, device=device)


def _is_compressed_causal(mask):
    if mask is None or tuple(mask.shape) != (_COMPRESSED, _COMPRESSED):
        return False
    want = torch.triu(torch.ones(_COMPRESSED, _COMPRESSED, dtype=torch.bool, device=mask.device), 1)
    return bool(torch.equal(mask.to(torch.bool), want))


def _check_mask_dtype(op, mask):
    if mask is not None and mask.dtype not in (torch.bool, torch.uint8):
        refuse(op, f"atten_mask of dtype {mask.dtype} (bool or uint8 only)")


def _host_ints(op, name, value):
    """An `int[]` argument: a host list / tuple of ints, never a Tensor."""
    if isinstance(value, torch.Tensor):
        refuse(op, f"{name} as a Tensor (the op takes int[]: pass a list, e.g. cu_seqlens.tolist())")
    return [int(v) for v in value]


def _cum_list(op, name, value, total):
    if value is None:
        refuse(op, f"layout TND without {name}")
    ends = _host_ints(op, name, value)
    while len(ends) > 1 and ends[-1] == 0:  # trailing zeros pad the list: legal, they end nothing
        ends.pop()
    if not ends or any(b < a for a, b in zip([0, *ends], ends)) or ends[-1] != total:
        refuse(op, f"{name}={ends} (must be non-decreasing cumulative ends finishing at T={total})")
    return ends


def _to_bnsd(x, layout, n):
    """layout tensor -> [B, N, S, D] (view/permute, differentiable). TND -> [1, N, T, D]."""
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, n, h // n).transpose(1, 2)
    if layout == "SBH":
        s, b, h = x.shape
        return x.reshape(s, b, n, h // n).permute(1, 2, 0, 3)
    # TND
    return x.permute(1, 0, 2).unsqueeze(0)


def _from_bnsd(x, layout):
    if layout == "BNSD":
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        b, n, s, d = x.shape
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        b, n, s, d = x.shape
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    return x.squeeze(0).permute(1, 0, 2).contiguous()


def _heads(op, layout, query, key, value, head_num):
    """(n_q, n_kv) from the layout's shapes; refuses shapes that do not fit it."""
    if layout not in LAYOUTS:
        refuse(op, f"input_layout={layout!r} (supported: {', '.join(LAYOUTS)})")
    want_dim = 4 if layout in ("BNSD", "BSND") else 3
    for t in (query, key, value):
        if t.dim() != want_dim:
            refuse(op, f"a {t.dim()}-d tensor with layout {layout}")
    if layout in ("BSH", "SBH"):
        if query.shape[-1] % head_num:
            refuse(op, f"H={query.shape[-1]} not divisible by head_num={head_num}")
        d = query.shape[-1] // head_num
        if key.shape[-1] % d:
            refuse(op, f"key hidden {key.shape[-1]} not a multiple of head_dim {d}")
        n_kv = key.shape[-1] // d
        if value.shape[-1] % n_kv:
            refuse(op, f"value hidden {value.shape[-1]} not a multiple of n_kv={n_kv}")
        n_q = head_num
    else:
        head_axis = 1 if layout in ("BNSD", "TND") else 2
        n_q, n_kv = query.shape[head_axis], key.shape[head_axis]
        if n_q != head_num:
            refuse(op, f"head_num={head_num} but query has {n_q} heads")
        if value.shape[head_axis] != n_kv:
            refuse(op, "key and value with different head counts")
    if n_kv == 0 or n_q % n_kv:
        refuse(op, f"GQA with {n_q} query heads and {n_kv} kv heads (must divide)")
    return n_q, n_kv


def _build_mask(op, *, sq, sk, batch, atten_mask, sparse_mode, pre, nxt, q_ends=None, kv_ends=None, device):
    """bool mask, True = masked, broadcastable to [B, N, Sq, Sk]; None = nothing masked."""
    _check_mask_dtype(op, atten_mask)
    tnd = q_ends is not None
    if sparse_mode not in (0, 1, 2, 3, 4):
        refuse(op, f"sparse_mode={sparse_mode} (0-4 only; 5-8 prefix/varlen compressed modes are not emulated)")
    if sparse_mode in (2, 3, 4) and not _is_compressed_causal(atten_mask):
        shape = None if atten_mask is None else tuple(atten_mask.shape)
        raise AssertionError(
            f"emulated torch_npu.{op}: sparse_mode={sparse_mode} requires atten_mask = the compressed "
            f"torch.triu(ones(2048, 2048), 1) bool mask (the kernel builds the real mask); got "
            f"{'no mask' if shape is None else f'a mask of shape {shape}'}. Passing a padding/full mask with "
            f"sparse_mode 2/3/4 is a contract violation (wrong results or a kernel error on device).")
    if tnd and sparse_mode in (0, 1) and atten_mask is not None:
        refuse(op, f"layout TND with an explicit atten_mask and sparse_mode={sparse_mode}")
    # positions: local index inside its sequence, the sequence's length, the sequence id
    if tnd:
        def positions(ends):
            starts = [0, *ends[:-1]]
            idx, lens, sid = [], [], []
            for k, (a, b) in enumerate(zip(starts, ends)):
                idx.append(torch.arange(b - a, device=device))
                lens.append(torch.full((b - a,), b - a, device=device))
                sid.append(torch.full((b - a,), k, device=device))
            return torch.cat(idx), torch.cat(lens), torch.cat(sid)
        if len(q_ends) != len(kv_ends):
            refuse(op, f"{len(q_ends)} query sequences but {len(kv_ends)} kv sequences")
        qi, qlen, qsid = positions(q_ends)
        kj, klen, ksid = positions(kv_ends)
        i, j = qi[:, None], kj[None, :]
        offset = klen[None, :] - qlen[:, None]
        masked = qsid[:, None] != ksid[None, :]
    else:
        i = torch.arange(sq, device=device)[:, None]
        j = torch.arange(sk, device=device)[None, :]
        offset = sk - sq
        masked = None

    def orr(a, b):
        return b if a is None else (a | b)

    if sparse_mode == 0:
        if atten_mask is not None:
            masked = orr(masked, _expand_given(op, atten_mask, batch, sq, sk))
            # the band [-pre, +next] around the top-left diagonal (pre/next only count with a mask)
            masked = masked | (i - j > pre) | (j - i > nxt)
    elif sparse_mode == 1:
        if atten_mask is not None:
            masked = orr(masked, _expand_given(op, atten_mask, batch, sq, sk))
    elif sparse_mode == 2:
        masked = orr(masked, j > i)
    elif sparse_mode == 3:
        masked = orr(masked, j > i + offset)
    else:  # 4: band aligned bottom-right
        rel = j - i - offset
        masked = orr(masked, (rel > nxt) | (-rel > pre))
    if masked is not None and masked.dim() == 2:
        masked = masked[None, None]
    return masked


def _expand_given(op, mask, batch, sq, sk):
    m = mask.to(torch.bool)
    if m.dim() == 2:
        m = m[None, None]
    if m.dim() != 4 or tuple(m.shape[-2:]) != (sq, sk) or m.shape[0] not in (1, batch):
        refuse(op, f"atten_mask of shape {tuple(mask.shape)} for Sq={sq}, Skv={sk}, B={batch} "
                   f"(accepted: [Sq,Skv], [B|1, N|1, Sq, Skv])")
    return m


def _prepare(op, query, key, value, head_num, input_layout, *, pse, padding_mask, atten_mask, keep_prob, pre, nxt,
             inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, softmax_layout=""):
    if pse is not None:
        refuse(op, "pse (positional bias)")
    if padding_mask is not None:
        refuse(op, "padding_mask (reserved by CANN)")
    if prefix is not None:
        _host_ints(op, "prefix", prefix)
        refuse(op, "prefix")
    if softmax_layout != "":
        refuse(op, f"softmax_layout={softmax_layout!r} (only the default '' is emulated)")
    if float(keep_prob) != 1.0:
        refuse(op, f"keep_prob={keep_prob} (dropout)")
    if inner_precise not in (0, 1):
        refuse(op, f"inner_precise={inner_precise}")
    layout = input_layout
    n_q, n_kv = _heads(op, layout, query, key, value, head_num)
    if layout != "TND" and (actual_seq_qlen is not None or actual_seq_kvlen is not None):
        refuse(op, f"actual_seq_qlen/kvlen with layout {layout} (TND only)")
    q = _to_bnsd(query, layout, n_q)
    k = _to_bnsd(key, layout, n_kv)
    v = _to_bnsd(value, layout, n_kv)
    if k.shape[-1] != q.shape[-1]:
        refuse(op, f"query head_dim {q.shape[-1]} != key head_dim {k.shape[-1]}")
    if q.shape[0] != k.shape[0] or k.shape[2] != v.shape[2]:
        refuse(op, "batch / kv sequence sizes that do not match")
    q_ends = kv_ends = None
    if layout == "TND":
        q_ends = _cum_list(op, "actual_seq_qlen", actual_seq_qlen, query.shape[0])
        kv_ends = _cum_list(op, "actual_seq_kvlen", actual_seq_kvlen, key.shape[0])
    mask = _build_mask(op, sq=q.shape[2], sk=k.shape[2], batch=q.shape[0], atten_mask=atten_mask,
                       sparse_mode=int(sparse_mode), pre=int(pre), nxt=int(nxt), q_ends=q_ends, kv_ends=kv_ends,
                       device=query.device)
    if layout == "TND":
        for (qa, qb), (ka, kb) in zip(_sequences(q_ends), _sequences(kv_ends)):
            if qb > qa and kb == ka:  # MindSpeed docs/zh/ops/fusion_attention.md, input limits
                refuse(op, f"a query sequence of {qb - qa} tokens with no kv token (the reference does not support "
                           "Sq > 0 with Skv = 0 in a varlen batch)")
    # any other fully masked row is legal input whose output is undefined: _forward_core poisons it
    return q, k, v, mask, q_ends


def _math_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _expand_kv(x, n_q):
    g = n_q // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def _scores(q, k, mask, scale):
    dt = _math_dtype(q)
    s = torch.matmul(q.to(dt), _expand_kv(k, q.shape[1]).to(dt).transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    return s


def _forward_core(q, k, v, mask, scale, op):
    """-> out [B,N,Sq,Dv] (q dtype), row max [B,N,Sq], row sum [B,N,Sq] (math dtype). A fully masked row (no key
    takes part): max the lowest finite fp32, sum 0, out poison (the module docstring says why)."""
    s = _scores(q, k, mask, scale)
    row_max = s.amax(dim=-1)
    row_max = torch.where(torch.isneginf(row_max), torch.full_like(row_max, torch.finfo(torch.float32).min), row_max)
    p = torch.exp(s - row_max[..., None])
    row_sum = p.sum(dim=-1)  # >= 1 where a key takes part (its max contributes exp(0)), else 0
    vv = _expand_kv(v, q.shape[1]).to(s.dtype)
    out = torch.matmul(p, vv) / torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))[..., None]
    empty = row_sum == 0
    if bool(empty.any()):
        note(f"{op}: fully masked rows poisoned")
        out = torch.where(empty[..., None], _poison(out.shape, out.dtype, out.device), out)
    return out.to(q.dtype), row_max, row_sum


def _grad_core(q, k, v, dy, out, row_max, row_sum, mask, scale, op):
    s = _scores(q, k, mask, scale)
    dt = s.dtype
    safe_sum = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum)).to(dt)
    p = torch.exp(s - row_max.to(dt)[..., None]) / safe_sum[..., None]
    undefined = row_sum <= 0  # statistics of a row no key took part in: P = 0 / 0 (the module docstring)
    if bool(undefined.any()):
        note(f"{op}: rows with softmax_sum 0 poisoned")
        p = torch.where(undefined[..., None], _poison(p.shape, dt, p.device), p)
    n_q, n_kv = q.shape[1], k.shape[1]
    vv = _expand_kv(v, n_q).to(dt)
    kk = _expand_kv(k, n_q).to(dt)
    dyf = dy.to(dt)
    dv = torch.matmul(p.transpose(-1, -2), dyf)
    dp = torch.matmul(dyf, vv.transpose(-1, -2))
    delta = (dyf * out.to(dt)).sum(dim=-1, keepdim=True)
    ds = p * (dp - delta)
    dq = torch.matmul(ds, kk) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.to(dt)) * scale
    if n_q != n_kv:  # GQA: sum the group's grads onto its kv head
        g = n_q // n_kv
        dk = dk.reshape(dk.shape[0], n_kv, g, *dk.shape[2:]).sum(2)
        dv = dv.reshape(dv.shape[0], n_kv, g, *dv.shape[2:]).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _sequences(q_ends):
    return list(zip([0, *q_ends[:-1]], q_ends))


def _stats_to_layout(stat, layout, q_ends=None):
    """[B,N,S] -> fp32 [B,N,S,8]; TND [1,N,T] -> [T,N,8] in CANN's order: per query sequence, head-major."""
    st = stat.to(torch.float32)
    if layout == "TND":
        heads = st.shape[1]
        st = torch.cat([st[0, :, a:b].reshape(-1) for a, b in _sequences(q_ends)]).reshape(-1, heads)
    return st[..., None].expand(*st.shape, 8).contiguous()


def _stats_from_layout(op, stat, layout, b, n, s, q_ends=None):
    if layout == "TND":
        if tuple(stat.shape) != (s, n, 8):
            refuse(op, f"TND softmax statistics of shape {tuple(stat.shape)} (want [T, N, 8] = {[s, n, 8]})")
        flat = stat[..., 0].reshape(-1)
        stat = torch.cat([flat[a * n:b * n].view(n, b - a) for a, b in _sequences(q_ends)], dim=1).unsqueeze(0)
    else:
        if stat.dim() != 4:
            refuse(op, f"softmax statistics of shape {tuple(stat.shape)} (want [B, N, S, 8])")
        stat = stat[..., 0]
    if tuple(stat.shape) != (b, n, s):
        refuse(op, f"softmax statistics that do not match the query (got {tuple(stat.shape)}, want {(b, n, s)})")
    return stat


class _FusionAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale, layout):
        out, row_max, row_sum = _forward_core(q, k, v, mask, scale, "npu_fusion_attention")
        ctx.save_for_backward(q, k, v, out, row_max, row_sum)
        ctx.mask, ctx.scale = mask, scale
        ctx.mark_non_differentiable(row_max, row_sum)
        return out, row_max, row_sum

    @staticmethod
    def backward(ctx, dout, _dmax, _dsum):
        q, k, v, out, row_max, row_sum = ctx.saved_tensors
        dq, dk, dv = _grad_core(q, k, v, dout, out, row_max, row_sum, ctx.mask, ctx.scale, "npu_fusion_attention")
        return dq, dk, dv, None, None, None


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=_BIG, next_tockens=_BIG, inner_precise=0,
                         prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                         gen_mask_parallel=True, sync=False, softmax_layout=""):
    op = "npu_fusion_attention"
    note(f"{op}[{input_layout}, sparse_mode={int(sparse_mode)}]")
    q, k, v, mask, q_ends = _prepare(op, query, key, value, head_num, input_layout, pse=pse,
                                     padding_mask=padding_mask, atten_mask=atten_mask, keep_prob=keep_prob,
                                     pre=pre_tockens, nxt=next_tockens, inner_precise=inner_precise, prefix=prefix,
                                     actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                                     sparse_mode=sparse_mode, softmax_layout=softmax_layout)
    out, row_max, row_sum = _FusionAttention.apply(q, k, v, mask, float(scale), input_layout)
    attention_out = _from_bnsd(out, input_layout)
    softmax_max = _stats_to_layout(row_max.detach(), input_layout, q_ends)
    softmax_sum = _stats_to_layout(row_sum.detach(), input_layout, q_ends)
    softmax_out = torch.empty(0, dtype=query.dtype, device=query.device)
    return attention_out, softmax_max, softmax_sum, softmax_out, 0, 0, 0


def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                              atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                              attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=_BIG,
                              next_tockens=_BIG, inner_precise=0, seed=0, offset=0, numels=0, prefix=None,
                              actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                              sync=False, softmax_layout=""):
    """-> (dq, dk, dv, dpse) in the input layout; uses the given softmax_max/softmax_sum/attention_in."""
    op = "npu_fusion_attention_grad"
    note(f"{op}[{input_layout}, sparse_mode={int(sparse_mode)}]")
    given = [t is not None for t in (softmax_max, softmax_sum, attention_in)]
    if any(given) and not all(given):
        refuse(op, "only some of softmax_max / softmax_sum / attention_in (give all three or none)")
    q, k, v, mask, q_ends = _prepare(op, query, key, value, head_num, input_layout, pse=pse,
                                     padding_mask=padding_mask, atten_mask=atten_mask, keep_prob=keep_prob,
                                     pre=pre_tockens, nxt=next_tockens, inner_precise=inner_precise, prefix=prefix,
                                     actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                                     sparse_mode=sparse_mode, softmax_layout=softmax_layout)
    scale = float(scale_value)
    with torch.no_grad():
        if all(given):
            b, n, s = q.shape[0], q.shape[1], q.shape[2]
            row_max = _stats_from_layout(op, softmax_max, input_layout, b, n, s, q_ends)
            row_sum = _stats_from_layout(op, softmax_sum, input_layout, b, n, s, q_ends)
            out = _to_bnsd(attention_in, input_layout, n)
        else:
            out, row_max, row_sum = _forward_core(q, k, v, mask, scale, op)
        dyb = _to_bnsd(dy, input_layout, q.shape[1])
        if tuple(dyb.shape) != tuple(out.shape):
            refuse(op, f"dy of shape {tuple(dy.shape)} that does not match the attention output")
        dq, dk, dv = _grad_core(q, k, v, dyb, out, row_max, row_sum, mask, scale, op)
    dpse = torch.empty(0, dtype=query.dtype, device=query.device)
    return _from_bnsd(dq, input_layout), _from_bnsd(dk, input_layout), _from_bnsd(dv, input_layout), dpse
