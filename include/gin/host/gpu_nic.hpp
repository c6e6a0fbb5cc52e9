// gin/host/gpu_nic.hpp — the GPU NIC: a software mlx5 send-queue consumer that
// runs on the GPU (a few warps of a kernel of its own), for queue pairs whose
// send queues, doorbell records and CQs are in GPU memory
// (IbgdaConfig::queues = Gpu). Selected with IbgdaConfig::device = GpuSoft or
// GIN_IBGDA_DEVICE=gpu-soft (gpu-soft-sink: completes without executing). A
// test and development device written for this project, not a ConnectX model:
// it lets the ibgda device code run at GPU speed, and measures the posting
// path without PCIe in the way. No ConnectX hardware was available to test
// gin against.
//
// What it does, per QP, in WQE order: reads the WQEs the doorbell record
// announces, checks each with the soft NICs' one parser (mlx5::decodeWqe),
// resolves keys and ranges against its regions (a bad one gets ConnectX's
// error CQE and stops the QP, as on the host soft NIC), runs RDMA WRITE
// (gather, inline), fetch-add, compare-and-swap and NOP into the target
// (this GPU's memory, or a peer GPU's through the pointer mapped here), and
// writes the CQE last with release, owner bit flipped per pass.
//
// How it runs (the rule it needs; docs/design/gpu-nic.md says why): the
// kernel starts when the NIC is created, on a non-blocking stream of its own,
// before any kernel that posts to it, and stays while there is work. After
// `idleExitUs` without work it ends, so context-wide synchronization
// (cudaDeviceSynchronize, cudaFree) of the program returns; a host thread
// watches the QPs' UAR words (mapped host memory: a real UAR is a PCIe
// write too) and launches it again when a doorbell rings for work it has not
// consumed. A relaunch that does not start within the timeout (CUDA's
// hardware queues blocked behind the program's waiting kernels, or SMs full)
// is reported through onStop, so the waits on its work fail with that error
// instead of timing out in silence. idleExitUs = 0: the kernel stays until
// the NIC is destroyed (context-wide synchronization then waits for that).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gin/core/atomic.hpp"
#include "gin/core/clock.hpp"
#include "gin/core/error.hpp"
#include "gin/device/mlx5/wqe.hpp"
#include "gin/host/idle.hpp"
#include "gin/host/memory.hpp"
#include "gin/host/side_context.hpp"
#include "gin/host/window.hpp"

#if GIN_WITH_CUDA
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

// Lane 0: CQE `cqIndex` of QP q for WQE `pi`; the last word last, with release.
__device__ inline void writeCqe(const Qp& q, unsigned long long cqIndex, unsigned long long pi, uint8_t syndrome,
                                uint8_t wqeOpcode, bool err) {
  mlx5::Cqe64 c;
  mlx5::fillCqe(c, uint16_t(pi), q.qpn, 0, err ? syndrome : 0, 0, err ? wqeOpcode : 0);
  c.b[mlx5::kCqeOpOwn] =
      mlx5::makeOpOwn(err ? mlx5::kCqeReqErr : mlx5::kCqeReq, mlx5::cqeExpectedOwner(cqIndex, q.nCqe));
  unsigned words[16];
  __builtin_memcpy(words, c.b, 64);
  unsigned* e = reinterpret_cast<unsigned*>(q.cq + (cqIndex & (q.nCqe - 1)));
  for (int i = 0; i < 15; ++i) e[i] = words[i];
  // Release at system scope: the CQE body, and every effect of the WQE
  // (stores of every lane, ordered before by the caller's __syncwarp), first.
  atomicStore<Scope::System>(e + 15, words[15], MemoryOrder::Release);
}

