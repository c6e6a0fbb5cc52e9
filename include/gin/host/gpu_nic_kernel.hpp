// gin/host/gpu_nic_kernel.hpp — the GPU NIC's kernel and the types it shares
// with its host side (gin/host/gpu_nic.hpp, which says what the NIC does and
// the rule it keeps; docs/design/gpu-nic.md). The kernel is compiled in every
// translation unit nvcc compiles (GIN_GPU_NIC=0 leaves it out); each such
// unit registers its launcher, so host code needs no nvcc of its own.
#pragma once

#include "gin/core/atomic.hpp"
#include "gin/core/config.hpp"
#include "gin/device/mlx5/wqe.hpp"

#if GIN_WITH_CUDA
#include <cuda_runtime_api.h>

namespace gin {
namespace gpunic {

// A QP as the GPU NIC sees it: device addresses.
struct Qp {
  uint8_t* sq;
  const uint32_t* dbrec;
  mlx5::Cqe64* cq;
  const uint32_t* cqDbrec;
  uint32_t nWqe, nCqe, qpn;
  int32_t peer;  // whose regions its rkeys resolve against
};
// The serving warp's per-QP state (device memory).
struct QpState {
  unsigned long long pi, cqPi;
  unsigned failed, pad;
};
// A memory region: (peer, key) -> [addr, addr + bytes) at `map` here. Peer -1: local (lkeys).
struct Region {
  unsigned long long addr, bytes, map;
  unsigned key;
  int peer;
  unsigned state;  // kEmpty, kLive, kRemoved (keeps probe chains intact)
  unsigned pad;
};
inline constexpr unsigned kEmpty = 0, kLive = 1, kRemoved = 2;
// Host <-> NIC words (mapped host memory).
struct Control {
  unsigned stop;          // host: end the kernel once idle
  unsigned startedEpoch;  // the kernel: every CTA of launch `epoch` started
  unsigned exitedEpoch;   // the kernel: every CTA of launch `epoch` ended (consumed[] written)
  unsigned pad;
};
// Kernel state in device memory, reset by the last CTA to end.
struct GridState {
  unsigned started, exited, idleVotes, exiting;
};
struct Params {
  const Qp* qps;
  QpState* st;
  unsigned* consumed;  // mapped host memory, per QP: WQEs consumed mod 2^32 (written as the kernel ends)
  unsigned* failed;    // mapped host memory, per QP: 1 once in error
  int nQps;
  const Region* regions;  // device memory, nSlots (a power of two)
  unsigned nSlots;
  Control* ctl;                 // mapped host memory
  GridState* grid;              // device memory
  unsigned long long* counts;   // mapped host memory, per warp: [executed, errors]
  unsigned sink;
  unsigned epoch;
  unsigned long long idleExitNs;  // 0: never
};

GIN_HD inline unsigned regionSlot(int peer, unsigned key, unsigned nSlots) {
  unsigned h = key * 0x9E3779B1u ^ unsigned(peer + 1) * 0x85EBCA77u;
  return (h ^ (h >> 15)) & (nSlots - 1);
}

inline constexpr int kThreads = 128;  // per CTA: 4 warps

using Launcher = cudaError_t (*)(const Params&, int ctas, cudaStream_t);
// Set by every translation unit nvcc compiles (the kernel needs nvcc), unless
// it defines GIN_GPU_NIC=0 (the kernel costs each unit about a second of ptxas).
inline Launcher launcher = nullptr;

#ifndef GIN_GPU_NIC
#define GIN_GPU_NIC 1
#endif
#if defined(__CUDACC__) && GIN_GPU_NIC
namespace kernel {
__device__ inline unsigned long long globalNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ inline char* resolve(const Params& p, int peer, unsigned key, unsigned long long addr,
                                unsigned long long bytes) {
  unsigned h = regionSlot(peer, key, p.nSlots);
  for (unsigned k = 0; k < p.nSlots; ++k, h = (h + 1) & (p.nSlots - 1)) {
    const Region* r = p.regions + h;
    const unsigned state = __ldcg(&r->state);
    if (state == kEmpty) return nullptr;
    if (state != kLive || __ldcg(&r->key) != key || __ldcg(&r->peer) != peer) continue;
    const unsigned long long a = __ldcg(&r->addr), b = __ldcg(&r->bytes);
    if (addr < a || addr - a > b || bytes > b - (addr - a)) return nullptr;
    return reinterpret_cast<char*>(__ldcg(&r->map)) + (addr - a);
  }
  return nullptr;
}

// resolve() by lane 0, the answer to every lane (so the warp never diverges
// on a region update that lands between two lanes' reads).
__device__ inline char* resolveUniform(const Params& p, int peer, unsigned key, unsigned long long addr,
                                       unsigned long long bytes, int lane) {
  unsigned long long r = 0;
  if (lane == 0) r = reinterpret_cast<unsigned long long>(resolve(p, peer, key, addr, bytes));
  return reinterpret_cast<char*>(__shfl_sync(0xffffffffu, r, 0));
}

// The warp copies n bytes (sources read from L2: a producer on another SM wrote them).
__device__ inline void warpCopy(char* dst, const char* src, unsigned n, int lane) {
  if (((reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const unsigned head = unsigned(min(uintptr_t(n), (16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15));
    for (unsigned i = lane; i < head; i += 32) dst[i] = __ldcg(src + i);
    const unsigned n16 = (n - head) / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src + head);
    uint4* d = reinterpret_cast<uint4*>(dst + head);
    for (unsigned i = lane; i < n16; i += 32) d[i] = __ldcg(s + i);
    for (unsigned i = head + n16 * 16 + lane; i < n; i += 32) dst[i] = __ldcg(src + i);
  } else {
    for (unsigned i = lane; i < n; i += 32) dst[i] = __ldcg(src + i);
  }
}

// Lane 0: CQE `cqIndex` of QP q for WQE `pi`; the last word last, with
// release: at system scope when the WQEs had effects (the CQE body, and
// every effect of the WQE: stores of every lane, ordered before by the
// caller's __syncwarp, first; a peer GPU's memory among them); at GPU scope
// for the sink, whose CQEs say nothing about memory beyond themselves (the
// poller runs on this GPU).
__device__ inline void writeCqe(const Qp& q, unsigned long long cqIndex, unsigned long long pi, uint8_t syndrome,
                                uint8_t wqeOpcode, bool err, bool effects = true) {
  mlx5::Cqe64 c;
  mlx5::fillCqe(c, uint16_t(pi), q.qpn, 0, err ? syndrome : 0, 0, err ? wqeOpcode : 0);
  c.b[mlx5::kCqeOpOwn] =
      mlx5::makeOpOwn(err ? mlx5::kCqeReqErr : mlx5::kCqeReq, mlx5::cqeExpectedOwner(cqIndex, q.nCqe));
  unsigned words[16];
  __builtin_memcpy(words, c.b, 64);
  unsigned* e = reinterpret_cast<unsigned*>(q.cq + (cqIndex & (q.nCqe - 1)));
  for (int i = 0; i < 15; ++i) e[i] = words[i];
  if (effects)
    atomicStore<Scope::System>(e + 15, words[15], MemoryOrder::Release);
  else
    atomicStore<Scope::Device>(e + 15, words[15], MemoryOrder::Release);
}

// Serve one QP for one pass: returns the WQEs consumed. Warp-uniform.
__device__ inline unsigned serve(const Params& p, int qi, int lane, unsigned long long& executed,
                                 unsigned long long& errors, unsigned long long* myCounts) {
  const Qp q = p.qps[qi];
  QpState* s = p.st + qi;
  // The warp's state and both doorbell records in one memory round trip
  // (independent loads), then one fence: acquire for the records (the
  // producers and the poller release them, at GPU scope: they run on this GPU).
  const unsigned failedQp = __ldcg(&s->failed);
  unsigned long long pi = __ldcg(&s->pi), cqPi = __ldcg(&s->cqPi);
  unsigned dbr = 0, cqci = 0;
  if (lane == 0) {
    dbr = atomicLoad<Scope::System>(q.dbrec + mlx5::kDbrSend, MemoryOrder::Relaxed);
    cqci = atomicLoad<Scope::System>(q.cqDbrec, MemoryOrder::Relaxed);
    fence<Scope::Device>();
  }
  if (failedQp) return 0;
  __syncwarp();
  dbr = __shfl_sync(0xffffffffu, dbr, 0);
  cqci = __shfl_sync(0xffffffffu, cqci, 0);
  const uint16_t pi16 = uint16_t(mlx5::bswap32(dbr));
  const unsigned avail = uint16_t(pi16 - uint16_t(pi));
  if (avail == 0) return 0;
  const unsigned ci = mlx5::bswap32(cqci) & 0xffffffu;
  unsigned room = q.nCqe - ((unsigned(cqPi) - ci) & 0xffffffu);
  unsigned did = 0;
  bool failed = false;
  const auto fail = [&](uint8_t syndrome, uint8_t op) {
    if (lane == 0) {
      myCounts[1] = ++errors;
      writeCqe(q, cqPi, pi, syndrome, op, true);
    }
    ++cqPi, ++pi, ++did;
    failed = true;
  };
  if (avail > q.nWqe) {
    // The producer index ran more than a queue ahead: fail, as the host NIC does.
    if (room) fail(mlx5::kSynLocalQpOpErr, mlx5::kOpNop);
  } else if (p.sink) {
    // Sink: every WQE available, 32 at a time: lane k completes WQE pi + k,
    // with a CQE if it asks for one (its control segment is all that is
    // read); nothing runs.
    while (did < avail) {
      const unsigned m = min(avail - did, 32u);
      bool want = false;
      if (unsigned(lane) < m) {
        const unsigned long long w1 = __ldcg(reinterpret_cast<const unsigned long long*>(
                                                 q.sq + ((pi + unsigned(lane)) & (q.nWqe - 1)) * mlx5::kSendWqeBB) +
                                             1);
        want = ((w1 >> 24) & mlx5::kCtrlCqUpdate) != 0;  // fm_ce_se is byte 11 of the WQE
      }
      unsigned wants = __ballot_sync(0xffffffffu, want);
      unsigned take = m;
      if (unsigned(__popc(wants)) > room) {
        // CQ room for the first `room` CQEs only: stop before the next one.
        unsigned rest = wants;
        for (unsigned r = 0; r < room; ++r) rest &= rest - 1;
        take = unsigned(__ffs(int(rest)) - 1);
        wants &= (1u << take) - 1;
      }
      if (lane == 0) myCounts[0] = executed + take;
      __syncwarp();
      if (unsigned(lane) < take && want)
        writeCqe(q, cqPi + unsigned(__popc(wants & ((1u << lane) - 1))), pi + unsigned(lane), 0, 0, false, false);
      executed += take;
      room -= unsigned(__popc(wants));
      pi += take, cqPi += unsigned(__popc(wants)), did += take;
      if (take < m) break;  // the CQ is full
    }
  } else {
    for (unsigned k = 0; k < avail && k < 64 && !failed; ++k) {
      // One 64-byte WQE: lanes 0-7 load a word each (from L2), then every lane has all of it.
      unsigned long long mine = 0;
      const unsigned long long* slot =
          reinterpret_cast<const unsigned long long*>(q.sq + (pi & (q.nWqe - 1)) * mlx5::kSendWqeBB);
      if (lane < 8) mine = __ldcg(slot + lane);
      unsigned long long w[8];
      for (int j = 0; j < 8; ++j) w[j] = __shfl_sync(0xffffffffu, mine, j);
      const mlx5::WqeRequest r = mlx5::decodeWqe(reinterpret_cast<const uint8_t*>(w), uint16_t(pi), q.qpn);
      const bool cqe = r.kind == mlx5::WqeRequest::Bad || r.wantCqe;
      if (cqe && room == 0) break;  // wait for the poller to free CQ entries
      uint8_t syndrome = 0;
      switch (r.kind) {
        case mlx5::WqeRequest::Bad: syndrome = r.syndrome; break;
        case mlx5::WqeRequest::Nop: break;
        case mlx5::WqeRequest::WriteInline: {
          char* dst = resolveUniform(p, q.peer, r.rkey, r.raddr, r.bytes, lane);
          if (!dst) {
            syndrome = mlx5::kSynRemoteAccessErr;
            break;
          }
          __syncwarp();
          if (lane == 0) {
            const uint8_t* bytes = reinterpret_cast<const uint8_t*>(w) + mlx5::kInlinePayloadOffset;
            if (r.bytes == 8 && (r.raddr & 7) == 0) {
              // An aligned 8-byte write (SignalSet): one store, release at
              // system scope, after every earlier WQE's payload.
              unsigned long long v;
              __builtin_memcpy(&v, bytes, 8);
              atomicStore<Scope::System>(reinterpret_cast<unsigned long long*>(dst), v, MemoryOrder::Release);
            } else {
              for (unsigned i = 0; i < r.bytes; ++i) dst[i] = char(bytes[i]);
            }
          }
          break;
        }
        case mlx5::WqeRequest::Write: {
          const char* src = resolveUniform(p, -1, r.lkey, r.laddr, r.bytes, lane);
          if (!src) {
            syndrome = mlx5::kSynLocalProtErr;
            break;
          }
          char* dst = resolveUniform(p, q.peer, r.rkey, r.raddr, r.bytes, lane);
          if (!dst) {
            syndrome = mlx5::kSynRemoteAccessErr;
            break;
          }
          warpCopy(dst, src, r.bytes, lane);
          break;
        }
        case mlx5::WqeRequest::FetchAdd:
        case mlx5::WqeRequest::CompareSwap: {
          char* ret = resolveUniform(p, -1, r.lkey, r.laddr, 8, lane);
          if (!ret) {
            syndrome = mlx5::kSynLocalProtErr;
            break;
          }
          if (r.raddr & 7) {
            syndrome = mlx5::kSynRemoteInvalReqErr;
            break;
          }
          char* dst = resolveUniform(p, q.peer, r.rkey, r.raddr, 8, lane);
          if (!dst) {
            syndrome = mlx5::kSynRemoteAccessErr;
            break;
          }
          __syncwarp();  // every lane's earlier payload stores come first
          if (lane == 0) {
            unsigned long long* word = reinterpret_cast<unsigned long long*>(dst);
            unsigned long long old;
            // AcqRel at system scope: earlier WQEs' payload is visible before
            // the new value (the signal-after-payload rule at the target).
            if (r.kind == mlx5::WqeRequest::FetchAdd) {
              old = atomicFetchAdd<Scope::System>(word, (unsigned long long)r.swapAdd, MemoryOrder::AcqRel);
            } else {
              old = r.compare;
              (void)atomicCompareExchange<Scope::System>(word, old, (unsigned long long)r.swapAdd,
                                                         MemoryOrder::AcqRel);
            }
            *reinterpret_cast<unsigned long long*>(ret) = old;
          }
          break;
        }
      }
      if (syndrome) {
        fail(syndrome, r.opcode);
        break;
      }
      __syncwarp();  // the payload of every lane before the CQE
      if (lane == 0) {
        myCounts[0] = executed + 1;
        if (cqe) writeCqe(q, cqPi, pi, 0, 0, false);
      }
      ++executed;
      if (cqe) ++cqPi, --room;
      ++pi, ++did;
    }
  }
  if (lane == 0) {
    __stcg(&s->pi, pi);
    __stcg(&s->cqPi, cqPi);
    if (failed) {
      __stcg(&s->failed, 1u);
      atomicStore<Scope::System>(p.failed + qi, 1u, MemoryOrder::Relaxed);
    }
  }
  __syncwarp();
  return did;
}

template <int kBlock>
__global__ void __launch_bounds__(kBlock) nicKernel(Params p) {
  const int lane = threadIdx.x & 31;
  const int warp = int((blockIdx.x * blockDim.x + threadIdx.x) / 32), nWarps = int(gridDim.x * blockDim.x / 32);
  if (threadIdx.x == 0 && ::atomicAdd(&p.grid->started, 1u) + 1 == gridDim.x)
    atomicStore<Scope::System>(&p.ctl->startedEpoch, p.epoch, MemoryOrder::Release);
  unsigned long long executed = p.counts[2 * warp], errors = p.counts[2 * warp + 1];
  unsigned long long idleSince = 0;
  bool voted = false;
  unsigned backoff = 32, idlePasses = 0;
  for (;;) {
    unsigned did = 0;
    for (int q = warp; q < p.nQps; q += nWarps) did += serve(p, q, lane, executed, errors, p.counts + 2 * warp);
    if (did) {
      idleSince = 0;
      backoff = 32;
      idlePasses = 0;
      if (voted && lane == 0) ::atomicSub(&p.grid->idleVotes, 1u);
      voted = false;
      // Once every warp voted to end, end now even with work: the host
      // relaunches at once for the doorbells the last pass left.
      unsigned ending = 0;
      if (lane == 0) ending = atomicLoad<Scope::Device>(&p.grid->exiting, MemoryOrder::Relaxed);
      if (__shfl_sync(0xffffffffu, ending, 0)) break;
      continue;
    }
    unsigned out = 0;
    if (lane == 0) {
      const unsigned long long now = globalNs();
      if (idleSince == 0) idleSince = now;
      // The stop word is host memory: a PCIe read, so not on every idle pass.
      if ((idlePasses++ & 15) == 0 && atomicLoad<Scope::System>(&p.ctl->stop, MemoryOrder::Relaxed)) out = 1;
      if (p.idleExitNs && now - idleSince > p.idleExitNs && !voted) {
        voted = true;
        if (::atomicAdd(&p.grid->idleVotes, 1u) + 1 == unsigned(nWarps)) ::atomicExch(&p.grid->exiting, 1u);
      }
      if (atomicLoad<Scope::Device>(&p.grid->exiting, MemoryOrder::Relaxed)) out = 1;
    }
    if (__shfl_sync(0xffffffffu, out, 0)) break;
    __nanosleep(backoff);
    backoff = min(backoff * 2, 2048u);
  }
  // Where each of our QPs stands, for the host's relaunch check.
  if (lane == 0)
    for (int q = warp; q < p.nQps; q += nWarps)
      atomicStore<Scope::System>(p.consumed + q, unsigned(__ldcg(&p.st[q].pi)), MemoryOrder::Relaxed);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    if (::atomicAdd(&p.grid->exited, 1u) + 1 == gridDim.x) {
      // The last CTA: reset the grid state for the next launch, then tell the host.
      p.grid->started = 0, p.grid->idleVotes = 0, p.grid->exiting = 0;
      __threadfence();
      p.grid->exited = 0;
      __threadfence_system();
      atomicStore<Scope::System>(&p.ctl->exitedEpoch, p.epoch, MemoryOrder::Release);
    }
  }
}

inline cudaError_t launch(const Params& p, int ctas, cudaStream_t st) {
  nicKernel<kThreads><<<ctas, kThreads, 0, st>>>(p);
  return cudaGetLastError();
}
inline const bool registered = (launcher = &launch, true);
}  // namespace kernel
#endif  // __CUDACC__
}  // namespace gpunic
}  // namespace gin
#endif  // GIN_WITH_CUDA
