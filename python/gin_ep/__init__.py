"""gin_ep: DeepEP's Buffer on gin (no NVSHMEM).

    import gin_ep as deep_ep          # instead of: import deep_ep
    buffer = deep_ep.Buffer(group, num_nvl_bytes, 0)
    num_tokens_per_rank, _, num_tokens_per_expert, is_token_in_rank, _ = \
        buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event = \
        buffer.dispatch(x, num_tokens_per_rank=num_tokens_per_rank, is_token_in_rank=is_token_in_rank,
                        num_tokens_per_expert=num_tokens_per_expert, topk_idx=topk_idx, topk_weights=topk_weights)
    combined_x, _, event = buffer.combine(expert_outputs, handle)

What differs from DeepEP (docs/ep.md says more): FP8 scales float32 (no
round_scale / use_ue8m0). As DeepEP's, a call returns once its work is
queued and the current stream waits for it (a normal dispatch without
num_worst_tokens first synchronizes once, for its receive count;
async_finish is accepted; with return_recv_hook the call queues its sends
only and the hook queues the receive, to be called on every rank before
the buffer's next call); an error found on the GPU after a call returned
(a bad expert index of a low-latency call, a wait that gave up) is raised
by the next call or synchronize(); the buffer sizes (num_nvl_bytes, num_rdma_bytes)
are not used: gin sizes its buffer from the calls' shapes; combine's
returned top-k weights are the dispatch's weights where the choice had an
expert (the weights are not sent back).
"""

import os

import torch
import torch.distributed as dist

from . import _C

__all__ = ["Buffer", "Config", "EventOverlap"]


