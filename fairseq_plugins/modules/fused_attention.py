"""Fused attention kernels for the score-bias schemes and Shaw's attention (``--attention-backend``).

- ``biased_sdpa``: torch's fused CPU SDPA kernel with a learned float mask. The kernel takes a 4-D mask only, and
  one that needs no gradient; ``BiasedFlashCPU`` runs it on the detached mask and gives the mask its gradient
  in the backward, dS = α ⊙ (dz vᵀ − (dz·z)), from α recomputed from the kernel's log-sum-exp.
- ``flex``: FlexAttention (``torch.compile``d on CUDA; on CPU its higher-order op eagerly, unfused, the same
  maths) with a ``score_mod`` that adds a scheme's bias(h, i, j), and fairseq's masks as its ``mask_mod``. The
  compiled call compiles once per kind of call (``_compiled_flex``), with symbolic sizes: its guards never see a
  per-call closure or a mask that is None in some calls, each of which was one more compile up to dynamo's
  recompile limit, past which FlexAttention ran unfused.
- ``shaw_flex``: Shaw's key and value terms without a (T, S) tensor: the key term as a ``score_mod`` reading
  P = q (w^K)ᵀ; the value term from the band probabilities α_{i,i+m} = exp(s_{i,i+m} − lse_i), |m| < k, and the
  clipped tails' masses A± = exp(lse±_i − lse_i) of two masked passes. Derivation: docs/fused_attention.md.
"""

import math
import types
from typing import Callable, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.fx.experimental import _config as fx_config

BACKENDS = ("sdpa", "flex")
FLEX_TORCH = "2.9"  # AuxRequest, the log-sum-exp's gradient and learnable captured tensors, all in one release


def check_flex():
    """Raise one line if this torch lacks what the flex backend needs."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest  # noqa: F401  (2.9 and later)
    except ImportError:
        raise RuntimeError(f"--attention-backend flex needs torch >= {FLEX_TORCH} (FlexAttention's log-sum-exp "
                           f"output and gradients of captured tensors); this is torch {torch.__version__}") from None


def check_backend(name: str, dropout: float):
    if name not in BACKENDS:
        raise ValueError(f"--attention-backend must be one of {', '.join(BACKENDS)} (got {name!r})")
    if name == "flex":
        check_flex()
        if dropout > 0:
            raise ValueError(f"--attention-backend flex: FlexAttention has no attention dropout "
                             f"(got --attention-dropout {dropout}); use 0 or --attention-backend sdpa")


# ---------------------------------------------------------------- the fused CPU kernel with a learned mask

class BiasedFlashCPU(torch.autograd.Function):
    """z = softmax(q kᵀ·scale + bias + mask) v by torch's fused CPU kernel, with the bias's gradient (the kernel
    gives only dq, dk, dv). bias (1 or B, H, T, S) and mask (fairseq's masks, no gradient) are added inside, the
    sum kept for no longer than the kernel runs: only the bias and the kernel's log-sum-exp wait for the
    backward, never a (B, H, T, S) tensor."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        full = bias if mask is None else bias + mask
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                             attn_mask=full, scale=scale)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        full = bias if mask is None else bias + mask
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, attn_mask=full, scale=ctx.scale)
        dbias = None
        if ctx.needs_input_grad[3]:  # dS = α (dz vᵀ − dz·z): one layer's (B, H, T, S) at a time, here only
            work = torch.promote_types(q.dtype, torch.float32)
            scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)).mul_(ctx.scale).add_(full)
            alpha = scores.sub_(lse.to(work).unsqueeze(-1)).exp_()
            row = (grad_out.to(work) * out.to(work)).sum(-1, keepdim=True)
            grad_scores = torch.matmul(grad_out.to(work), v.to(work).transpose(-1, -2)).sub_(row).mul_(alpha)
            dims = [d for d in range(4) if bias.size(d) == 1 and grad_scores.size(d) != 1]
            dbias = (grad_scores.sum(dims, keepdim=True) if dims else grad_scores).to(bias.dtype)
        return dq, dk, dv, dbias, None, None


