"""gin_ep against a pure-PyTorch reference, one process per rank (ranks share
the visible GPUs round-robin). Every rank regenerates every rank's inputs
(seeded by rank), so it checks what it received row by row:

- get_dispatch_layout's counts and is_token_in_rank;
- dispatch: each received row equals its source row bit for bit, in (source
  rank, source token) order; received top-k (local ids, -1 elsewhere) and
  weights; tokens per local expert (aligned); the rank prefix matrix;
- combine (experts = identity, 0/1/2 biases) against the float reference,
  calc_diff below 1e-5 (DeepEP's measure);
- a cached dispatch of new tokens along the handle (bf16, and FP8 along an FP8 handle);
- a third normal round in which rank 0 brings more tokens than any rank
  before (every rank makes a bigger buffer in the same call);
- low-latency dispatch (rows per local expert in source order, counts,
  layout ranges, source tokens) and its weighted combine, calc_diff < 1e-5,
  with receive hooks (return_recv_hook) and without;
- FP8: a normal dispatch of (e4m3, scales) rows byte for byte and a combine
  of their dequantized rows (also with num_worst_tokens: no CPU
  synchronization, padded), and a low-latency dispatch with use_fp8
  (DeepEP's scale layout) within calc_diff 1e-3 after dequantization.

Skipped where torch, CUDA or the built module is missing. Runs under pytest
or as `python python/tests/test_gin_ep.py [ranks...]`.
"""

import os
import socket
import sys
import traceback

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
gin_ep = pytest.importorskip("gin_ep")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def calc_diff(x, y):
    x, y = x.double() + 1, y.double() + 1
    denom = (x * x + y * y).sum()
    return (1 - 2 * (x * y).sum() / denom).item()