// Serve one QP for one pass: returns the WQEs consumed. Warp-uniform.
__device__ inline unsigned serve(const Params& p, int qi, int lane, unsigned long long& executed,
                                 unsigned long long& errors, unsigned long long* myCounts) {
  const Qp q = p.qps[qi];
  QpState* s = p.st + qi;
  if (__ldcg(&s->failed)) return 0;
  unsigned long long pi = __ldcg(&s->pi), cqPi = __ldcg(&s->cqPi);
  unsigned dbr = 0, cqci = 0;
  if (lane == 0) {
    // Acquire: pairs with the producer's release of the doorbell record.
    dbr = atomicLoad<Scope::System>(q.dbrec + mlx5::kDbrSend, MemoryOrder::Acquire);
    cqci = atomicLoad<Scope::System>(q.cqDbrec, MemoryOrder::Acquire);
  }
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
    // Sink: lane k completes WQE pi + k; nothing is read but nothing runs either.
    const unsigned m = min(min(avail, room), 32u);
    if (lane == 0) myCounts[0] = executed + m;
    __syncwarp();
    if (unsigned(lane) < m) writeCqe(q, cqPi + lane, pi + lane, 0, 0, false);
    executed += m;
    pi += m, cqPi += m, did = m;
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

class GpuNic {
 public:
  struct Config {
    int ctas = 2;                  // CTAs of 4 warps; each warp serves QPs i, i + warps, ...
    bool sink = false;             // complete every WQE without reading it
    uint64_t idleExitUs = 10000;   // end the kernel after this long without work (0: never)
    uint64_t startTimeoutNs = 0;   // how long a (re)launch may take to start (0: 20 s)
  };
  // A QP: its NIC-facing memory (device addresses), and the host address of its UAR word.
  struct QpDesc {
    gpunic::Qp qp;
    const uint64_t* uarHost;
  };
  using Stopped = std::function<void(const std::string& why)>;

  GpuNic(int device, std::vector<QpDesc> qps, unsigned maxRegions, Config cfg)
      : device_(device), cfg_(cfg), descs_(std::move(qps)) {
    if (!gpunic::launcher)
      throw Error(
          "the GPU NIC (GIN_IBGDA_DEVICE=gpu-soft) runs a kernel, which only translation units compiled by nvcc "
          "carry: create the communicator from a .cu file, or use GIN_IBGDA_DEVICE=soft");
    if (cfg_.ctas < 1 || cfg_.ctas > 1024)
      throw Error("the GPU NIC's CTA count must be in [1, 1024] (got " + std::to_string(cfg_.ctas) + ")");
    if (cfg_.startTimeoutNs == 0) cfg_.startTimeoutNs = 20'000'000'000ull;
    const size_t nQ = descs_.size();
    nSlots_ = 16;
    while (nSlots_ < 2 * maxRegions + 2) nSlots_ *= 2;
    regions_.assign(nSlots_, gpunic::Region{});
    const int warps = cfg_.ctas * gpunic::kThreads / 32;
    host_ = HostMappedBuffer(true, sizeof(gpunic::Control) + nQ * 8 + size_t(warps) * 16 + 64);
    char* h = static_cast<char*>(host_.host());
    char* d = static_cast<char*>(host_.device());
    ctl_ = reinterpret_cast<gpunic::Control*>(h);
    consumed_ = reinterpret_cast<unsigned*>(h + sizeof(gpunic::Control));
    failed_ = consumed_ + nQ;
    counts_ = reinterpret_cast<unsigned long long*>(h + sizeof(gpunic::Control) + nQ * 8);
    // Device memory: the QP table, their states, the grid state, the regions.
    const size_t offSt = nQ * sizeof(gpunic::Qp), offGrid = offSt + nQ * sizeof(gpunic::QpState),
                 offReg = (offGrid + sizeof(gpunic::GridState) + 63) / 64 * 64;
    table_ = DeviceTable(true, offReg + nSlots_ * sizeof(gpunic::Region));
    std::vector<gpunic::Qp> qv(nQ);
    for (size_t i = 0; i < nQ; ++i) qv[i] = descs_[i].qp;
    if (nQ) table_.upload(0, qv.data(), nQ * sizeof(gpunic::Qp));
    regionsDev_ = reinterpret_cast<gpunic::Region*>(table_.data() + offReg);
    p_.qps = reinterpret_cast<const gpunic::Qp*>(table_.data());
    p_.st = reinterpret_cast<gpunic::QpState*>(table_.data() + offSt);
    p_.grid = reinterpret_cast<gpunic::GridState*>(table_.data() + offGrid);
    p_.consumed = reinterpret_cast<unsigned*>(d + sizeof(gpunic::Control));
    p_.failed = p_.consumed + nQ;
    p_.counts = reinterpret_cast<unsigned long long*>(d + sizeof(gpunic::Control) + nQ * 8);
    p_.ctl = reinterpret_cast<gpunic::Control*>(d);
    p_.nQps = int(nQ);
    p_.regions = regionsDev_;
    p_.nSlots = nSlots_;
    p_.sink = cfg_.sink ? 1u : 0u;
    p_.idleExitNs = cfg_.idleExitUs * 1000ull;
    int lo = 0, hi = 0;
    GIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    GIN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, hi));
    copier_ = std::make_unique<SideCopier>(device_);
  }
  ~GpuNic() {
    try {
      stop();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gin: stopping the GPU NIC: %s\n", e.what());
    }
    if (stream_) (void)cudaStreamDestroy(stream_);
  }
  GpuNic(const GpuNic&) = delete;
  GpuNic& operator=(const GpuNic&) = delete;

  bool sink() const { return cfg_.sink; }
  int ctas() const { return cfg_.ctas; }
  size_t nQps() const { return descs_.size(); }

  // Regions: (peer, key) -> [addr, addr + bytes) at device address `map`;
  // peer -1 for local keys. Before the first WQE that names them.
  void addRegion(int peer, uint32_t key, uint64_t addr, uint64_t bytes, void* map) {
    std::lock_guard<std::mutex> lk(mu_);
    unsigned h = gpunic::regionSlot(peer, key, nSlots_), reuse = ~0u;
    for (unsigned k = 0; k < nSlots_; ++k, h = (h + 1) & (nSlots_ - 1)) {
      gpunic::Region& r = regions_[h];
      if (r.state == gpunic::kLive && r.key == key && r.peer == peer) {
        reuse = h;
        break;
      }
      if (r.state != gpunic::kLive && reuse == ~0u) reuse = h;
      if (r.state == gpunic::kEmpty) break;
    }
    if (reuse == ~0u) throw Error("the GPU NIC's region table is full (" + std::to_string(nSlots_) + " slots)");
    regions_[reuse] = gpunic::Region{addr, bytes, reinterpret_cast<uintptr_t>(map), key, peer, gpunic::kLive, 0};
    publish(reuse);
  }
  void removeRegion(int peer, uint32_t key) {
    std::lock_guard<std::mutex> lk(mu_);
    unsigned h = gpunic::regionSlot(peer, key, nSlots_);
    for (unsigned k = 0; k < nSlots_; ++k, h = (h + 1) & (nSlots_ - 1)) {
      gpunic::Region& r = regions_[h];
      if (r.state == gpunic::kEmpty) return;
      if (r.state == gpunic::kLive && r.key == key && r.peer == peer) {
        r.state = gpunic::kRemoved;
        return publish(h);
      }
    }
  }

  // What to do if a (re)launch does not start in time (the Comm records it).
  void setOnStop(Stopped f) {
    std::lock_guard<std::mutex> lk(mu_);
    onStop_ = std::move(f);
  }

  // Launch the kernel (bounded wait for it to start), then the watcher.
  void start() {
    if (watcher_.joinable()) return;
    GIN_CUDA_CHECK(cudaSetDevice(device_));
    std::string why;
    if (!launch(&why)) throw Error(why);
    watcher_ = std::thread([this] { watch(); });
  }
  void stop() {
    if (stopped_) return;
    stopped_ = true;
    quit_.store(true, std::memory_order_release);
    if (watcher_.joinable()) watcher_.join();
    atomicStore(&ctl_->stop, 1u, MemoryOrder::Release);
    if (launched_) GIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // WQEs completed without error so far, and with an error (each warp
  // publishes its totals before the CQEs they count).
  uint64_t executed() const { return sumCounts(0); }
  uint64_t errors() const { return sumCounts(1); }
  // Whether the kernel is running now, and how many times it was launched.
  bool running() const { return running_.load(std::memory_order_acquire); }
  unsigned launches() const { return epoch_; }

 private:
  int device_;
  Config cfg_;
  std::vector<QpDesc> descs_;
  unsigned nSlots_ = 0;
  std::vector<gpunic::Region> regions_;  // the host's copy, under mu_
  HostMappedBuffer host_;
  DeviceTable table_;
  gpunic::Region* regionsDev_ = nullptr;
  gpunic::Control* ctl_ = nullptr;
  unsigned* consumed_ = nullptr;
  unsigned* failed_ = nullptr;
  unsigned long long* counts_ = nullptr;
  gpunic::Params p_{};
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<SideCopier> copier_;  // region updates: never queued behind the program's kernels
  std::mutex mu_;
  Stopped onStop_;
  std::thread watcher_;
  std::atomic<bool> quit_{false}, running_{false};
  unsigned epoch_ = 0;
  bool launched_ = false, stopped_ = false;

  uint64_t sumCounts(int k) const {
    uint64_t s = 0;
    const int warps = cfg_.ctas * gpunic::kThreads / 32;
    for (int w = 0; w < warps; ++w) s += atomicLoad(counts_ + 2 * w + k, MemoryOrder::Relaxed);
    return s;
  }

  // Copy region slot h into the kernel's table (a side-context copy: it runs
  // while the program's kernels spin, whatever its streams).
  void publish(unsigned h) {
    copier_->copy(regionsDev_ + h, stageRegion(regions_[h]), sizeof(gpunic::Region));
    copier_->complete();
  }
  const void* stageRegion(const gpunic::Region& r) {
    if (!stage_.host()) stage_ = HostMappedBuffer(true, sizeof(gpunic::Region));
    std::memcpy(stage_.host(), &r, sizeof r);
    return stage_.host();
  }
  HostMappedBuffer stage_;

  // Launch epoch + 1 and wait (bounded) until every CTA started.
  bool launch(std::string* why) {
    p_.epoch = ++epoch_;
    const cudaError_t e = gpunic::launcher(p_, cfg_.ctas, stream_);
    if (e != cudaSuccess) {
      *why = std::string("launching the GPU NIC's kernel failed: ") + cudaGetErrorString(e);
      return false;
    }
    launched_ = true;
    running_.store(true, std::memory_order_release);
    const uint64_t t0 = nowNs();
    // cudaStreamQuery hands the launch to the GPU: the driver may hold
    // launches back until the next call that flushes them, and nothing else
    // may come (the NIC's kernel is the only work on its stream).
    uint32_t polls = 0;
    while (atomicLoad(&ctl_->startedEpoch, MemoryOrder::Acquire) != p_.epoch) {
      if (polls++ % 1024 == 0) (void)cudaStreamQuery(stream_);
      if (nowNs() - t0 > cfg_.startTimeoutNs) {
        *why = "the GPU NIC's kernel (" + std::to_string(cfg_.ctas) + " CTAs of " +
               std::to_string(gpunic::kThreads) + " threads) did not start within " +
               std::to_string(cfg_.startTimeoutNs / 1000000) +
               " ms: the GPU is full, or its launch waits in a CUDA hardware queue behind kernels that wait for it "
               "(CUDA_DEVICE_MAX_CONNECTIONS, ranks sharing the GPU: docs/design/gpu-nic.md). Use "
               "GIN_IBGDA_DEVICE=soft, or GIN_IBGDA_GPU_NIC_IDLE_US=0 (the kernel stays)";
        return false;
      }
      std::this_thread::yield();
    }
    return true;
  }

  // Whether QP i has a rung doorbell for WQEs the kernel has not consumed.
  bool pending(size_t i) const {
    if (atomicLoad(failed_ + i, MemoryOrder::Acquire)) return false;
    const uint64_t uar = atomicLoad(descs_[i].uarHost, MemoryOrder::Acquire);
    if (uar == 0) return false;
    mlx5::CtrlSeg c{};
    std::memcpy(&c, &uar, 8);
    return uint16_t(mlx5::ctrlWqeIndex(c) + 1) != uint16_t(atomicLoad(consumed_ + i, MemoryOrder::Acquire));
  }

  void watch() {
    try {
      (void)cudaSetDevice(device_);
      detail::IdleBackoff idle(256, 64, 20);
      while (!quit_.load(std::memory_order_acquire)) {
        if (running_.load(std::memory_order_relaxed)) {
          if (atomicLoad(&ctl_->exitedEpoch, MemoryOrder::Acquire) == epoch_) {
            running_.store(false, std::memory_order_release);
            continue;  // check for doorbells it missed at once
          }
          idle.wait();
          continue;
        }
        bool any = false;
        for (size_t i = 0; i < descs_.size() && !any; ++i) any = pending(i);
        if (!any) {
          idle.wait();
          continue;
        }
        idle.busy();
        std::string why;
        if (!launch(&why)) {
          Stopped tell;
          {
            std::lock_guard<std::mutex> lk(mu_);
            tell = onStop_;
          }
          std::fprintf(stderr, "gin: %s\n", why.c_str());
          if (tell) tell(why);
          return;
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gin: the GPU NIC's watcher stopped: %s\n", e.what());
    }
  }
};

}  // namespace gin
#endif  // GIN_WITH_CUDA
