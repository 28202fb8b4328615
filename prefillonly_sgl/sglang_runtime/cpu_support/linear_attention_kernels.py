"""Torch implementations of the linear-attention kernels SGLang's CPU path calls for
hybrid models (Qwen3.5's Gated DeltaNet layers, Qwen3-Next): the short causal
convolution, the gating, the chunked gated delta rule and the small fused ops around them.

SGLang's CPU path takes these from a CPU build of sgl-kernel (``torch.ops.sgl_kernel.*``,
``sgl_kernel.mamba``), which PyPI does not have; ``sgl_kernel_ops.py`` registers these
functions under those names. Plain torch, no SGLang: the math is tested against a
token-by-token recurrence in tests/test_linear_attention_kernels.py and, through the engine,
against transformers' own forward.

Layouts are SGLang's: a sequence batch is packed (``cu_seqlens`` / ``query_start_loc``
bound each sequence's tokens), the short-convolution state is ``[slot, dim, width - 1]``
and the recurrent state ``[slot, heads_v, v_dim, k_dim]`` (``Mamba2CacheParams``' shape,
``(hv, v_dim, k_dim)``), both read and written at the sequence's pool slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Chunk length of the delta rule's chunked form: long enough that the per-chunk triangular
# solve amortises, short enough that its [heads, C, C] matrices stay small.
DELTA_RULE_CHUNK = 64
L2NORM_EPS = 1e-6  # FLA's (and transformers') l2norm epsilon


def _silu_or_identity(x: torch.Tensor, activation: bool) -> torch.Tensor:
    return F.silu(x) if activation else x


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    silu: bool,
) -> torch.Tensor:
    """Depthwise causal convolution of each packed sequence, continuing from its state.

    x: [dim, tokens]; weight: [dim, width]; conv_states: [slots, dim, width - 1], the
    inputs before each sequence's first token (zeros where it has no initial state),
    replaced by its last width - 1 inputs. Returns [dim, tokens]."""
    width = weight.shape[-1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist()
    has_state = (
        has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    )
    w = weight.float().unsqueeze(1)  # [dim, 1, width] for a grouped conv1d
    b = bias.float() if bias is not None else None
    for seq, slot in enumerate(slots[: len(starts) - 1]):
        start, end = starts[seq], starts[seq + 1]
        if slot < 0 or end <= start:
            continue
        history = conv_states[slot].float()
        if not has_state[seq]:
            history = torch.zeros_like(history)
        padded = torch.cat([history, x[:, start:end].float()], dim=-1)  # [dim, w-1+n]
        y = F.conv1d(padded.unsqueeze(0), w, b, groups=padded.shape[0]).squeeze(0)
        out[:, start:end] = _silu_or_identity(y, silu).to(x.dtype)
        conv_states[slot] = padded[:, padded.shape[-1] - (width - 1) :].to(conv_states.dtype)
    return out


def causal_conv1d_step(
    x: torch.Tensor,
    conv_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    silu: bool,
    cache_indices: torch.Tensor,
) -> torch.Tensor:
    """One new token per sequence (decode): x [batch, dim] (or [batch, dim, 1]) against
    its slot's state, which shifts by one. Returns x's shape."""
    squeeze = x.dim() == 3
    tokens = x.squeeze(-1) if squeeze else x
    out = torch.empty_like(tokens)
    w = weight.float()
    for row, slot in enumerate(cache_indices.tolist()):
        if slot < 0:
            continue
        window = torch.cat([conv_states[slot].float(), tokens[row].float().unsqueeze(-1)], dim=-1)
        y = (window * w).sum(-1)
        if bias is not None:
            y = y + bias.float()
        out[row] = _silu_or_identity(y, silu).to(tokens.dtype)
        conv_states[slot] = window[:, 1:].to(conv_states.dtype)
    return out.unsqueeze(-1) if squeeze else out


def gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = -exp(A_log) * softplus(a + dt_bias) (the log decay), beta = sigmoid(b); both
    float32, shaped [1, tokens, heads] as the chunk kernel takes them."""
    x = a.float() + dt_bias.float()
    softplus = F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    g = -torch.exp(A_log.float()) * softplus
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """q / k heads shared by a group of v heads (grouped value attention)."""
    if x.shape[-2] == heads:
        return x
    return x.repeat_interleave(heads // x.shape[-2], dim=-2)


def delta_rule_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = DELTA_RULE_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over one sequence, in chunks, float32.

    q, k: [n, heads, k_dim] (already normalised and q scaled); v: [n, heads, v_dim];
    g, beta: [n, heads]; state: [heads, k_dim, v_dim]. Per token t the recurrence is
    S = exp(g_t) S; u_t = beta_t (v_t - S^T k_t); S += k_t u_t^T; o_t = S^T q_t. Within a
    chunk the u_t solve one unit lower-triangular system, (I + A) U = beta (V - e^G K S0)
    with A_ts = beta_t e^(G_t - G_s) k_t.k_s (s < t), G the chunk's cumulative log
    decay; outputs and the next state follow from U. Returns (o [n, heads, v_dim], state).
    """
    n = q.shape[0]
    outputs = []
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))  # [heads, n, dim]
    g, beta = g.transpose(0, 1), beta.transpose(0, 1)  # [heads, n]
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        qc, kc, vc = q[:, start:end], k[:, start:end], v[:, start:end]
        G = g[:, start:end].cumsum(-1)  # [heads, c]
        bc = beta[:, start:end]
        c = end - start
        lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        diff = G.unsqueeze(-1) - G.unsqueeze(-2)  # [heads, t, s] = G_t - G_s
        decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
        strict = decay.masked_fill(torch.eye(c, dtype=torch.bool, device=q.device), 0.0)
        A = bc.unsqueeze(-1) * strict * (kc @ kc.transpose(-1, -2))
        rhs = bc.unsqueeze(-1) * (vc - G.exp().unsqueeze(-1) * (kc @ state))
        eye = torch.eye(c, dtype=A.dtype, device=A.device)
        u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o = G.exp().unsqueeze(-1) * (qc @ state) + (decay * (qc @ kc.transpose(-1, -2))) @ u
        outputs.append(o)
        to_end = (G[:, -1:] - G).exp().unsqueeze(-1)  # e^(G_c - G_s)
        state = G[:, -1].exp()[:, None, None] * state + (kc * to_end).transpose(-1, -2) @ u
    return torch.cat(outputs, dim=1).transpose(0, 1), state


def chunk_gated_delta_rule_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_indices: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Each packed sequence of [1, tokens, heads, dim] q/k/v from its pool slot's state
    ([slots, heads_v, v_dim, k_dim]), which it leaves at the sequence's end (the state a
    prefix cache can keep). Returns o: [1, tokens, heads_v, v_dim] in v's dtype."""
    heads_v = v.shape[-2]
    q32 = _expand_heads(q[0].float(), heads_v)
    k32 = _expand_heads(k[0].float(), heads_v)
    if use_qk_l2norm:
        q32, k32 = _l2norm(q32), _l2norm(k32)
    q32 = q32 * q32.shape[-1] ** -0.5
    v32, g32, b32 = v[0].float(), g[0].float(), beta[0].float()
    out = torch.zeros(v.shape[1:], dtype=v.dtype, device=v.device)
    starts = cu_seqlens.tolist()
    for seq, slot in enumerate(state_indices.tolist()[: len(starts) - 1]):
        start, end = starts[seq], starts[seq + 1]
        if slot < 0 or end <= start:
            continue
        state = ssm_states[slot].float().transpose(-1, -2)  # [heads, k_dim, v_dim]
        o, state = delta_rule_sequence(
            q32[start:end], k32[start:end], v32[start:end], g32[start:end], b32[start:end], state
        )
        out[start:end] = o.to(v.dtype)
        ssm_states[slot] = state.transpose(-1, -2).to(ssm_states.dtype)
    return out.unsqueeze(0)


def gated_delta_rule_decode(
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    ssm_states: torch.Tensor,
    state_indices: torch.Tensor,
    use_qk_l2norm: bool,
    softplus_beta: float,
    softplus_threshold: float,
) -> torch.Tensor:
    """One token per sequence (decode): q/k [1, batch, heads, dim], v [1, batch, heads_v,
    v_dim], a/b [batch, heads_v]; gating and the delta rule's step on each slot's state.
    Returns [1, batch, heads_v, v_dim]."""
    g, beta = gdn_gating(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)
    rows = q.shape[1]
    cu = torch.arange(rows + 1)
    return chunk_gated_delta_rule_varlen(
        q,
        k,
        v,
        g.reshape(1, rows, -1),
        beta.reshape(1, rows, -1),
        ssm_states,
        cu,
        state_indices,
        use_qk_l2norm,
    )


def sigmoid_mul_(x: torch.Tensor, gate: torch.Tensor) -> None:
    """x *= sigmoid(gate), in place (gate may be [tokens, heads, dim] for x's
    [tokens, heads * dim])."""
    x.copy_((x.float() * torch.sigmoid(gate.float().reshape(x.shape))).to(x.dtype))


def rmsnorm_gated(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float):
    """RMSNorm of x's last dimension times weight, gated by silu(gate) (norm before
    gate: the norm after a Gated DeltaNet layer)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float() * F.silu(gate.float())).to(x.dtype)


def gemma_rmsnorm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float, head_dim: int):
    """Gemma's RMSNorm (scale 1 + weight) of every head_dim-long row: [rows, head_dim]."""
    rows = x.reshape(-1, head_dim).float()
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype)