def make_inputs(rank, T, H, E, K, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    x = (torch.rand(T, H, generator=g) * 4 - 2).bfloat16()
    scores = torch.rand(T, E, generator=g)
    idx = scores.topk(K, dim=1).indices
    idx[torch.rand(T, K, generator=g) < 0.25] = -1  # no expert
    w = torch.rand(T, K, generator=g) + 0.1
    return x, idx, w


def tokens_of(rank, rnd, tmax):
    if rnd == 2 and rank == 0:
        return tmax + 4  # more than any rank brought before: every rank makes a bigger buffer
    return max(0, tmax - (rank * 5 + rnd * 3) % 9)


def check_normal(buf, rank, R, H, E, K, tmax, dev):
    L = E // R
    for rnd in range(3):
        inputs = [make_inputs(r, tokens_of(r, rnd, tmax), H, E, K, 7 + rnd) for r in range(R)]
        x, idx, w = (t.to(dev) for t in inputs[rank])
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        ref_in_rank = torch.zeros(x.size(0), R, dtype=torch.bool)
        for t in range(x.size(0)):
            for e in inputs[rank][1][t].tolist():
                if e >= 0:
                    ref_in_rank[t, e // L] = True
        assert torch.equal(in_rank.cpu(), ref_in_rank), "is_token_in_rank"
        assert per_rank.cpu().tolist() == ref_in_rank.sum(0).tolist(), "num_tokens_per_rank"
        valid = inputs[rank][1][inputs[rank][1] >= 0]
        assert per_expert.cpu().tolist() == torch.bincount(valid, minlength=E).tolist(), "num_tokens_per_expert"

        align = 4
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            topk_idx=idx, topk_weights=w, expert_alignment=align)
        rows, want_idx, want_w, from_rank = [], [], [], []
        for r in range(R):
            sx, sidx, sw = inputs[r]
            n = 0
            for t in range(sx.size(0)):
                mine = [k for k in range(K) if sidx[t, k] >= 0 and sidx[t, k] // L == rank]
                if not mine:
                    continue
                n += 1
                rows.append(sx[t])
                want_idx.append([int(sidx[t, k]) % L if k in mine else -1 for k in range(K)])
                want_w.append([float(sw[t, k]) if k in mine else 0.0 for k in range(K)])
            from_rank.append(n)
        N = len(rows)
        assert recv_x.shape == (N, H), f"recv_x shape {tuple(recv_x.shape)}, want {(N, H)}"
        if N:
            assert torch.equal(recv_x.cpu(), torch.stack(rows)), "received rows differ from their sources"
            assert recv_idx.cpu().tolist() == want_idx, "recv_topk_idx"
            assert torch.equal(recv_w.cpu(), torch.tensor(want_w)), "recv_topk_weights"
        per_local = [0] * L
        for row in want_idx:
            for e in row:
                if e >= 0:
                    per_local[e] += 1
        assert counts == [(c + align - 1) // align * align for c in per_local], "num_recv_tokens_per_expert_list"
        prefix = handle[0].cpu()
        assert prefix[:, rank].tolist() == [sum(from_rank[: i + 1]) for i in range(R)], "rank_prefix_matrix"

        # Combine: the experts are the identity; 0, 1 or 2 biases.
        for nb in range(3):
            biases = [torch.full_like(x, 0.25 * (b + 1)) for b in range(nb)]
            bias = None if nb == 0 else (biases[0] if nb == 1 else tuple(biases))
            combined, _, ev = buf.combine(recv_x, handle, bias=bias, async_finish=nb == 1)
            assert (ev.event is not None) == (nb == 1), "an event with async_finish only (DeepEP's EventOverlap)"
            ev.current_stream_wait()
            ref = x.float() * in_rank.sum(1, keepdim=True).float()
            for b in biases:
                ref = ref + b.float()
            assert combined.shape == x.shape
            if x.numel():
                assert calc_diff(combined.float(), ref) < 1e-5, f"combine with {nb} biases"

        # A cached dispatch of new tokens along the same layout.
        x2s = [make_inputs(r, tokens_of(r, rnd, tmax), H, E, K, 99 + rnd)[0] for r in range(R)]
        recv2, _, _, _, _, _ = buf.dispatch(x2s[rank].to(dev), handle=handle)
        src_rank = torch.repeat_interleave(torch.arange(R), torch.tensor(from_rank))
        src_tok = handle[3].cpu()
        want = [x2s[int(src_rank[i])][int(src_tok[i])] for i in range(N)]
        if N:
            assert torch.equal(recv2.cpu(), torch.stack(want)), "cached dispatch rows"


def check_normal_worst(buf, rank, R, H, E, K, tmax, dev):
    """num_worst_tokens: no CPU synchronization; rows past the received ones are padding (topk_idx -1). Two
    dispatch/combine pairs queued back to back, then one captured in a CUDA graph and replayed."""
    L = E // R
    worst = R * (tmax + 4)  # check_normal left a buffer for tmax + 4 tokens

    def want_rows(inputs):
        rows, idx, from_rank = [], [], []
        for r in range(R):
            sx, sidx, _ = inputs[r]
            n = 0
            for t in range(sx.size(0)):
                mine = [k for k in range(K) if sidx[t, k] >= 0 and sidx[t, k] // L == rank]
                if mine:
                    n += 1
                    rows.append(sx[t])
                    idx.append([int(sidx[t, k]) % L if k in mine else -1 for k in range(K)])
            from_rank.append(n)
        return rows, idx, from_rank

    def check(inputs, x, in_rank, recv_x, recv_idx, counts, handle, combined):
        rows, idx, from_rank = want_rows(inputs)
        N = len(rows)
        assert recv_x.shape == (worst, H) and recv_idx.shape == (worst, K), "num_worst_tokens rows"
        assert counts == [], "no per-expert counts without the CPU synchronization"
        if N:
            assert torch.equal(recv_x[:N].cpu(), torch.stack(rows)), "received rows (num_worst_tokens)"
            assert recv_idx[:N].cpu().tolist() == idx, "recv_topk_idx (num_worst_tokens)"
        assert bool((recv_idx[N:] == -1).all()), "padding rows choose no expert"
        assert handle[0][:, rank].cpu().tolist() == [sum(from_rank[: i + 1]) for i in range(R)], "rank_prefix_matrix"
        ref = x.float() * in_rank.sum(1, keepdim=True).float()
        if x.numel():
            assert calc_diff(combined.float(), ref) < 1e-5, "combine (num_worst_tokens)"

    outs = []
    for rnd in range(2):
        inputs = [make_inputs(r, tokens_of(r, rnd, tmax), H, E, K, 31 + rnd) for r in range(R)]
        x, idx, w = (t.to(dev) for t in inputs[rank])
        _, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
        recv_x, recv_idx, _, counts, handle, _ = buf.dispatch(x, is_token_in_rank=in_rank,
                                                              num_tokens_per_expert=per_expert, topk_idx=idx,
                                                              topk_weights=w, num_worst_tokens=worst)
        combined, _, _ = buf.combine(recv_x, handle)
        outs.append((inputs, x, in_rank, recv_x, recv_idx, counts, handle, combined))
    torch.cuda.synchronize()
    for o in outs:
        check(*o)

    per_expert = torch.zeros(E, dtype=torch.int32, device=dev)

    def step(x, idx, w):
        recv_x, recv_idx, _, counts, handle, _ = buf.dispatch(x, num_tokens_per_expert=per_expert, topk_idx=idx,
                                                              topk_weights=w, num_worst_tokens=worst)
        combined, _, _ = buf.combine(recv_x, handle)
        return recv_x, recv_idx, counts, handle, combined

    def check_replay(inputs, x, idx, w, out):
        _, _, _, in_rank, _ = buf.get_dispatch_layout(idx, E)
        check(inputs, x, in_rank, *out)

    replay_graph(rank, R, H, E, K, tmax, dev, step, check_replay, seed=41)
    buf.synchronize()  # nothing left behind


def replay_graph(rank, R, H, E, K, tmax, dev, step, check, seed):
    """step(x, idx, w) captured in a CUDA graph (after a warm-up outside it), then replayed three times with
    new inputs copied into x, idx and w; check(inputs, x, idx, w, step's outputs) after each replay."""
    T = tokens_of(rank, 0, tmax)
    x, idx, w = (torch.zeros(T, H, dtype=torch.bfloat16, device=dev), torch.zeros(T, K, dtype=torch.int64, device=dev),
                 torch.zeros(T, K, device=dev))
    for src, dst in zip(make_inputs(rank, T, H, E, K, seed), (x, idx, w)):
        dst.copy_(src)
    step(x, idx, w)  # warm-up, outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode="thread_local"):
        out = step(x, idx, w)
    for rnd in range(3):
        inputs = [make_inputs(r, tokens_of(r, 0, tmax), H, E, K, seed + 10 + rnd) for r in range(R)]
        for src, dst in zip(inputs[rank], (x, idx, w)):
            dst.copy_(src)
        g.replay()
        torch.cuda.synchronize()
        check(inputs, x, idx, w, out)


def to_fp8(x):
    """DeepEP's per-token cast: e4m3 values and one float scale (amax / 448) per 128 values."""
    T, H = x.shape
    g = x.float().view(T, H // 128, 128)
    scales = g.abs().amax(-1).clamp(min=1e-4) / 448
    data = (g / scales.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn).view(T, H)
    return data, scales.contiguous()


def dequant(data, scales):
    """data [..., H] e4m3 times its scales [..., H / 128]."""
    shape = data.shape
    g = data.float().view(*shape[:-1], shape[-1] // 128, 128) * scales.float().unsqueeze(-1)
    return g.view(shape)


def check_fp8(buf, rank, R, H, E, K, tmax, dev, worst=0):
    """Normal dispatch of FP8 x: e4m3 rows and scales arrive byte for byte; a bf16 combine of the
    dequantized rows along the FP8 handle is within calc_diff 1e-3 of the reference. worst > 0: with
    num_worst_tokens (no CPU synchronization), worst rows come back, the received ones first."""
    L = E // R
    inputs = [make_inputs(r, tokens_of(r, 0, tmax), H, E, K, 41) for r in range(R)]
    fp8 = [to_fp8(inp[0]) for inp in inputs]
    x, idx, w = (t.to(dev) for t in inputs[rank])
    data, scales = (t.to(dev) for t in fp8[rank])
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    (recv, recv_scales), _, _, _, handle, _ = buf.dispatch(
        (data, scales), num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
        topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
    rows, srows = [], []
    for r in range(R):
        sidx = inputs[r][1]
        for t in range(sidx.size(0)):
            if any(int(e) >= 0 and int(e) // L == rank for e in sidx[t]):
                rows.append(fp8[r][0][t])
                srows.append(fp8[r][1][t])
    N = len(rows)
    M = worst if worst else N  # rows returned
    assert recv.dtype == torch.float8_e4m3fn and recv.shape == (M, H), "FP8 recv_x"
    assert recv_scales.shape == (M, H // 128), "FP8 recv_x scales"
    assert handle[3].numel() == M and bool((handle[3][N:] == -1).all()), "padding rows come from no token"
    recv, recv_scales = recv[:N], recv_scales[:N]
    if N:
        assert torch.equal(recv.cpu().view(torch.uint8), torch.stack(rows).view(torch.uint8)), "FP8 rows"
        assert torch.equal(recv_scales.cpu(), torch.stack(srows)), "FP8 scales"
    y = torch.zeros(M, H, dtype=torch.bfloat16, device=dev)
    y[:N] = dequant(recv, recv_scales).bfloat16()
    combined, _, _ = buf.combine(y, handle)
    ref = x.float() * in_rank.sum(1, keepdim=True).float()
    if x.numel():
        assert calc_diff(combined.float(), ref) < 1e-3, "combine of dequantized FP8 rows"

    # A cached dispatch of new FP8 tokens along the FP8 handle: bytes and scales in the handle's order.
    fp8b = [to_fp8(make_inputs(r, tokens_of(r, 0, tmax), H, E, K, 47)[0]) for r in range(R)]
    data2, scales2 = (t.to(dev) for t in fp8b[rank])
    (recv2, rscales2), _, _, _, _, _ = buf.dispatch((data2, scales2), handle=handle)
    src_rank = torch.repeat_interleave(torch.arange(R), torch.tensor([len([1 for t in range(inputs[r][1].size(0))
                                       if any(int(e) >= 0 and int(e) // L == rank for e in inputs[r][1][t])])
                                       for r in range(R)]))
    src_tok = handle[3].cpu()
    assert recv2.dtype == torch.float8_e4m3fn and recv2.shape == (M, H) and rscales2.shape == (M, H // 128)
    recv2, rscales2 = recv2[:N], rscales2[:N]
    if N:
        want = torch.stack([fp8b[int(src_rank[i])][0][int(src_tok[i])] for i in range(N)])
        wants = torch.stack([fp8b[int(src_rank[i])][1][int(src_tok[i])] for i in range(N)])
        assert torch.equal(recv2.cpu().view(torch.uint8), want.view(torch.uint8)), "cached FP8 rows"
        assert torch.equal(rscales2.cpu(), wants), "cached FP8 scales"


def check_low_latency_fp8(buf, rank, R, H, E, K, tmax, dev):
    """use_fp8: the rows arrive quantized (DeepEP's scale layout), dequantized within calc_diff 1e-3."""
    L = E // R
    inputs = [make_inputs(r, tokens_of(r, 0, tmax), H, E, K, 43) for r in range(R)]
    x, idx, w = (t.to(dev) for t in inputs[rank])
    (recv, scales), count, handle, _, _ = buf.low_latency_dispatch(x, idx, tmax, E, use_fp8=True)
    rows = R * tmax
    assert recv.dtype == torch.float8_e4m3fn and recv.shape == (L, rows, H), "FP8 packed_recv_x"
    assert scales.shape == (L, rows, H // 128) and scales.stride() == (H // 128 * rows, 1, rows), "scale layout"
    got, want = [], []
    for el in range(L):
        n = 0
        for r in range(R):
            sx, sidx, _ = inputs[r]
            for t in range(sx.size(0)):
                if (sidx[t] == rank * L + el).any():
                    got.append(dequant(recv[el, n], scales[el, n]).cpu())
                    want.append(sx[t].float())
                    n += 1
        assert int(count[el]) == n, "FP8 recv_count"
    if got:
        assert calc_diff(torch.stack(got), torch.stack(want)) < 1e-3, "dequantized FP8 rows"


def check_ll_dispatched(rank, R, L, inputs, recv_x, count, handle):
    """A low-latency dispatch's rows, layout ranges and counts against every rank's inputs."""
    src_info, layout = handle[0].cpu(), handle[1].cpu()
    for el in range(L):
        begin = 0
        for r in range(R):
            sx, sidx, _ = inputs[r]
            toks = [t for t in range(sx.size(0)) if (sidx[t] == rank * L + el).any()]
            assert int(layout[el, r]) == (begin << 32 | len(toks)), "layout range"
            for q, t in enumerate(toks):
                assert int(src_info[el, begin + q]) == t, "source token"
                assert torch.equal(recv_x[el, begin + q].cpu(), sx[t]), "received row"
            begin += len(toks)
        assert int(count[el]) == begin, "recv_count"


def check_ll_combined(x, idx, w, combined):
    """The experts were the identity: each token comes back as sum of its choices' weights x itself."""
    ref = ((idx >= 0).float() * w).sum(1, keepdim=True) * x.float()
    if x.numel():
        assert calc_diff(combined.float(), ref) < 1e-5, "low-latency combine"


def check_low_latency(buf, rank, R, H, E, K, tmax, dev):
    """Round 0 with receive hooks (return_recv_hook: the call queues its sends, the hook the receive; a
    call before the hook is refused on every rank), round 1 without, its experts' outputs written into the
    zero-copy combine buffer (x given to the combine is NaN); the per-expert receive stats."""
    L = E // R
    for rnd in range(2):
        inputs = [make_inputs(r, tokens_of(r, rnd, tmax), H, E, K, 31 + rnd) for r in range(R)]
        x, idx, w = (t.to(dev) for t in inputs[rank])
        hooks = rnd == 0
        stats = torch.zeros(L, dtype=torch.int32, device=dev)
        recv_x, count, handle, _, hook = buf.low_latency_dispatch(x, idx, tmax, E, use_fp8=False,
                                                                  cumulative_local_expert_recv_stats=stats,
                                                                  return_recv_hook=hooks)
        if hooks:
            try:
                buf.low_latency_combine(recv_x, idx, w, handle)
                raise AssertionError("a call before the dispatch's receive hook was accepted")
            except ValueError as e:
                assert "receive" in str(e), str(e)
            hook()
        else:
            assert hook is None
        check_ll_dispatched(rank, R, L, inputs, recv_x, count, handle)
        assert torch.equal(stats.cpu(), count.cpu()), "cumulative_local_expert_recv_stats"
        if hooks:
            combined, _, hook = buf.low_latency_combine(recv_x, idx, w, handle, return_recv_hook=True)
            hook()
        else:
            zbuf = buf.get_next_low_latency_combine_buffer(handle)
            assert zbuf.shape == (L, R * tmax, H) and zbuf.dtype == torch.bfloat16, "combine buffer's shape"
            zbuf.copy_(recv_x)
            nan = torch.full_like(recv_x, float("nan"))
            combined, _, _ = buf.low_latency_combine(nan, idx, w, handle, zero_copy=True)
        check_ll_combined(x, idx, w, combined)


def check_low_latency_queued(buf, rank, R, H, E, K, tmax, dev):
    """Calls that return before their work is done, queued with nothing read in between (two dispatches
    in flight, then their combines, then alternating), on a stream of the caller's own; checked after.
    Odd rounds pass their top-k indices as int32, even rounds as torch.topk makes them (int64)."""
    L = E // R
    n_tokens = lambda r, rnd: max(0, tmax - (r * 5 + rnd * 3) % 9)  # noqa: E731
    rounds = [[make_inputs(r, n_tokens(r, rnd), H, E, K, 51 + rnd) for r in range(R)] for rnd in range(5)]
    mine = [tuple(t.to(dev) for t in rnd[rank]) for rnd in rounds]
    mine = [(x, idx.int() if n % 2 else idx, w) for n, (x, idx, w) in enumerate(mine)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = {}
    with torch.cuda.stream(side):
        for op in ["d0", "d1", "c0", "c1", "d2", "c2", "d3", "d4", "c3", "c4"]:
            n = int(op[1])
            x, idx, w = mine[n]
            if op[0] == "d":
                recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, tmax, E, use_fp8=False)
                got[n] = [recv_x, count, handle]
            else:
                got[n].append(buf.low_latency_combine(got[n][0], idx, w, got[n][2])[0])
    side.synchronize()
    for n in range(5):
        recv_x, count, handle, combined = got[n]
        check_ll_dispatched(rank, R, L, rounds[n], recv_x, count, handle)
        check_ll_combined(*mine[n], combined)


def check_low_latency_graph(buf, rank, R, H, E, K, tmax, dev):
    """A (dispatch, combine) pair captured in a CUDA graph and replayed with new inputs copied in."""
    L = E // R

    def step(x, idx, w):
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, tmax, E, use_fp8=False)
        combined, _, _ = buf.low_latency_combine(recv_x, idx, w, handle)
        return recv_x, count, handle, combined

    def check(inputs, x, idx, w, out):
        recv_x, count, handle, combined = out
        check_ll_dispatched(rank, R, L, inputs, recv_x, count, handle)
        check_ll_combined(x, idx, w, combined)

    replay_graph(rank, R, H, E, K, tmax, dev, step, check, seed=61)


def rank_main(rank, R, port, H, errors):
    try:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=R)
        dev = torch.device("cuda", torch.cuda.current_device())
        E, K = 4 * R, min(4, 4 * R)
        buf = gin_ep.Buffer(dist.group.WORLD, 0, 0)
        check_normal(buf, rank, R, H, E, K, 23, dev)
        check_normal_worst(buf, rank, R, H, E, K, 23, dev)
        check_fp8(buf, rank, R, H, E, K, 23, dev)
        check_fp8(buf, rank, R, H, E, K, 23, dev, worst=R * (23 + 4))
        buf.destroy()
        ll = gin_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True)
        check_low_latency(ll, rank, R, H, E, K, 17, dev)
        check_low_latency_fp8(ll, rank, R, H, E, K, 17, dev)
        check_low_latency_queued(ll, rank, R, H, E, K, 17, dev)
        ll.synchronize()  # nothing left behind
        check_low_latency_graph(ll, rank, R, H, E, K, 17, dev)
        # Another num_max_dispatch_tokens_per_rank: a new buffer on the same communicator, whose
        # signals start from zero again.
        check_low_latency(ll, rank, R, H, E, K, 13, dev)
        ll.destroy()
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        raise


def run(R, H):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=rank_main, args=(r, R, port, H, errors)) for r in range(R)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():
            p.kill()
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs and all(p.exitcode == 0 for p in procs), "\n".join(msgs) or "a rank did not finish"


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("hidden", [256, 7168])
def test_gin_ep(ranks, hidden):
    run(ranks, hidden)


if __name__ == "__main__":
    for R in [int(a) for a in sys.argv[1:]] or [1, 2, 4]:
        for H in (256, 7168):
            run(R, H)
            print(f"ok: {R} ranks, hidden {H}", flush=True)