class EventOverlap:
    """DeepEP's EventOverlap: a CUDA event (and tensors to keep alive)."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.current_stream_wait()


class Config:
    """DeepEP's Config (accepted; gin's channels: num_sms // 2 after Buffer.set_num_sms, else chosen
    for the GPU)."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
                 num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256):
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        return num_ranks * (self.num_sms // 2) * self.num_max_nvl_chunked_recv_tokens * (hidden_bytes + 256)

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        return 0


class _GinHandle:
    """The last element of a handle: gin's own (a capsule) and the dispatch's routing."""

    __slots__ = ("capsule", "topk_idx", "topk_weights")

    def __init__(self, capsule, topk_idx=None, topk_weights=None):
        self.capsule = capsule
        self.topk_idx = topk_idx
        self.topk_weights = topk_weights


def _indices(topk_idx):
    """Top-k indices as the calls take them: int64 (DeepEP's, torch.topk's) or int32, as they
    are when contiguous (no copy); else as int64."""
    if topk_idx.dtype in (torch.int64, torch.int32) and topk_idx.is_contiguous():
        return topk_idx
    return topk_idx.long().contiguous()


def _event(async_finish):
    """As DeepEP's: an event on the current stream with async_finish, else none (the current stream
    already waits for gin's work: every call's is ordered before what the stream runs next)."""
    if not async_finish:
        return EventOverlap()
    e = torch.cuda.Event()
    e.record(torch.cuda.current_stream())
    return EventOverlap(e)


def _stream():
    return torch.cuda.current_stream().cuda_stream


class Buffer:
    """DeepEP's Buffer (version 1 API) over gin. Collective: every rank of
    `group` makes it and calls its methods in the same order."""

    num_sms = 20
    _num_sms_set = False  # until set_num_sms, gin picks its channels for the GPU

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False, use_fabric=False,
                 explicitly_destroy=False, enable_shrink=False, comm=None):
        self.group = group
        self.rank = group.rank()
        self.group_size = group.size()
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        # Rank 0 of the group makes the rendezvous id; the group carries it.
        ids = [_C.unique_id() if self.rank == 0 else None]
        dist.broadcast_object_list(ids, src=dist.get_global_rank(group, 0), group=group)
        channels = max(1, Buffer.num_sms // 2) if Buffer._num_sms_set else 0
        self.runtime = _C.Runtime(ids[0], self.rank, self.group_size, torch.cuda.current_device(),
                                  low_latency_mode, channels)

    def destroy(self):
        self.runtime = None

    def synchronize(self):
        """gin's (not DeepEP's): waits for the buffer's GPU work and raises what an earlier call left
        behind (a bad expert index, a wait that gave up), which is otherwise raised by the next call."""
        self.runtime.synchronize()

    def transports(self):
        """Per peer, the transport gin chose (lsa, proxy or ibgda)."""
        return self.runtime.transports().split()

    @staticmethod
    def set_num_sms(new_num_sms):
        assert new_num_sms % 2 == 0, "the number of SMs must be even"
        Buffer.num_sms = new_num_sms
        Buffer._num_sms_set = True

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts):
        # gin's low-latency rings: [local expert][rank][token] slots of 16 + 2 * hidden bytes, and the
        # combine rows; for sizing only (gin allocates its own).
        return num_experts * num_max_dispatch_tokens_per_rank * (16 + 2 * hidden) * 2

    # ---- normal mode ---------------------------------------------------------------------------

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """Returns (num_tokens_per_rank, None, num_tokens_per_expert, is_token_in_rank, event)."""
        if previous_event is not None:
            previous_event.current_stream_wait()
        R = self.group_size
        L = num_experts // R
        valid = topk_idx >= 0
        per_expert = torch.bincount(topk_idx[valid].long(), minlength=num_experts).int()
        ranks = torch.where(valid, topk_idx.long() // L, torch.zeros_like(topk_idx, dtype=torch.long))
        hit = torch.nn.functional.one_hot(ranks, R).bool() & valid.unsqueeze(-1)
        is_token_in_rank = hit.any(dim=1)
        per_rank = is_token_in_rank.sum(dim=0).int()
        return per_rank, None, per_expert, is_token_in_rank, _event(async_finish)

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False):
        """Returns (recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, handle, event);
        recv_topk_idx has topk_idx's dtype (int64, DeepEP's; or int32 where a contiguous int32 topk_idx was
        given, where DeepEP returns int64), written so by the unpack.
        The handle: (rank_prefix_matrix, None, None, recv_src_idx, is_token_in_rank, None, gin's handle)."""
        scales = None
        if isinstance(x, tuple):  # FP8: (e4m3 [T][H], float scales [T][H / 128])
            x, scales = x
            if x.dtype != torch.float8_e4m3fn or scales.dtype != torch.float32:
                raise ValueError("gin_ep: FP8 x is (float8_e4m3fn [tokens][hidden], float32 [tokens][hidden / 128])")
        if previous_event is not None:
            previous_event.current_stream_wait()
        if handle is not None:  # a cached dispatch: bf16 or FP8 x along the handle's layout
            out = self.runtime.cached_dispatch(_stream(), x, scales, handle[-1].capsule)
            return out[0], None, None, None, handle, _event(async_finish)
        if topk_idx is None or topk_weights is None or num_tokens_per_expert is None:
            raise ValueError("gin_ep: dispatch without a handle needs topk_idx, topk_weights and "
                             "num_tokens_per_expert (from get_dispatch_layout)")
        num_experts = num_tokens_per_expert.numel()
        # num_worst_tokens > 0: no CPU synchronization (gin's sync-free dispatch): num_worst_tokens rows come
        # back, the received ones first; the rest have topk_idx -1, weight 0, unspecified x and source -1.
        # More rows than num_worst_tokens on a rank stop every rank (the next call or synchronize raises).
        recv_x, recv_idx, recv_w, per_expert, prefix, src_rank, src_token, gin_handle = self.runtime.dispatch(
            _stream(), x, scales, _indices(topk_idx), topk_weights.float().contiguous(), num_experts,
            expert_alignment, int(num_worst_tokens))
        if num_worst_tokens > 0:
            per_expert = []
        handle = (prefix, None, None, src_token, is_token_in_rank, None,
                  _GinHandle(gin_handle, topk_idx, topk_weights))
        return recv_x, recv_idx, recv_w, per_expert, handle, _event(async_finish)

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        """Returns (combined_x, combined_topk_weights, event): per token the sum of the rows its
        experts' ranks sent back, plus the biases (bias: a tensor or a pair of them)."""
        if previous_event is not None:
            previous_event.current_stream_wait()
        b0 = b1 = None
        if isinstance(bias, tuple):
            b0, b1 = bias
        else:
            b0 = bias
        n = handle[3].numel()
        if x.size(0) != n or not x.is_contiguous():  # a sync-free dispatch's padding rows go nowhere
            x = x[:n].contiguous()
        combined = self.runtime.combine(_stream(), x, handle[-1].capsule, b0, b1)
        combined_w = None
        if topk_weights is not None:
            idx, w = handle[-1].topk_idx, handle[-1].topk_weights
            combined_w = torch.where(idx >= 0, w.float(), torch.zeros_like(w, dtype=torch.float))
        return combined, combined_w, _event(async_finish)

    # ---- low-latency mode ----------------------------------------------------------------------

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,
                             return_recv_hook=False):
        """Returns (recv_x, recv_count, handle, event, hook); recv_x [local experts][ranks x max tokens][hidden].
        The handle: (recv_src_info, recv_layout_range, num_max_dispatch_tokens_per_rank, hidden, num_experts,
        gin's handle)."""
        if use_fp8 and (round_scale or use_ue8m0):
            raise NotImplementedError("gin_ep: FP8 with round_scale or use_ue8m0 is not implemented yet; gin's "
                                      "scales are amax / 448 in float32")
        recv_x, count, layout, src_info, gin_handle = self.runtime.low_latency_dispatch(
            _stream(), x, _indices(topk_idx), num_max_dispatch_tokens_per_rank, num_experts,
            self.group_size, use_fp8, return_recv_hook)
        handle = (src_info, layout, num_max_dispatch_tokens_per_rank, x.size(1), num_experts,
                  _GinHandle(gin_handle))

        def received():
            if cumulative_local_expert_recv_stats is not None:
                cumulative_local_expert_recv_stats.add_(count)

        return recv_x, count, handle, _event(async_finish), self._hook(return_recv_hook, received)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False, zero_copy=False,
                            async_finish=False, return_recv_hook=False, out=None):
        """Returns (combined_x, event, hook): per token the sum over its choices of weight x row.
        zero_copy: the experts' outputs are in get_next_low_latency_combine_buffer(handle) (x gives the shape
        only, as DeepEP's)."""
        idx, w = _indices(topk_idx), topk_weights.float().contiguous()
        y = self.get_next_low_latency_combine_buffer(handle) if zero_copy else x.contiguous()
        combined = self.runtime.low_latency_combine(_stream(), y, idx, w, handle[-1].capsule, return_recv_hook)

        def received():
            if out is not None:
                out.copy_(combined)

        # The sum reads the top-k indices and weights when the hook runs: the hook keeps them.
        hook = self._hook(return_recv_hook, received, keep=(idx, w))
        return (combined if out is None else out), _event(async_finish), hook

    def _hook(self, deferred, received, keep=None):
        """Not deferred: runs received() now and returns None. Deferred (return_recv_hook): the call queued
        its sends only; returns the hook, which queues the receive (on the stream current when it is called)
        and then runs received(). Call it, on every rank, before the buffer's next call."""
        if not deferred:
            received()
            return None

        def hook():
            self.runtime.receive(_stream())
            received()

        hook.inputs = keep
        return hook

    def get_next_low_latency_combine_buffer(self, handle):
        """DeepEP's zero-copy combine buffer: [local experts][ranks x max tokens][hidden] bf16 in the buffer's
        own memory, where gin stages the rows it puts to peers it cannot store to. Write the experts' outputs
        there after the dispatch that made `handle` has received (on the current stream after the call, or
        after its hook), then call low_latency_combine(..., zero_copy=True): they go out with no copy. Valid
        until the buffer is destroyed or a low-latency dispatch with another num_max_dispatch_tokens_per_rank
        or shape replaces it."""
        _, _, tmax, hidden, num_experts, gh = handle
        return self.runtime.low_latency_combine_buffer(gh.capsule, num_experts // self.group_size,
                                                       self.group_size * tmax, hidden)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """Nothing to clean: gin's low-latency signals count calls (no reset), and the ring's two halves are
        reused by call parity once every rank has read them."""
        return None