def qk_gemma_rmsnorm(q, k, q_weight, k_weight, eps: float, head_dim: int):
    return gemma_rmsnorm_rows(q, q_weight, eps, head_dim), gemma_rmsnorm_rows(
        k, k_weight, eps, head_dim
    )


def qk_gemma_rmsnorm_with_gate(q_gate, k, q_weight, k_weight, eps, head_dim, num_heads):
    """q and its output gate interleaved per head ([q_h0, gate_h0, q_h1, ...]): the
    normalised q, k and the gate, each [rows, head_dim]."""
    per_head = q_gate.reshape(q_gate.shape[0], num_heads, 2 * head_dim)
    q = per_head[..., :head_dim]
    gate = per_head[..., head_dim:].reshape(-1, head_dim).contiguous()
    return (
        gemma_rmsnorm_rows(q, q_weight, eps, head_dim),
        gemma_rmsnorm_rows(k, k_weight, eps, head_dim),
        gate,
    )


def qkvzba_split_contiguous(mixed_qkvz, mixed_ba, num_heads_qk, num_heads_v, head_qk, head_v):
    """[q | k | v | z] and [b | a] (Qwen3.5's projection layout) into the convolution's
    input [q | k | v], z [tokens, heads_v, head_v], b and a [tokens, heads_v]."""
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    tokens = mixed_qkvz.shape[0]
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim:].reshape(tokens, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v:].contiguous()
    return mixed_qkv, z, b, a


