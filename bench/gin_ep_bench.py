"""gin_ep's DeepEP figures next to an NCCL all-to-all moving the same bytes.

    torchrun --nproc_per_node=N bench/gin_ep_bench.py [--tokens 4096] [--hidden 7168] [--topk 8]
        [--experts 64] [--ll-tokens 128] [--iters 20] [--profile]

One process per GPU (NCCL needs distinct GPUs). Per rank and mode it prints
DeepEP's figures: normal dispatch/combine in µs and GB/s (the bytes this
rank sends: one bf16 row per (token, destination rank), as DeepEP counts),
low-latency dispatch/combine in µs, each next to torch.distributed's
all_to_all_single (NCCL) moving the same bytes per peer in the same run.
gin_ep's normal-mode calls return when their work is done (they synchronize
their stream and the ranks), so their time is host wall time per call, from
the Python call to a synchronize; its low-latency calls return once their
work is queued, timed the same way (call to synchronize). NCCL's is given
both ways: CUDA-event time per call (its GPU time alone) and host wall time
measured as gin_ep's is, with gin_ep's ratio to each. Medians over --iters
calls after 3 warm-up calls. Low latency also runs as a real step does:
--iters (dispatch, combine) pairs back to back with one synchronize at the
end, next to NCCL's two all_to_all_single per pair the same way, and gin_ep's
calls between CUDA events.
--profile: rank 0 also prints, per call, the GPU time of each kernel and
copy (torch.profiler over 5 more calls, µs per call), to see where a
call's time goes.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import gin_ep


def wall(fn, iters):
    times = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def events(fn, iters):
    """GPU µs per call between CUDA events on the current stream around fn (which may return before its
    work is done: the current stream waits for it)."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for i in range(iters + 3):
        torch.cuda.synchronize()
        dist.barrier()
        ev[0].record()
        fn()
        ev[1].record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(ev[0].elapsed_time(ev[1]) * 1e3)
    return statistics.median(times)


def back_to_back(fn, iters):
    """Host wall µs per fn() over `iters` calls in a row with one synchronize at the end (3 warm-up
    rounds of that, median of 5)."""
    times = []
    for i in range(3 + 5):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) / iters)
    return statistics.median(times) * 1e6


