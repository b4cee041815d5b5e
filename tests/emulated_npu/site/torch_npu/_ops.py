"""Reference (plain torch) implementations of the fused ops MindSpeed calls besides attention.

All are written with differentiable torch ops, so autograd flows through them the way it does through the real
ops' registered backward. Math runs in fp32 (fp64 stays fp64) and the result is cast back to the input dtype.
"""
import torch

from .emulation import refuse


def _math(t):
    return t.to(torch.float64 if t.dtype == torch.float64 else torch.float32)


# --- norms / activations -----------------------------------------------------------------------------------
def npu_rms_norm(x, gamma, epsilon=1e-6):
    """-> (y, rstd): y = x * rstd * gamma over gamma's trailing dims; rstd fp32 with those dims kept as 1.

    MindSpeed: mindspeed/core/fusions/fused_rms_norm.py, mindspeed/core/fusions/rms_norm.py,
    mindspeed/te/pytorch/module/layernorm_column_parallel_linear.py (all take [0]; the last one notes the op is
    gamma*x_norm only, no (1+gamma)).
    """
    op = "npu_rms_norm"
    g = gamma.dim()
    if g == 0 or tuple(x.shape[-g:]) != tuple(gamma.shape):
        refuse(op, f"gamma of shape {tuple(gamma.shape)} for x of shape {tuple(x.shape)}")
    if not 1 <= x.dim() <= 8:
        refuse(op, f"a {x.dim()}-d input (the reference: 1 to 8 dims)")
    # the reference: "gamma: its dtype must be the same as self's" (torch_npu API reference, npu_rms_norm);
    # upcasting a bf16 input to an fp32 gamma's dtype here would hide a call the device may compute otherwise
    if gamma.dtype != x.dtype:
        refuse(op, f"gamma of dtype {gamma.dtype} for an input of dtype {x.dtype} (the reference requires equal "
                   "dtypes)")
    dims = tuple(range(-g, 0))
    xf = _math(x)
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + float(epsilon))
    y = (xf * rstd * _math(gamma)).to(x.dtype)
    return y, rstd.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def npu_swiglu(x, dim=-1):
    """silu(first half) * second half along `dim` (mindspeed/core/fusions/fused_bias_swiglu.py)."""
    if x.shape[dim] % 2:
        refuse("npu_swiglu", f"an odd size {x.shape[dim]} along dim {dim}")
    a, b = _math(x).chunk(2, dim=dim)
    return (torch.nn.functional.silu(a) * b).to(x.dtype)


# --- rotary ---------------------------------------------------------------------------------------------------
def _rotate(x, interleaved):
    if x.shape[-1] % 2:
        refuse("rotary", f"an odd head_dim {x.shape[-1]}")
    if interleaved:  # pairs (x0, x1) -> (-x1, x0)
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x, c, s, interleaved):
    try:
        out = _math(x) * _math(c) + _rotate(_math(x), interleaved) * _math(s)
    except RuntimeError as exc:
        refuse("rotary", f"cos/sin of shape {tuple(c.shape)} that do not broadcast to x {tuple(x.shape)} ({exc})")
    if tuple(out.shape) != tuple(x.shape):
        refuse("rotary", f"cos/sin of shape {tuple(c.shape)} that broadcast x {tuple(x.shape)} to {tuple(out.shape)}")
    return out.to(x.dtype)


#: x's layouts and, for each, the r1 / r2 shapes the reference lists (torch_npu API reference, npu_rotary_mul,
#: constraints for Atlas A2 / A3: "x BNSD: 11SD, B1SD, BNSD; x BSND: 1S1D, BS1D, BSND; x SBND: S11D, SB1D, SBND")
ROTARY_R_SHAPES = {"BNSD": ("11SD", "B1SD", "BNSD"), "BSND": ("1S1D", "BS1D", "BSND"), "SBND": ("S11D", "SB1D", "SBND")}
ROTARY_MAX_D = 896  # D < 896 and even
ROTARY_MAX_BN = 1000  # half: B < 1000 and N < 1000; interleave: B * N < 1000