def gate_sigmoid_mul(hidden_states, gate_weight, shared_output):
    """A shared expert's output scaled per token by sigmoid(hidden . gate_weight)."""
    gate = torch.sigmoid(hidden_states.float() @ gate_weight.float()).unsqueeze(-1)
    return (gate * shared_output.float()).to(shared_output.dtype)


def gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output, out) -> None:
    """out += the gated shared expert's output, in place."""
    gated = gate_sigmoid_mul(hidden_states, gate_weight, shared_output)
    out.copy_((out.float() + gated.float()).to(out.dtype))


# -- Mamba2 (SSD) -------------------------------------------------------------------------
# Layouts are SGLang's Mamba2 mixer's (layers/attention/mamba/mamba.py): packed tokens,
# x [tokens, heads, head_dim], dt [tokens, heads], B / C [tokens, groups, d_state] (each
# group shared by heads // groups consecutive heads), A [heads] (already -exp(A_log)), the
# state [slot, heads, head_dim, d_state].


def _ssd_dt(dt: torch.Tensor, dt_bias, softplus: bool, limit) -> torch.Tensor:
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if softplus:
        dt = F.softplus(dt)
    low, high = limit if limit is not None else (0.0, float("inf"))
    if low > 0.0 or high != float("inf"):
        dt = dt.clamp(min=low, max=high)
    return dt