def _four_d(x: Optional[Tensor]) -> Optional[Tensor]:
    return x if x is None or x.dim() == 4 else x.view((1,) * (4 - x.dim()) + x.shape)


def biased_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor],
                dropout_p: float) -> Tensor:
    """softmax(q kᵀ/√d + bias + mask) v, q (B, H, T, d); bias and fairseq's additive mask broadcastable to
    (B, H, T, S), on torch's fused CPU kernel where it has one.

    Torch's CPU SDPA sends a 3-D mask and a mask that needs a gradient (T5's table) down its unfused math path,
    which keeps every layer's (B, H, T, S) probabilities for the backward; its fused kernel keeps the mask it was
    given (with padding, (B, H, T, S) too). So on CPU the bias goes through ``BiasedFlashCPU``, 4-D."""
    if bias is not None:
        bias = _four_d(bias.to(q.dtype))
    mask = _four_d(mask)
    if (bias is not None and q.device.type == "cpu" and dropout_p == 0 and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")):
        return BiasedFlashCPU.apply(q, k, v, bias, mask, 1.0 / math.sqrt(q.size(-1)))
    full = bias if mask is None else (mask if bias is None else mask + bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout_p)


# ---------------------------------------------------------------- FlexAttention

class FlexMask(NamedTuple):
    """fairseq's masks for FlexAttention: which keys a query may see, and what finite part a float mask adds."""

    keep_key: Optional[Tensor]  # (B, S) bool: not padding
    allowed: Optional[Tensor]  # (T, S) bool: attn_mask is not −inf
    added: Optional[Tensor]  # (T, S) float: attn_mask's finite values, where any is non-zero


def flex_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor]) -> FlexMask:
    keep_key = None if key_padding_mask is None else ~key_padding_mask.to(torch.bool)
    allowed = added = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            allowed = ~attn_mask
        else:
            allowed = attn_mask != float("-inf")
            finite = attn_mask.masked_fill(~allowed, 0.0)
            added = finite if bool(finite.any()) else None
    return FlexMask(keep_key, allowed, added)


def _mask_mod(keep_key: Tensor, allowed: Tensor):
    """One closure shape for every call: the compiled call's guards see two tensors (metadata only), never None
    in some calls and a tensor in others (each such variant would be one more compile)."""

    def mask_mod(b, h, i, j):
        return keep_key[b, j] & allowed[i, j]

    return mask_mod


def _no_score_mod(s, b, h, i, j):
    return s


def _flex_call(q, k, v, score_mod, buffers, added, block_mask, scale):
    """FlexAttention's public call, the function compiled on CUDA. Its score_mod is made here, inside the compiled
    region, so that the guards are on score_mod's code and the buffers' metadata, never on a per-call closure."""
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    def mod(s, b, h, i, j):
        s = score_mod(s, b, h, i, j, *buffers)
        return s if added is None else s + added[i, j]

    out, aux = flex_attention(q, k, v, score_mod=mod, block_mask=block_mask, scale=scale,
                              return_aux=AuxRequest(lse=True))
    return out, aux.lse


# torch.compile backend of the FlexAttention call by device type; a device not listed runs the higher-order op
# eagerly (CPU: the public function refuses gradients there)
COMPILE_BACKENDS = {"cuda": "inductor"}
_COMPILED = {}


def _compiled_flex(backend, score_mod: Callable, with_added: bool, sizes: Sequence[int], grad: bool):
    """``_flex_call`` compiled for one kind of call: one score_mod (by its code: T5's, ALiBi's, Shaw's, none), with
    or without a float mask, one set of sizes equal to 1 among ``sizes`` (dynamo specialises a size of 1 even when
    compiling with symbolic sizes: a batch of one sentence, a length within one block of the mask), training or
    not. Each kind gets its own copy of the function's code, so its own dynamo cache and recompile limit, and
    compiles once: within a kind only the sizes vary, symbolic from the first compile on."""
    key = (backend, score_mod.__code__, with_added, tuple(n == 1 for n in sizes), grad)
    if key not in _COMPILED:
        copy = types.FunctionType(_flex_call.__code__.replace(), _flex_call.__globals__, _flex_call.__name__)
        _COMPILED[key] = torch.compile(copy, backend=backend, dynamic=True)
    return _COMPILED[key]


