"""The CPU support's linear-attention kernels (cpu_support/linear_attention_kernels.py)
against plain token-by-token references: the chunked gated delta rule against its
recurrence, the short convolution against a causal conv1d of the whole sequence, both
continuing from a state as a prefix-cache hit does. No SGLang."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefillonly_sgl.sglang_runtime.cpu_support import linear_attention_kernels as kernels


def _recurrent(q, k, v, g, beta, state):
    """The gated delta rule token by token (q, k normalised and q scaled already);
    state [heads, k_dim, v_dim]."""
    outs = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        memory = torch.einsum("hk,hkv->hv", k[t], state)
        delta = beta[t][:, None] * (v[t] - memory)
        state = state + torch.einsum("hk,hv->hkv", k[t], delta)
        outs.append(torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(outs), state


def _inputs(n, heads=3, k_dim=8, v_dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n, heads, k_dim, generator=gen), dim=-1) * k_dim**-0.5
    k = F.normalize(torch.randn(n, heads, k_dim, generator=gen), dim=-1)
    v = torch.randn(n, heads, v_dim, generator=gen)
    g = -torch.rand(n, heads, generator=gen)  # log decays, <= 0
    beta = torch.rand(n, heads, generator=gen)
    state = torch.randn(heads, k_dim, v_dim, generator=gen)
    return q, k, v, g, beta, state


def test_chunked_delta_rule_equals_its_recurrence_across_chunks():
    q, k, v, g, beta, state = _inputs(150)  # two full chunks of 64 and a partial one
    got, got_state = kernels.delta_rule_sequence(q, k, v, g, beta, state, chunk=64)
    want, want_state = _recurrent(q, k, v, g, beta, state)
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(got_state, want_state, atol=1e-5)


def test_delta_rule_split_at_a_prefix_boundary_is_the_whole_sequence():
    """What a cached prefix's state snapshot relies on: the state after the first r
    tokens, continued over the rest, gives the rest's outputs of one whole pass."""
    q, k, v, g, beta, state = _inputs(90, seed=1)
    whole, whole_state = kernels.delta_rule_sequence(q, k, v, g, beta, state)
    r = 37
    _, mid = kernels.delta_rule_sequence(q[:r], k[:r], v[:r], g[:r], beta[:r], state)
    rest, end = kernels.delta_rule_sequence(q[r:], k[r:], v[r:], g[r:], beta[r:], mid)
    assert torch.allclose(rest, whole[r:], atol=1e-5)
    assert torch.allclose(end, whole_state, atol=1e-5)


def test_varlen_delta_rule_reads_and_writes_each_sequence_slot():
    heads_k, heads_v, dim = 2, 4, 8
    gen = torch.Generator().manual_seed(2)
    lengths = [5, 70, 1]
    total = sum(lengths)
    q = torch.randn(1, total, heads_k, dim, generator=gen)
    k = torch.randn(1, total, heads_k, dim, generator=gen)
    v = torch.randn(1, total, heads_v, dim, generator=gen)
    g = -torch.rand(1, total, heads_v, generator=gen)
    beta = torch.rand(1, total, heads_v, generator=gen)
    pool = torch.randn(6, heads_v, dim, dim, generator=gen)  # [slot, heads_v, v, k]
    slots = torch.tensor([4, 0, 2])
    cu = torch.tensor([0, 5, 75, 76])
    before = pool.clone()
    out = kernels.chunk_gated_delta_rule_varlen(q, k, v, g, beta, pool, cu, slots)
    assert out.shape == (1, total, heads_v, dim)
    for seq, slot in enumerate(slots.tolist()):
        s, e = cu[seq].item(), cu[seq + 1].item()
        qs = F.normalize(q[0, s:e].repeat_interleave(2, dim=1), dim=-1, eps=1e-6) * dim**-0.5
        ks = F.normalize(k[0, s:e].repeat_interleave(2, dim=1), dim=-1, eps=1e-6)
        want, state = _recurrent(qs, ks, v[0, s:e], g[0, s:e], beta[0, s:e],
                                 before[slot].transpose(-1, -2))  # fmt: skip
        assert torch.allclose(out[0, s:e], want, atol=1e-4)
        assert torch.allclose(pool[slot], state.transpose(-1, -2), atol=1e-4)
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])  # other slots untouched


