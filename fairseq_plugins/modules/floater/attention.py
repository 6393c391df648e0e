"""FLOATER's position-biased projections: a projection whose bias depends on the token's position (paper eq. 12).

Block n's query projection with a per-position bias::

    q_i^(n) = W_q^(n) x_i + b_q^(n)(t_i) = W_q^(n) x_i + b_q^(n)(0) + Δb_q^(n)(t_i)

(likewise k and v), where b(0) is the projection's ordinary bias parameter and Δb comes from the flow's solve
(``flows.py``).

Mapping to code
---------------
- ``biased_projection``                   ``y_i = W x_i + b(0) + Δb(t_i)`` for one fairseq q/k/v Linear and its
  binding (Δb is in the solve's dtype, float32 for half-precision models: it is cast where it is added).
- ``position_bindings``, ``step_bindings``   what each projection adds in one forward: a flow's Δb at each
  token's row, or one decoding step's whole bias (``scheme.py`` holds them for the forward).
- ``token_rows``, ``rows_from_padding_mask``   the grid row of each token (fairseq's position numbering).
"""

from typing import Dict, List

import torch.nn.functional as F
from torch import Tensor, nn

# projection → its binding for one forward: (Δb rows (P, out), rows (T, B|1) or a function returning them), or
# the whole bias b(0) + Δb(t) (out,) of one decoding step, shared by every token
Bindings = Dict[nn.Linear, object]


def biased_projection(proj: nn.Linear, x: Tensor, binding) -> Tensor:
    """proj(x) with its position-dependent bias, x (T, B, in) → (T, B, out); binding None: proj(x) alone."""
    if binding is None:
        return proj(x)
    if isinstance(binding, Tensor):  # one decoding step: the whole bias, one rounding
        return F.linear(x, proj.weight, binding.to(proj.weight.dtype))
    y = proj(x)
    delta, rows = binding
    if callable(rows):
        rows = rows()
    # (T, B, out) + (T, B|1, out). F.embedding, not delta[rows]: the indexing's backward (index_put with
    # accumulate) adds rows in a thread-dependent order on a multi-threaded CPU, so training was not reproducible
    # run to run; embedding's backward sums each row in token order.
    return y + F.embedding(rows, delta).to(y.dtype)


def position_bindings(projections: List[nn.Linear], delta: Tensor, rows) -> Bindings:
    """Projection j adds Δb[:, j] at the row of each token. delta: (P, k, d).

    rows: (T, B) or (T, 1) grid rows, or a function returning them (called only if a projection runs).
    """
    return {proj: (delta_j, rows) for proj, delta_j in zip(projections, delta.unbind(1))}


def step_bindings(projections: List[nn.Linear], biases: Tensor) -> Bindings:
    """Projection j's whole bias is biases[j] for every token (k, d): one decoding step."""
    return dict(zip(projections, biases.unbind(0)))


def token_rows(tokens: Tensor, padding_idx: int) -> Tensor:
    """(B, T) tokens → (T, B) grid row of each token: its index among the sentence's non-padding tokens
    (fairseq's make_positions − padding_idx − 1, so left padding does not shift positions); 0 for pads."""
    return rows_from_padding_mask(tokens.eq(padding_idx))


def rows_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """(B, T) padding mask → (T, B) grid rows, as ``token_rows``."""
    keep = (~padding_mask).long()
    return ((keep.cumsum(dim=1) * keep) - 1).clamp(min=0).t()