def flex(q: Tensor, k: Tensor, v: Tensor, score_mod: Optional[Callable], buffers: Sequence[Tensor], mask: FlexMask,
         region: Optional[Tensor] = None, scale: float = 1.0):
    """FlexAttention: (out (B, H, T, d) in q's dtype, lse (B, H, T) float32+ in natural log).

    ``score_mod(s, b, h, i, j, *buffers)`` takes the tensors it reads as arguments, so that their gradients flow on
    CPU too; ``region`` (T, S) bool restricts the keys further (the tails of Shaw's value term). CUDA: the
    compiled kernel; CPU: the higher-order op eagerly, the same maths unfused."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_op
    from torch.nn.attention.flex_attention import AuxRequest, _apply_kernel_options, create_block_mask

    B, T, S = q.size(0), q.size(2), k.size(2)
    # always both tensors (all true where fairseq has no mask): one mask_mod for every kind of attention
    keep_key = mask.keep_key if mask.keep_key is not None else torch.ones(B, S, dtype=torch.bool, device=q.device)
    allowed = mask.allowed if mask.allowed is not None else torch.ones(T, S, dtype=torch.bool, device=q.device)
    if region is not None:
        allowed = allowed & region
    block_mask = create_block_mask(_mask_mod(keep_key, allowed), B, None, T, S, device=q.device)
    score_mod = _no_score_mod if score_mod is None else score_mod
    backend = COMPILE_BACKENDS.get(q.device.type)
    if backend is not None:
        sizes = (B, T, S) + tuple(block_mask.kv_indices.shape[-2:])  # and the mask's blocks along T and S
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *buffers))  # validation: no
        compiled = _compiled_flex(backend, score_mod, mask.added is not None, sizes, grad)
        # no duck sizing: sizes equal by chance (B = T, T = 2k+1 of Shaw's P) would each be one more compile
        with fx_config.patch(use_duck_shape=False):
            return compiled(q, k, v, score_mod, tuple(buffers), mask.added, block_mask, scale)
    if mask.added is not None:  # a float attn_mask's finite part: one more score term
        inner, buffers = score_mod, tuple(buffers) + (mask.added,)

        def score_mod(s, b, h, i, j, *bufs):
            return inner(s, b, h, i, j, *bufs[:-1]) + bufs[-1][i, j]

    options = _apply_kernel_options(q, k, v, True, None, AuxRequest(lse=True))
    out, lse2, _ = flex_op(q, k, v, score_mod, block_mask.as_tuple(), scale, options, tuple(buffers), ())
    return out, lse2 * math.log(2.0)  # the op's log-sum-exp is in base 2 (its kernels' convention)


def bias_score_mod(scheme, T: int, S: int, device, dtype):
    """A score-bias scheme's (score_mod, buffers): its own if it has one (``flex_score_mod``), else its (H, T, S)
    bias read at (h, i, j)."""
    q_pos, k_pos = torch.arange(T, device=device), torch.arange(S, device=device)
    own = getattr(scheme, "flex_score_mod", None)
    if own is not None:
        return own(q_pos, k_pos, dtype)
    bias = scheme.score_bias(q_pos, k_pos, dtype)
    if bias is None:  # rotary and no-position schemes
        return None, ()

    def score_mod(s, b, h, i, j, bias):
        return s + bias[h, i, j]

    return score_mod, (bias,)


# ---------------------------------------------------------------- Shaw's attention

def _per_head(table: Tensor, rows) -> Tensor:
    """Rows of a (H, 2k+1, d) or (2k+1, d) table, shaped to broadcast over (B, H, T, ·, d)."""
    return table[:, rows] if table.dim() == 3 else table[rows]


def shaw_flex(q: Tensor, k: Tensor, v: Tensor, relative_keys: Optional[Tensor], relative_values: Optional[Tensor],
              max_relative: int, mask: FlexMask) -> Tensor:
    """z_i = Σ_j α_ij (v_j + w^V_clip(j−i)) with e_ij = q_i·(k_j + w^K_clip(j−i)) + masks; q (B, H, T, d) already
    scaled, k and v (B, H, S, d), S = T (self-attention without a cache). Returns z (B, H, T, d) in q's dtype."""
    K = max_relative
    B, H, T, d = q.shape
    S = k.size(2)
    buffers, score_mod = (), None
    if relative_keys is not None:
        P = torch.matmul(q, relative_keys.transpose(-1, -2))  # (B, H, T, 2k+1), q already scaled
        # clip(j − i, k) + k read from a (T, S) table like T5's buckets: clamping inside the score_mod made −k a
        # size computed in the compiled graph, which inductor cannot take as a captured input
        rows = (torch.arange(S, device=q.device)[None, :] - torch.arange(T, device=q.device)[:, None])
        rows = rows.clamp(-K, K).add_(K)

        def score_mod(s, b, h, i, j, P, rows):
            return s + P[b, h, i, rows[i, j]]

        buffers = (P, rows)
    out, lse = flex(q, k, v, score_mod, buffers, mask)
    if relative_values is None:
        return out
    work = lse.dtype
    if K == 0:  # one bucket holding every key: Σ_j α_ij = 1
        return out + _per_head(relative_values, 0).view(-1, d).to(q.dtype)[None, :, None, :].expand_as(out)
    # band: α_{i,i+m} = exp(s_{i,i+m} − lse_i) for |m| < k, from q·k on 2k−1 shifted views of the keys
    offsets = torch.arange(-(K - 1), K, device=q.device)  # m
    key_index = torch.arange(T, device=q.device)[:, None] + offsets  # (T, 2k−1): j = i + m
    valid = (key_index >= 0) & (key_index < S)
    clamped = key_index.clamp(0, S - 1)
    if mask.allowed is not None:
        valid = valid & mask.allowed.gather(1, clamped)
    valid = valid.expand(B, 1, T, 2 * K - 1) if mask.keep_key is None else \
        (valid & mask.keep_key[:, clamped]).unsqueeze(1)  # (B, 1, T, 2k−1)
    padded = F.pad(k, (0, 0, K - 1, K - 1)).to(work)  # keys at −(k−1)..S+k−2; shifted slices are views
    qw = q.to(work)
    band = torch.stack([torch.linalg.vecdot(qw, padded[:, :, m:m + T]) for m in range(2 * K - 1)], -1)
    if relative_keys is not None:
        band = band + P[..., 1:2 * K].to(work)
    if mask.added is not None:
        band = band + mask.added.gather(1, clamped).to(work)
    band = torch.where(valid, band - lse.unsqueeze(-1), torch.tensor(float("-inf"), dtype=work, device=q.device))
    alpha = band.exp()  # (B, H, T, 2k−1)
    values = torch.matmul(alpha, _per_head(relative_values, slice(1, 2 * K)).to(work))  # (B, H, T, d)
    for sign, row in ((-1, 0), (1, 2 * K)):  # the clipped tails: keys j ≤ i − k and j ≥ i + k
        tail = _tail(sign, K, T, S, q.device)
        if not _tail_possible(sign, K, T, S, tail, mask):
            continue
        _, lse_tail = flex(q, k, v, score_mod, buffers, mask, region=tail)
        mass = (lse_tail - lse).exp().unsqueeze(-1)  # A±: (B, H, T, 1); an empty tail's lse is −inf: 0
        values = values + mass * _per_head(relative_values, row).to(work).view(-1, 1, d)
    return out + values.to(q.dtype)


def _tail(sign: int, K: int, T: int, S: int, device) -> Tensor:
    """(T, S) bool: the keys of the lower (j <= i - k) or upper (j >= i + k) clipped tail."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return (j <= i - K) if sign < 0 else (j >= i + K)


def _tail_possible(sign: int, K: int, T: int, S: int, tail: Tensor, mask: FlexMask) -> bool:
    """Whether any query has a key in that tail (the decoder's causal mask leaves the upper one empty). Without a
    mask, from the sizes alone (no host sync on CUDA): a query i >= k reaches the lower tail, key j >= k the upper."""
    if mask.allowed is None:
        return T > K if sign < 0 else S > K
    return bool((mask.allowed & tail).any())