def _rotary_layouts(x, r):
    """The documented layouts of x under which r's shape is one of the listed ones."""
    found = []
    for layout, r_forms in ROTARY_R_SHAPES.items():
        dims = dict(zip(layout, x.shape))
        for form in r_forms:
            want = tuple(1 if c == "1" else dims[c] for c in form)
            if tuple(r.shape) == want:
                found.append((layout, dims))
                break
    return found


def npu_rotary_mul(x, r1, r2, rotary_mode="half"):
    """x * r1 + rotate(x) * r2; rotary_mode 'half' = rotate_half, 'interleave' = pairwise. Only the reference's
    4-D layouts and sizes (ROTARY_R_SHAPES, ROTARY_MAX_*): a 3-D or other broadcastable call may fail or differ on
    the device, so it is refused."""
    op = "npu_rotary_mul"
    if rotary_mode not in ("half", "interleave"):
        refuse(op, f"rotary_mode={rotary_mode!r}")
    if x.dim() != 4 or r1.dim() != 4 or r2.dim() != 4:
        refuse(op, f"input / r1 / r2 of {x.dim()} / {r1.dim()} / {r2.dim()} dims (the reference: 4-D each)")
    d = x.shape[-1]
    if d % 2 or d >= ROTARY_MAX_D:
        refuse(op, f"D={d} (the reference: even and below {ROTARY_MAX_D})")
    if tuple(r1.shape) != tuple(r2.shape):
        refuse(op, f"r1 of shape {tuple(r1.shape)} and r2 of shape {tuple(r2.shape)}")
    layouts = _rotary_layouts(x, r1)
    if not layouts:
        documented = "; ".join(f"x {k}: {'/'.join(v)}" for k, v in ROTARY_R_SHAPES.items())
        refuse(op, f"r1/r2 of shape {tuple(r1.shape)} for input {tuple(x.shape)}: not one of the documented "
                   f"layouts ({documented})")

    def bounded(dims):
        if rotary_mode == "half":
            return dims["B"] < ROTARY_MAX_BN and dims["N"] < ROTARY_MAX_BN
        return dims["B"] * dims["N"] < ROTARY_MAX_BN
    if not any(bounded(dims) for _, dims in layouts):
        refuse(op, f"input {tuple(x.shape)} with B / N beyond the reference's bounds for rotary_mode "
                   f"{rotary_mode!r} (half: B, N < {ROTARY_MAX_BN}; interleave: B*N < {ROTARY_MAX_BN})")
    return _rope(x, r1, r2, rotary_mode == "interleave")


def npu_rotary_position_embedding(x, cos, sin, mode=0):
    """x * cos + rotate(x) * sin; mode 0 = rotate-half, 1 = interleaved (mindspeed/ops/npu_rotary_position_embedding.py
    documents the same signature for its own op)."""
    if mode not in (0, 1):
        refuse("npu_rotary_position_embedding", f"mode={mode}")
    return _rope(x, cos, sin, mode == 1)


# --- grouped matmul ---------------------------------------------------------------------------------------------
def _group_sizes(group_list, group_list_type, total):
    op = "npu_grouped_matmul"
    if group_list is None:
        refuse(op, "group_type 0/2 without group_list")
    values = group_list.tolist() if isinstance(group_list, torch.Tensor) else list(group_list)
    values = [int(v) for v in values]
    if group_list_type == 0:  # cumulative ends
        sizes = [b - a for a, b in zip([0, *values[:-1]], values)]
    elif group_list_type == 1:  # counts
        sizes = values
    else:
        refuse(op, f"group_list_type={group_list_type} (0 = cumulative ends, 1 = counts)")
    if any(s < 0 for s in sizes) or sum(sizes) != total:
        refuse(op, f"group_list={values} (type {group_list_type}) that does not cover exactly the {total} rows "
                   f"(rows outside the groups are undefined on device)")
    return sizes