def _heads_of_groups(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., groups, d_state] -> [..., heads, d_state]: each head its group's."""
    return t.float().repeat_interleave(heads // t.shape[-2], dim=-2)


def _skip_of(D, x: torch.Tensor) -> torch.Tensor:
    """D * x, D given per head ([heads]) or per head and dim ([heads, head_dim])."""
    d = D.float()
    return x * (d.unsqueeze(-1) if d.dim() == 1 else d)


def ssd_chunk(x, dt, a, B, C, state):
    """One chunk of one sequence in SSD's matrix form: x [l, H, P], dt [l, H], a = dt * A
    [l, H], B / C [l, H, N], state [H, P, N] before the chunk. Returns (y without the skip
    term [l, H, P], the state after the chunk)."""
    acum = a.cumsum(0)  # [l, H]
    t = acum.transpose(0, 1)  # [H, l]
    segment = t.unsqueeze(2) - t.unsqueeze(1)  # [H, t, s]: log decay from s to t
    causal = torch.ones(segment.shape[1:], dtype=torch.bool).tril()
    decay = torch.exp(segment.masked_fill(~causal, float("-inf")))
    scores = torch.einsum("thn,shn->hts", C, B) * decay * dt.transpose(0, 1).unsqueeze(1)
    y = torch.einsum("hts,shp->thp", scores, x)
    y = y + torch.einsum("thn,hpn->thp", C, state) * torch.exp(acum).unsqueeze(-1)
    to_end = torch.exp(acum[-1:] - acum) * dt  # [l, H]: decay from each token to the end
    state = state * torch.exp(acum[-1]).view(-1, 1, 1) + torch.einsum(
        "shn,shp->hpn", B * to_end.unsqueeze(-1), x
    )
    return y, state


def ssd_varlen(
    x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, cu_seqlens, dt_softplus,
    dt_limit, out,
):  # fmt: skip
    """Mamba2's chunked scan over packed sequences (SGLang's mamba_chunk_scan_combined in
    its varlen mode): writes y (with the skip term) into ``out`` [tokens, H, P] and returns
    each sequence's final state [sequences, H, P, N] (float32). ``initial_states`` [S, H, P,
    N] or None (zeros)."""
    heads, dim = x.shape[-2], x.shape[-1]
    bounds = cu_seqlens.tolist()
    d_state = B.shape[-1]
    finals = torch.zeros(len(bounds) - 1, heads, dim, d_state, dtype=torch.float32)
    step = max(int(chunk_size), 1)
    for seq in range(len(bounds) - 1):
        start, end = bounds[seq], bounds[seq + 1]
        state = (
            initial_states[seq].float()
            if initial_states is not None
            else torch.zeros(heads, dim, d_state, dtype=torch.float32)
        )
        for lo in range(start, end, step):
            hi = min(lo + step, end)
            xs = x[lo:hi].float()
            dts = _ssd_dt(dt[lo:hi], dt_bias, dt_softplus, dt_limit)
            y, state = ssd_chunk(
                xs, dts, dts * A.float(), _heads_of_groups(B[lo:hi], heads),
                _heads_of_groups(C[lo:hi], heads), state,
            )  # fmt: skip
            if D is not None:
                y = y + _skip_of(D, xs)
            out[lo:hi] = y.to(out.dtype)
        finals[seq] = state
    return finals


def ssd_step(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out):
    """Mamba2's one-token update (SGLang's selective_state_update, its decode form): x
    [batch, H, P]; dt, dt_bias, D [.., H, P]; A [H, P, N]; B / C [batch, G, N]; the state
    [slot, H, P, N] read and written at each row's slot (negative: skipped); y into out."""
    slots = (
        state_batch_indices.tolist() if state_batch_indices is not None else list(range(x.shape[0]))
    )
    heads = x.shape[-2]
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        d = dt[row].float() + (dt_bias.float() if dt_bias is not None else 0.0)
        if dt_softplus:
            d = F.softplus(d)
        b = _heads_of_groups(B[row], heads)  # [H, N]
        c = _heads_of_groups(C[row], heads)
        xs = x[row].float()
        s = state[slot].float() * torch.exp(A.float() * d.unsqueeze(-1))
        s = s + (d * xs).unsqueeze(-1) * b.unsqueeze(1)
        y = torch.einsum("hpn,hn->hp", s, c)
        if D is not None:
            y = y + D.float() * xs
        if z is not None:
            y = y * F.silu(z[row].float())
        state[slot] = s.to(state.dtype)
        out[row] = y.to(out.dtype)
    return out