def profile(name, fn, calls=5):
    """Rank 0 prints the GPU time per call of each kernel and copy of `fn`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    if dist.get_rank() != 0:
        return
    gpu, cpu = [], []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0 and e.self_cpu_time_total == 0:
            gpu.append((t / calls, e.count / calls, e.key))
        if e.self_cpu_time_total > 0:
            cpu.append((e.self_cpu_time_total / calls, e.count / calls, e.key))
    for what, rows in (("GPU", gpu), ("host (PyTorch ops, self time)", cpu)):
        rows.sort(reverse=True)
        print(f"-- {name}: {what} per call, {sum(r[0] for r in rows):.1f} us in all")
        for t, n, key in rows[:10]:
            print(f"   {t:9.1f} us  x{n:<5.1f} {key[:90]}")


def nccl_us(send_counts, hidden, iters, dev):
    """all_to_all_single of send_counts[r] bf16 rows of `hidden` to rank r: (GPU µs per call between
    CUDA events, host wall µs per call timed as gin_ep's calls are: from the call to a synchronize)."""
    R = len(send_counts)
    recv_counts = torch.tensor(send_counts, device=dev)
    gathered = [torch.zeros_like(recv_counts) for _ in range(R)]
    dist.all_gather(gathered, recv_counts)
    me = dist.get_rank()
    recv = [int(g[me]) for g in gathered]
    inp = torch.randn(sum(send_counts), hidden, device=dev).bfloat16()
    out = torch.empty(sum(recv), hidden, device=dev, dtype=torch.bfloat16)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = []
    for i in range(iters + 3):
        dist.barrier()
        ev[0].record()
        dist.all_to_all_single(out, inp, recv, send_counts)
        ev[1].record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(ev[0].elapsed_time(ev[1]) * 1e3)
    a2a = lambda: dist.all_to_all_single(out, inp, recv, send_counts)  # noqa: E731
    nccl_us.last = a2a
    return statistics.median(times), wall(a2a, iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--ll-tokens", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--num-sms", type=int, default=0,
                    help="Buffer.set_num_sms (DeepEP's): normal mode's channels are half of it; 0: gin picks them")
    a = ap.parse_args()
    if a.num_sms:
        gin_ep.Buffer.set_num_sms(a.num_sms)
    rank, R = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    dev = torch.device("cuda", torch.cuda.current_device())
    E, K, H = a.experts, a.topk, a.hidden
    g = torch.Generator(device=dev).manual_seed(rank)

    def routing(T):
        scores = torch.rand(T, E, device=dev, generator=g)
        idx = scores.topk(K, dim=1).indices
        w = torch.rand(T, K, device=dev, generator=g)
        return torch.randn(T, H, device=dev, generator=g).bfloat16(), idx, w

    rows = []
    # Normal mode.
    buf = gin_ep.Buffer(dist.group.WORLD, 0, 0)
    transports = " ".join(buf.transports())
    x, idx, w = routing(a.tokens)
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, E)
    state = {}

    def dispatch():
        state["d"] = buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                  num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)

    d_us = wall(dispatch, a.iters)
    recv_x, handle = state["d"][0], state["d"][4]
    c_us = wall(lambda: buf.combine(recv_x, handle), a.iters)
    if a.profile:
        # The C++ runtime's call alone, without the Python wrapper's conversions.
        idx32, wf = idx.int().contiguous(), w.float().contiguous()
        rt_us = wall(lambda: buf.runtime.dispatch(torch.cuda.current_stream().cuda_stream, x, None, idx32, wf, E, 1, 0),
                     a.iters)
        if rank == 0:
            print(f"-- normal dispatch: {d_us:.1f} us a call, {rt_us:.1f} us of it the runtime's call alone")
        profile("normal dispatch", dispatch)
        profile("normal combine", lambda: buf.combine(recv_x, handle))
    send = per_rank.tolist()
    sent_bytes = sum(send) * H * 2
    n_us = nccl_us(send, H, a.iters, dev)
    rows.append(("normal dispatch", d_us, sent_bytes, n_us))
    rows.append(("normal combine", c_us, sent_bytes, n_us))
    # Normal mode without the CPU synchronization (num_worst_tokens: every row a rank can receive), as a
    # step runs it: GPU time between CUDA events, and (dispatch, combine) pairs back to back.
    worst = R * a.tokens

    def sf_dispatch():
        state["s"] = buf.dispatch(x, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w,
                                  num_worst_tokens=worst)

    sfd_ev = events(sf_dispatch, a.iters)
    sf_x, sf_handle = state["s"][0], state["s"][4]
    sfc_ev = events(lambda: buf.combine(sf_x, sf_handle), a.iters)
    a2a_normal = nccl_us.last

    def sf_pair():
        d = buf.dispatch(x, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
        buf.combine(d[0], d[4])

    def normal_pair():
        d = buf.dispatch(x, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w)
        buf.combine(d[0], d[4])

    def nccl_normal_pair():
        a2a_normal()
        a2a_normal()

    sf_pair_us, sync_pair_us = back_to_back(sf_pair, a.iters), back_to_back(normal_pair, a.iters)
    if a.profile:
        profile("sync-free (dispatch, combine) pair", sf_pair)
    nn_pair_us = back_to_back(nccl_normal_pair, a.iters)
    # The same pairs with FP8 tokens (DeepEP's: e4m3 and a float scale per 128 channels) and a bf16
    # combine; NCCL's pair moves the FP8 rows' bytes, then the bf16 rows'.
    g8 = x.float().view(a.tokens, H // 128, 128)
    s8 = g8.abs().amax(-1).clamp(min=1e-4) / 448
    x8 = ((g8 / s8.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn).view(a.tokens, H), s8.contiguous())
    y8 = torch.zeros(worst, H, dtype=torch.bfloat16, device=dev)

    def sf8_pair():
        d = buf.dispatch(x8, num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, num_worst_tokens=worst)
        buf.combine(y8, d[4])

    sf8_pair_us = back_to_back(sf8_pair, a.iters)
    nccl_us(send, (H + H // 32) // 2, a.iters, dev)  # an FP8 row's bytes: H e4m3 values and H / 128 floats
    a2a_fp8 = nccl_us.last

    def nccl_fp8_pair():
        a2a_fp8()
        a2a_normal()

    n8_pair_us = back_to_back(nccl_fp8_pair, a.iters)
    buf.synchronize()
    buf.destroy()
    # Low-latency mode.
    ll = gin_ep.Buffer(dist.group.WORLD, 0, 0, low_latency_mode=True)
    x, idx, w = routing(a.ll_tokens)

    def ll_dispatch():
        state["l"] = ll.low_latency_dispatch(x, idx, a.ll_tokens, E, use_fp8=False)

    ld_us = wall(ll_dispatch, a.iters)
    recv_x, handle = state["l"][0], state["l"][2]
    lc_us = wall(lambda: ll.low_latency_combine(recv_x, idx, w, handle), a.iters)
    if a.profile:
        profile("low-latency dispatch", ll_dispatch)
        profile("low-latency combine", lambda: ll.low_latency_combine(recv_x, idx, w, handle))
    L = E // R
    send = torch.bincount((idx // L).flatten(), minlength=R).tolist()  # one row per (token, expert)
    ll_bytes = sum(send) * H * 2
    nl_us = nccl_us(send, H, a.iters, dev)
    rows.append(("low-latency dispatch", ld_us, ll_bytes, nl_us))
    rows.append(("low-latency combine", lc_us, ll_bytes, nl_us))
    # As a step runs them: no synchronize between calls.
    ld_ev = events(ll_dispatch, a.iters)
    lc_ev = events(lambda: ll.low_latency_combine(recv_x, idx, w, handle), a.iters)

    def ll_pair():
        d = ll.low_latency_dispatch(x, idx, a.ll_tokens, E, use_fp8=False)
        ll.low_latency_combine(d[0], idx, w, d[2])

    a2a = nccl_us.last

    def nccl_pair():
        a2a()
        a2a()

    pair_us, npair_us = back_to_back(ll_pair, a.iters), back_to_back(nccl_pair, a.iters)
    ll.destroy()
    if rank == 0:
        print(f"gin_ep vs NCCL all_to_all_single, {R} ranks, {torch.cuda.get_device_name()}, hidden {H}, "
              f"top-{K} of {E} experts; normal {a.tokens} tokens/rank, low-latency {a.ll_tokens}; "
              f"transports to ranks 0..{R - 1}: {transports}")
        print("gin_ep: host wall time per call, from the call to a synchronize; NCCL: GPU time between CUDA "
              "events, and host wall time timed as gin_ep's")
        print(f"{'call':24s} {'gin_ep us':>10s} {'GB/s':>8s} {'NCCL us':>9s} {'GB/s':>8s} {'gin/NCCL':>9s} "
              f"{'NCCL wall':>10s} {'gin/wall':>9s}")
    for name, us, b, (nus, nwall) in rows:
        if rank == 0:
            print(f"{name:24s} {us:10.1f} {b / us / 1e3:8.1f} {nus:9.1f} {b / nus / 1e3:8.1f} {us / nus:9.2f} "
                  f"{nwall:10.1f} {us / nwall:9.2f}")
    if rank == 0:
        print(f"normal mode with num_worst_tokens={worst} (no CPU synchronization), as a step runs it: gin_ep "
              f"between CUDA events: dispatch {sfd_ev:.1f} us, combine {sfc_ev:.1f} us; {a.iters} (dispatch, "
              f"combine) pairs back to back: {sf_pair_us:.1f} us a pair (without num_worst_tokens {sync_pair_us:.1f}), "
              f"NCCL (two all_to_all_single) {nn_pair_us:.1f} us, gin/NCCL {sf_pair_us / nn_pair_us:.2f}")
        print(f"the same pairs with FP8 tokens (num_worst_tokens={worst}): gin_ep {sf8_pair_us:.1f} us a pair, NCCL "
              f"(FP8 bytes, then bf16) {n8_pair_us:.1f} us, gin/NCCL {sf8_pair_us / n8_pair_us:.2f}")
        print(f"low latency as a step runs it: gin_ep between CUDA events: dispatch {ld_ev:.1f} us, combine "
              f"{lc_ev:.1f} us; {a.iters} (dispatch, combine) pairs back to back: gin_ep {pair_us:.1f} us a pair, "
              f"NCCL (two all_to_all_single) {npair_us:.1f} us, gin/NCCL {pair_us / npair_us:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