def _weights(weight, n_groups):
    if len(weight) == 1 and weight[0].dim() == 3:
        w = weight[0]
        if w.shape[0] != n_groups:
            refuse("npu_grouped_matmul", f"a stacked weight of {w.shape[0]} experts for {n_groups} groups")
        return [w[e] for e in range(n_groups)]
    if len(weight) != n_groups or any(w.dim() != 2 for w in weight):
        refuse("npu_grouped_matmul", f"{len(weight)} weights for {n_groups} groups (one 3-d [E,K,N] or E 2-d)")
    return list(weight)


def npu_grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None, antiquant_offset=None,
                       per_token_scale=None, group_list=None, activation_input=None, activation_quant_scale=None,
                       activation_quant_offset=None, split_item=0, group_type=None, group_list_type=0, act_type=0,
                       output_dtype=None, tuning_config=None):
    """Grouped matmul as MindSpeed calls it (mindspeed/core/transformer/moe/grouped_matmul_util.py BF16GMMFunction,
    mindspeed/te/pytorch/module/grouped_linear.py):

    - group_type 0 (split M): x [M, K] (one tensor), weight one [E, K, N] or E x [K, N]; rows of x split by
      group_list; out rows = x_e @ w_e.
    - group_type 2 (split K): x [K, M] (one tensor, e.g. inp.T), weight one [M, N] (e.g. grad); the M axis split by
      group_list; out[e] = x[:, M_e] @ w[M_e, :] -> [E, K, N]  (the weight-gradient GEMM).
    - group_type None/-1: no grouping, out_i = x_i @ w_i.
    - group_list_type 0 = cumulative ends, 1 = counts. split_item 0/1 -> a list per group, 2/3 -> one tensor.
    Quantisation / activation arguments are refused.
    """
    op = "npu_grouped_matmul"
    for name, val in (("scale", scale), ("offset", offset), ("antiquant_scale", antiquant_scale),
                      ("antiquant_offset", antiquant_offset), ("per_token_scale", per_token_scale),
                      ("activation_input", activation_input), ("activation_quant_scale", activation_quant_scale),
                      ("activation_quant_offset", activation_quant_offset), ("tuning_config", tuning_config)):
        if val is not None:
            refuse(op, f"{name} (quantised / fused-activation GMM)")
    if act_type != 0:
        refuse(op, f"act_type={act_type}")
    if split_item not in (0, 1, 2, 3):
        refuse(op, f"split_item={split_item}")
    x, weight = list(x), list(weight)
    if output_dtype is not None and output_dtype != x[0].dtype:
        refuse(op, f"output_dtype={output_dtype} different from the input dtype")
    if group_type in (None, -1):
        if len(x) != len(weight) or group_list is not None:
            refuse(op, "group_type=-1 with group_list or unequal x / weight lists")
        outs = [xi @ wi for xi, wi in zip(x, weight)]
        if bias is not None:
            outs = [o + b for o, b in zip(outs, bias)]
        return outs
    if len(x) != 1:
        refuse(op, f"{len(x)} x tensors with group_type={group_type} (one x tensor only)")
    x0 = x[0]
    if group_type == 0:
        sizes = _group_sizes(group_list, group_list_type, x0.shape[0])
        ws = _weights(weight, len(sizes))
        biases = None
        if bias is not None:
            biases = list(bias)
            if len(biases) == 1 and biases[0].dim() == 2:
                biases = list(biases[0])
            if len(biases) != len(sizes):
                refuse(op, f"{len(biases)} biases for {len(sizes)} groups")
        outs = []
        for e, xe in enumerate(x0.split(sizes, dim=0)):
            o = xe @ ws[e]
            outs.append(o + biases[e] if biases is not None else o)
        return [torch.cat(outs, dim=0)] if split_item in (2, 3) else outs
    if group_type == 2:
        if bias is not None:
            refuse(op, "bias with group_type=2")
        if len(weight) != 1 or weight[0].dim() != 2:
            refuse(op, "group_type=2 with a weight other than one 2-d [M, N] tensor")
        w0 = weight[0]
        if x0.dim() != 2 or x0.shape[1] != w0.shape[0]:
            refuse(op, f"group_type=2 with x {tuple(x0.shape)} and weight {tuple(w0.shape)} (want [K,M] and [M,N])")
        sizes = _group_sizes(group_list, group_list_type, x0.shape[1])
        outs = [xe @ we for xe, we in zip(x0.split(sizes, dim=1), w0.split(sizes, dim=0))]
        return [torch.stack(outs, dim=0)] if split_item in (2, 3) else outs
    refuse(op, f"group_type={group_type} (0 = split M, 2 = split K, -1 = none)")


