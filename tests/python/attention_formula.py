"""The attention formula of docs/semantics.md written out, for the bench scripts' tests on CPU
tensors: one sequence at a time, in the tensors' dtype, and the flattened layouts they use."""

import math


def direct_attention(torch, q, k, v, causal, window=(-1, -1), sink=None, softcap=0.0):
    """One sequence, q (s, H, d), k, v (s, HKV, d), in their dtype, the formula of docs/semantics.md
    written out: S_ij = c * tanh(q_i . k_j / sqrt(d) / c) (c = softcap; the plain score when 0),
    p_ij = exp(S_ij) / (exp(sink_h) + sum_j' exp(S_ij')) over the visible keys, out_i = sum_j p_ij v_j.
    No max subtraction: capped (or small random) scores keep exp in range."""
    s, heads, d = q.shape
    group = heads // k.shape[1]
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(s, s, dtype=torch.bool)
    if right >= 0:
        visible = visible & (j <= i + right)
    if left >= 0:
        visible = visible & (j >= i - left)
    outs = []
    for h in range(heads):
        scores = q[:, h] @ k[:, h // group].transpose(0, 1) / math.sqrt(d)
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        weights = torch.exp(scores) * visible
        denominator = weights.sum(-1, keepdim=True) + (torch.exp(sink[h]) if sink is not None else 0)
        outs.append((weights / denominator) @ v[:, h // group])
    return torch.stack(outs, 1)


def spans_of(q, cu=None):
    """(start, stop) rows of each sequence of q in the flattened (tokens, heads, d) layout: from
    cu_seqlens when packed (varlen), else from q's (batch, seqlen, heads, d) shape."""
    if cu is not None:
        cu = cu.tolist()
        return list(zip(cu[:-1], cu[1:]))
    return [(b * q.shape[1], (b + 1) * q.shape[1]) for b in range(q.shape[0])]


def flat(x):
    return x.reshape(-1, *x.shape[-2:])
