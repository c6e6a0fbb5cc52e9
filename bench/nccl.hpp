// bench/nccl.hpp — NCCL, the baseline next to gin in barrier, allreduce,
// sendrecv and moe (when built with it and on GPUs).
#pragma once

#include "common.hpp"
#include "engine.hpp"

namespace bench {

using gin::Window;

// ---- NCCL, the baseline of barrier, allreduce, sendrecv and moe ----

// Why NCCL is not measured next to gin in this run ("" when it is, as far as
// the options and the build can tell). NCCL picks its own transport, so it is
// compared only with gin's lsa unless `anyTransport`.
std::string ncclSkipReason(const Options& o, bool gpu, bool anyTransport = false) {
  if (!gpu) return "CPU emulation: NCCL runs on GPUs only";
#if GIN_BENCH_NCCL
  if (o.noNccl) return "disabled by --no-nccl";
  if (!anyTransport && o.transport != "lsa")
    return "not measured with --transport " + o.transport + " (NCCL picks its own transport)";
  return "";
#else
  (void)o, (void)anyTransport;
  return "this gin-bench was built without NCCL (libnccl was not found when configuring)";
#endif
}

#if GIN_BENCH_NCCL
#define BENCH_NCCL_TRY(call, what)                                                                              \
  do {                                                                                                          \
    const ncclResult_t r_ = (call);                                                                             \
    if (r_ != ncclSuccess && reason.empty()) reason = std::string(what) + " failed: " + ncclGetErrorString(r_); \
  } while (0)

// NCCL communicator + device communicator with lsaBarrierCount barriers, for
// the comparison. Every step is agreed on by all ranks, so a failure on one
// rank turns into "not measured (reason)" everywhere instead of a hang.
struct NcclSide {
  bool ok = false;
  std::string reason;
  ncclComm_t comm = nullptr;
  ncclDevComm dev{};
  bool haveDev = false;
  void* send = nullptr;  // the op's own buffers for NCCL (start's sizes), freed by close
  void* recv = nullptr;

  // An op's setup: when `why` is empty (nothing rules NCCL out), open the
  // communicator with `barriers` device barriers (0: host only) and allocate
  // the send and receive buffers (0 bytes: none); otherwise, or when that
  // fails, `why` says why NCCL is not measured. Returns whether it is.
  bool start(gin::Comm& g, std::string& why, int barriers, size_t sendBytes = 0, size_t recvBytes = 0) {
    if (!why.empty()) return false;
    open(g, barriers);
    if (!ok) {
      why = reason;
      return false;
    }
    if (sendBytes) BENCH_CUDA(cudaMalloc(&send, sendBytes));
    if (recvBytes) BENCH_CUDA(cudaMalloc(&recv, recvBytes));
    return true;
  }

  // Any rank's first failure, agreed by every rank.
  static std::string agree(gin::Comm& c, const std::string& mine) {
    struct Msg {
      char text[240];
    } m{};
    std::snprintf(m.text, sizeof m.text, "%s", mine.c_str());
    const auto all = allGather(c, m);
    for (int r = 0; r < c.nRanks(); ++r)
      if (all[size_t(r)].text[0]) return fmt("rank %d: %s", r, all[size_t(r)].text);
    return "";
  }

  // barriers == 0: the host communicator only (ncclAllReduce), no device communicator.
  void open(gin::Comm& g, int barriers) {
    std::string reason;
    ncclUniqueId id{};
    if (g.rank() == 0) BENCH_NCCL_TRY(ncclGetUniqueId(&id), "ncclGetUniqueId");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    g.bootstrap().broadcast(&id, sizeof id, 0);
    BENCH_NCCL_TRY(ncclCommInitRank(&comm, g.nRanks(), id, g.rank()), "ncclCommInitRank");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    if (barriers == 0) {
      ok = true;
      return;
    }
    ncclDevCommRequirements reqs;
    std::memset(&reqs, 0, sizeof reqs);
    reqs.lsaBarrierCount = barriers;
    BENCH_NCCL_TRY(ncclDevCommCreate(comm, &reqs, &dev),
                   "ncclDevCommCreate (needs symmetric memory: CUDA VMM, "
                   "NCCL_CUMEM_ENABLE)");
    reason = agree(g, reason);
    if (!reason.empty()) return fail(reason);
    haveDev = true;
    reason = agree(g, dev.lsaSize == g.nRanks() ? std::string()
                                                : fmt("NCCL's lsa team has %d ranks, not %d (are all GPUs "
                                                      "peer-accessible?)",
                                                      dev.lsaSize, g.nRanks()));
    if (!reason.empty()) return fail(reason);
    ok = true;
  }
  void fail(const std::string& why) {
    reason = why;
    ok = false;
  }
  // Every rank calls this at the same point. After a failure some ranks may
  // lack a communicator, so the collective teardown is replaced by a local
  // ncclCommAbort.
  void close() {
    if (ok) {
      if (haveDev) (void)ncclDevCommDestroy(comm, &dev);
      (void)ncclCommFinalize(comm);
      (void)ncclCommDestroy(comm);
    } else if (comm) {
      (void)ncclCommAbort(comm);
    }
    comm = nullptr;
    ok = false;
    haveDev = false;
    if (send) cudaFree(send);
    if (recv) cudaFree(recv);
    send = recv = nullptr;
  }
};
#endif

}  // namespace bench