# --- MoE permute / unpermute --------------------------------------------------------------------------------------
def npu_moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    """-> (permuted_tokens, sorted_indices): tokens ordered by expert (stable), as Megatron's legacy permute.

    sorted_indices = argsort(indices.flatten(), stable); permuted[p] = tokens[sorted_indices[p] // topk]
    (the same contract as MindSpeed's eager fallback, master/mindspeed/fsdp/distributed/expert_parallel/utils.py).
    """
    op = "npu_moe_token_permute"
    if padded_mode:
        refuse(op, "padded_mode=True")
    if indices.dim() not in (1, 2) or indices.shape[0] != tokens.shape[0]:
        refuse(op, f"indices of shape {tuple(indices.shape)} for {tokens.shape[0]} tokens")
    topk = 1 if indices.dim() == 1 else indices.shape[1]
    if num_out_tokens is not None and int(num_out_tokens) not in (0, indices.numel()):
        refuse(op, f"num_out_tokens={num_out_tokens} (token dropping) for {indices.numel()} routed slots")
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True).to(torch.int32)
    permuted = tokens.index_select(0, sorted_indices.long() // topk)
    return permuted, sorted_indices


def npu_moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    """Inverse of npu_moe_token_permute, weighting each slot by `probs` [T, topk] and summing over topk."""
    op = "npu_moe_token_unpermute"
    if padded_mode or restore_shape is not None:
        refuse(op, "padded_mode / restore_shape")
    if permuted_tokens.shape[0] != sorted_indices.numel():
        refuse(op, f"{permuted_tokens.shape[0]} permuted tokens for {sorted_indices.numel()} sorted indices")
    topk = 1 if probs is None else probs.shape[1]
    slots = sorted_indices.numel()
    if probs is not None and probs.numel() != slots:
        refuse(op, f"probs of shape {tuple(probs.shape)} for {slots} slots")
    flat = torch.zeros(slots, permuted_tokens.shape[-1], dtype=permuted_tokens.dtype, device=permuted_tokens.device)
    flat = flat.index_copy(0, sorted_indices.long(), permuted_tokens)
    out = flat.reshape(slots // topk, topk, -1)
    if probs is not None:
        out = out * probs.unsqueeze(-1).to(out.dtype)
    return out.sum(dim=1)


# --- trivially-defined format / dtype ops -------------------------------------------------------------------------
_ACL_FORMAT_ND = 2


def npu_format_cast(x, acl_format):
    """Only ND (2) exists on CPU: a no-op for 2, refused for private formats (NZ=29, ...)."""
    if int(acl_format) != _ACL_FORMAT_ND:
        refuse("npu_format_cast", f"acl_format={acl_format} (only ND=2 exists on the CPU emulation)")
    return x


def get_npu_format(x):
    return _ACL_FORMAT_ND


def npu_dtype_cast(x, dtype):
    return x.to(dtype)