def test_short_convolution_continues_from_its_state():
    dim, width = 6, 4
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(dim, 30, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    whole = F.silu(F.conv1d(F.pad(x, (width - 1, 0)).unsqueeze(0), weight.unsqueeze(1), bias,
                            groups=dim)).squeeze(0)  # fmt: skip
    states = torch.full((3, dim, width - 1), 7.0)  # garbage where there is no history
    first = kernels.causal_conv1d_varlen(
        x[:, :11], weight, bias, states, torch.tensor([0, 11]), torch.tensor([1]),
        torch.tensor([False]), silu=True,
    )  # fmt: skip
    rest = kernels.causal_conv1d_varlen(
        x[:, 11:], weight, bias, states, torch.tensor([0, 19]), torch.tensor([1]),
        torch.tensor([True]), silu=True,
    )  # fmt: skip
    assert torch.allclose(torch.cat([first, rest], dim=1), whole, atol=1e-5)
    assert torch.equal(states[1], x[:, -(width - 1) :])
    step = kernels.causal_conv1d_step(torch.randn(1, dim), states, weight, bias, True,
                                      torch.tensor([1]))  # fmt: skip
    assert step.shape == (1, dim)


def test_gating_and_small_fused_ops():
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(7, 4, generator=gen), torch.randn(7, 4, generator=gen)
    A_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    g, beta = kernels.gdn_gating(A_log, a, b, dt_bias)
    assert torch.allclose(g[0], -A_log.exp() * F.softplus(a + dt_bias))
    assert torch.allclose(beta[0], torch.sigmoid(b))
    x, gate = torch.randn(5, 12, generator=gen), torch.randn(5, 3, 4, generator=gen)
    want = x * torch.sigmoid(gate.reshape(5, 12))
    kernels.sigmoid_mul_(x, gate)
    assert torch.allclose(x, want)
    qkvz = torch.arange(2 * (2 * 2 * 3 + 2 * 4 * 2), dtype=torch.float32).reshape(2, -1)
    ba = torch.arange(2 * 8, dtype=torch.float32).reshape(2, 8)
    mixed, z, bb, aa = kernels.qkvzba_split_contiguous(qkvz, ba, 2, 4, 3, 2)
    assert mixed.shape == (2, 20) and z.shape == (2, 4, 2)
    assert torch.equal(z.reshape(2, -1), qkvz[:, 20:]) and torch.equal(aa, ba[:, 4:])


# -- Mamba2 (SSD) -------------------------------------------------------------------------
def _ssd_recurrence(x, dt, A, B, C, D, state):
    """Mamba2 token by token: x [n, H, P], dt [n, H] (after softplus), A [H], B / C
    [n, H, N] (per head), D [H]; state [H, P, N]."""
    outs = []
    for t in range(x.shape[0]):
        state = state * torch.exp(dt[t] * A).view(-1, 1, 1)
        state = state + (dt[t].view(-1, 1) * x[t]).unsqueeze(-1) * B[t].unsqueeze(1)
        outs.append(torch.einsum("hpn,hn->hp", state, C[t]) + D.view(-1, 1) * x[t])
    return torch.stack(outs), state


def _ssd_inputs(n, heads=4, groups=2, dim=3, d_state=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, heads, dim, generator=gen)
    dt = torch.randn(n, heads, generator=gen)  # before dt_bias and softplus
    A = -torch.rand(heads, generator=gen) - 0.1
    B = torch.randn(n, groups, d_state, generator=gen)
    C = torch.randn(n, groups, d_state, generator=gen)
    D = torch.randn(heads, generator=gen)
    dt_bias = torch.randn(heads, generator=gen)
    return x, dt, A, B, C, D, dt_bias


def test_ssd_scan_equals_its_recurrence_across_chunks_sequences_and_states():
    """ssd_varlen (SGLang's mamba_chunk_scan_combined on CPU): two packed sequences, the
    second continuing from an initial state, chunk lengths that do and do not divide
    them; every output and both final states against the token-by-token recurrence."""
    x, dt, A, B, C, D, dt_bias = _ssd_inputs(37)
    heads = x.shape[1]
    initial = torch.randn(2, heads, 3, 5, generator=torch.Generator().manual_seed(1))
    initial[0] = 0.0
    cu = torch.tensor([0, 20, 37])
    per_head = lambda t: t.repeat_interleave(heads // t.shape[1], dim=1)  # noqa: E731
    d = F.softplus(dt + dt_bias)
    for chunk in (4, 7, 64):
        out = torch.empty_like(x)
        finals = kernels.ssd_varlen(
            x, dt, A, B, C, chunk, D, dt_bias, initial, cu, True, (0.0, float("inf")), out
        )
        for seq, (lo, hi) in enumerate([(0, 20), (20, 37)]):
            want, state = _ssd_recurrence(
                x[lo:hi], d[lo:hi], A, per_head(B[lo:hi]), per_head(C[lo:hi]), D, initial[seq]
            )
            assert torch.allclose(out[lo:hi], want, atol=1e-5), chunk
            assert torch.allclose(finals[seq], state, atol=1e-5), chunk


def test_ssd_step_continues_the_scan_at_each_rows_slot():
    """ssd_step (SGLang's selective_state_update on CPU, the decode form): one token per
    row, each from its slot's state, equals the next step of the recurrence; a negative
    slot is skipped."""
    x, dt, A, B, C, D, dt_bias = _ssd_inputs(2)
    heads, dim, d_state = x.shape[1], x.shape[2], B.shape[2]
    pool = torch.randn(4, heads, dim, d_state, generator=torch.Generator().manual_seed(2))
    before = pool.clone()
    out = torch.zeros(2, heads, dim)
    slots = torch.tensor([3, -1])
    kernels.ssd_step(
        pool, x, dt[:, :, None].expand(-1, -1, dim), A[:, None, None].expand(-1, dim, d_state),
        B, C, D[:, None].expand(-1, dim), None, dt_bias[:, None].expand(-1, dim), True, slots,
        out,
    )  # fmt: skip
    per_head = lambda t: t.repeat_interleave(heads // t.shape[1], dim=1)  # noqa: E731
    want, state = _ssd_recurrence(
        x[:1], F.softplus(dt + dt_bias)[:1], A, per_head(B[:1]), per_head(C[:1]), D, before[3]
    )
    assert torch.allclose(out[0], want[0], atol=1e-5)
    assert torch.allclose(pool[3], state, atol=1e-5)
    assert torch.equal(out[1], torch.zeros(heads, dim))  # skipped
    assert torch.equal(pool[:3], before[:3])
