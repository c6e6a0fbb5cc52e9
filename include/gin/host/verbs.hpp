// gin/host/verbs.hpp — the rdma-core pieces two users share: the proxy's verbs
// wire (gin/host/verbs_wire.hpp) and the ibgda transport's mlx5 NIC
// (gin/host/ibgda_mlx5.hpp). Device and port choice (GIN_IB_DEVICE), the RoCE
// GID choice (GIN_IB_GID_INDEX), memory registration (dma-buf for GPU memory,
// nvidia-peermem as the fallback), RC QP state transitions, the collective
// failure vote, and RAII over the rdma-core objects.
//
// NOT YET RUN ON RDMA HARDWARE (see verbs_wire.hpp): tested against the real
// libibverbs without a device, and end to end against an in-process model
// (tests/common/fake_verbs.hpp).
//
// Compiled only where <infiniband/verbs.h> is (GIN_WITH_VERBS); the pure
// helpers in gin::verbs above that line are always compiled.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gin/core/error.hpp"
#include "gin/host/bootstrap.hpp"
#include "gin/host/env.hpp"
#include "gin/host/memory.hpp"

#ifndef GIN_WITH_VERBS
#if __has_include(<infiniband/verbs.h>)
#define GIN_WITH_VERBS 1
#else
#define GIN_WITH_VERBS 0
#endif
#endif

#if GIN_WITH_VERBS
#include <infiniband/verbs.h>
#include <unistd.h>
#endif

namespace gin::verbs {

// --- Pure helpers (no rdma-core needed) -------------------------------------

// GIN_IB_DEVICE: "name" or "name:port". port 0 means "the first active port".
struct DeviceSpec {
  std::string name;
  int port = 0;
};
inline DeviceSpec parseDeviceSpec(const std::string& s) {
  DeviceSpec d;
  const size_t colon = s.find(':');
  d.name = s.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string p = s.substr(colon + 1);
    char* end = nullptr;
    const long v = p.empty() ? 0 : std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || v < 1 || v > 255)
      throw Error("GIN_IB_DEVICE=" + s + ": the port after ':' must be a number in 1..255");
    d.port = int(v);
  }
  if (d.name.empty() && !s.empty()) throw Error("GIN_IB_DEVICE=" + s + ": the device name is empty");
  return d;
}

// One entry of a RoCE port's GID table.
struct GidCandidate {
  uint32_t index = 0;
  uint8_t raw[16] = {};
  bool rocev2 = false;
};
inline bool ipv4Mapped(const uint8_t gid[16]) {  // ::ffff:a.b.c.d
  for (int i = 0; i < 10; ++i)
    if (gid[i]) return false;
  return gid[10] == 0xff && gid[11] == 0xff;
}
// The GID index a RoCE QP uses: `forced` (GIN_IB_GID_INDEX) when >= 0, else
// the first RoCE v2 entry with an IPv4-mapped address (routable over UDP/IP,
// what NCCL and UCX pick by default), else 0.
inline uint32_t chooseGidIndex(const std::vector<GidCandidate>& table, int forced) {
  if (forced >= 0) return uint32_t(forced);
  for (const GidCandidate& c : table)
    if (c.rocev2 && ipv4Mapped(c.raw)) return c.index;
  return 0;
}

// A collective failure vote: every rank passes its own error ("" if none) and
// either all return or all throw, so a rank that failed locally never leaves
// the others waiting in a later collective. A rank's own error comes first in
// its message; the others name the first rank that failed. `who` heads the
// message ("verbs wire", "ibgda").
inline void agreeOrThrow(Bootstrap& bs, const std::string& localError, const std::string& phase,
                         const std::string& who = "verbs wire") {
  constexpr size_t kSlot = 384;
  const int n = bs.nRanks(), me = bs.rank();
  std::vector<char> all(kSlot * size_t(n), 0);
  std::memcpy(all.data() + kSlot * size_t(me), localError.data(), std::min(localError.size(), kSlot - 1));
  if (!localError.empty() && all[kSlot * size_t(me)] == 0) all[kSlot * size_t(me)] = '?';
  bs.allGather(all.data(), kSlot);
  int first = -1, failed = 0;
  for (int r = 0; r < n; ++r)
    if (all[kSlot * size_t(r)]) failed++, first = first < 0 ? r : first;
  if (!failed) return;
  const int culprit = localError.empty() ? first : me;
  std::string msg =
      who + ": " + phase + " failed on rank " + std::to_string(culprit) + ": " +
      std::string(all.data() + kSlot * size_t(culprit), strnlen(all.data() + kSlot * size_t(culprit), kSlot));
  if (failed > 1) msg += " (" + std::to_string(failed) + " ranks failed)";
  if (localError.empty()) msg += "; this rank stops too so that no rank waits in a later collective";
  throw Error(msg);
}

// An exception's text without the "gin: " head (for a vote, which adds its own).
inline std::string ownText(const std::exception& e, const std::string& alsoStrip = "") {
  std::string s = e.what();
  for (const std::string& head : {std::string("gin: "), alsoStrip})
    if (!head.empty() && s.compare(0, head.size(), head) == 0) s.erase(0, head.size());
  return s;
}

inline std::string errnoText(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

// `v` when set, else the environment variable `name`, else "".
inline std::string envOr(const std::string& v, const char* name) {
  if (!v.empty()) return v;
  return env::text(name).value_or("");
}

#if GIN_WITH_VERBS

// --- RAII over rdma-core objects.
struct Del {
  void operator()(ibv_context* p) const { ibv_close_device(p); }
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
  void operator()(ibv_cq* p) const { ibv_destroy_cq(p); }
  void operator()(ibv_qp* p) const { ibv_destroy_qp(p); }
  void operator()(ibv_mr* p) const { ibv_dereg_mr(p); }
};
template <class T>
using Own = std::unique_ptr<T, Del>;

// An opened device, the port in use and how peers address it.
struct Port {
  Own<ibv_context> ctx;
  std::string name;
  int port = 0;
  ibv_port_attr portAttr{};
  ibv_device_attr devAttr{};
  bool roce = false;
  uint32_t gidIndex = 0;
  ibv_gid gid{};
};

// Which devices of the list to try, best first (indices into it). The
// default: every device, in list order.
using DeviceOrder = std::function<std::vector<int>(ibv_device** list, int n)>;

// Open the device GIN_IB_DEVICE (or `specText`) names, else the first device
// of `order` with an active port. `hint` says what to do instead ("use
// GIN_PROXY_WIRE=tcp"); `kind` names the devices looked for ("RDMA", "mlx5").
// A device the spec names that `order` leaves out is an error.
inline Port openPort(const std::string& specText, const std::string& hint, const std::string& kind = "RDMA",
                     const DeviceOrder& order = {}) {
  const DeviceSpec spec = parseDeviceSpec(specText);
  errno = 0;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  const int listErr = errno;
  std::unique_ptr<ibv_device*, void (*)(ibv_device**)> guard(list, [](ibv_device** l) {
    if (l) ibv_free_device_list(l);
  });
  if (!list || n == 0)
    throw Error("no RDMA device found: ibv_get_device_list returned none" +
                (list ? std::string() : " (" + errnoText(listErr) + ")") + "; " + hint +
                ", or check the RDMA driver (ibv_devices lists devices)");
  std::string seen;
  for (int i = 0; i < n; ++i) seen += (seen.empty() ? "" : ", ") + std::string(ibv_get_device_name(list[i]));
  std::vector<int> candidates;
  if (order)
    candidates = order(list, n);
  else
    for (int i = 0; i < n; ++i) candidates.push_back(i);
  bool named = false;
  for (int i = 0; i < n; ++i) named = named || (!spec.name.empty() && spec.name == ibv_get_device_name(list[i]));
  if (!spec.name.empty() && !named) throw Error("GIN_IB_DEVICE=" + specText + ": no such device (found: " + seen + ")");
  bool namedCandidate = false;
  for (int i : candidates) namedCandidate = namedCandidate || spec.name == ibv_get_device_name(list[i]);
  if (!spec.name.empty() && !namedCandidate)
    throw Error("GIN_IB_DEVICE=" + specText + " is not a " + kind + " device (found: " + seen + "); " + hint);
  if (candidates.empty()) throw Error("no " + kind + " device among the RDMA devices found (" + seen + "); " + hint);
  std::string tried;
  for (int i : candidates) {
    const std::string name = ibv_get_device_name(list[i]);
    if (!spec.name.empty() && name != spec.name) continue;
    tried += (tried.empty() ? "" : ", ") + name;
    Own<ibv_context> ctx(ibv_open_device(list[i]));
    if (!ctx) {
      if (!spec.name.empty()) throw Error("cannot open " + name + ": " + errnoText(errno));
      continue;
    }
    ibv_device_attr da{};
    if (ibv_query_device(ctx.get(), &da)) throw Error("ibv_query_device(" + name + ") failed: " + errnoText(errno));
    for (int p = 1; p <= int(da.phys_port_cnt); ++p) {
      if (spec.port && p != spec.port) continue;
      ibv_port_attr pa{};
      if (ibv_query_port(ctx.get(), uint8_t(p), &pa)) continue;
      if (pa.state != IBV_PORT_ACTIVE) {
        if (spec.port) throw Error("GIN_IB_DEVICE=" + specText + ": port " + std::to_string(p) + " is not active");
        continue;
      }
      Port out;
      out.name = name, out.port = p, out.portAttr = pa, out.devAttr = da, out.ctx = std::move(ctx);
      return out;
    }
    if (spec.port && spec.port > int(da.phys_port_cnt))
      throw Error("GIN_IB_DEVICE=" + specText + ": " + name + " has " + std::to_string(da.phys_port_cnt) + " port(s)");
  }
  throw Error("no active RDMA port on " + tried + " (ibv_devinfo shows port states); " + hint + ", or bring a port up");
}

// How peers address this port: the LID (InfiniBand) or a GID (RoCE) whose
// index is `gidIndex` when >= 0, else GIN_IB_GID_INDEX, else chooseGidIndex.
inline void chooseAddress(Port& d, int gidIndex) {
  d.roce = d.portAttr.link_layer == IBV_LINK_LAYER_ETHERNET;
  if (!d.roce) {  // IB: the LID routes; no GRH inside a subnet
    if (d.portAttr.lid == 0)
      throw Error(d.name + " port " + std::to_string(d.port) + " has no LID: is a subnet manager running?");
    return;
  }
  int forced = gidIndex;
  if (forced < 0) {
    if (auto e = env::integer("GIN_IB_GID_INDEX")) {
      forced = int(*e);
      if (forced >= d.portAttr.gid_tbl_len)
        throw Error("GIN_IB_GID_INDEX=\"" + std::to_string(forced) + "\" is not an index of the GID table (0.." +
                    std::to_string(d.portAttr.gid_tbl_len - 1) + ")");
    }
  }
  std::vector<GidCandidate> table;
  for (int i = 0; forced < 0 && i < d.portAttr.gid_tbl_len; ++i) {
    ibv_gid_entry g{};
    if (ibv_query_gid_ex(d.ctx.get(), uint32_t(d.port), uint32_t(i), &g, 0)) continue;  // unused entry
    GidCandidate c;
    c.index = uint32_t(i);
    std::memcpy(c.raw, g.gid.raw, 16);
    c.rocev2 = g.gid_type == IBV_GID_TYPE_ROCE_V2;
    table.push_back(c);
  }
  d.gidIndex = chooseGidIndex(table, forced);
  if (ibv_query_gid(d.ctx.get(), uint8_t(d.port), int(d.gidIndex), &d.gid))
    throw Error("ibv_query_gid(" + d.name + ", port " + std::to_string(d.port) + ", index " +
                std::to_string(d.gidIndex) + ") failed: " + errnoText(errno) +
                "; set GIN_IB_GID_INDEX (show_gids lists the table)");
}

// What one end of an RC connection tells the other.
struct RcAddress {
  uint32_t qpn = 0, psn = 0;
  uint16_t lid = 0;
  uint8_t mtu = 0, linkLayer = 0;
  uint8_t gid[16] = {};
};
inline RcAddress localAddress(const Port& d, uint32_t qpn, uint32_t psn) {
  RcAddress a;
  a.qpn = qpn, a.psn = psn, a.lid = d.portAttr.lid;
  a.mtu = uint8_t(d.portAttr.active_mtu), a.linkLayer = d.portAttr.link_layer;
  std::memcpy(a.gid, d.gid.raw, 16);
  return a;
}

// RESET -> INIT with the remote access this QP's responder grants.
inline void toInit(ibv_qp* qp, const Port& d, int access, const std::string& what) {
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_INIT;
  s.pkey_index = 0;
  s.port_num = uint8_t(d.port);
  s.qp_access_flags = access;
  if (ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    throw Error("ibv_modify_qp(INIT) for " + what + " failed: " + errnoText(errno));
}

// The RC connection every gin QP makes (toRts below, and the mlx5 NIC's DEVX
// commands, gin/host/ibgda_mlx5.hpp): up to 16 RDMA reads/atomics in flight
// each way (clamped to the device); a dead peer is an error completion after
// about 0.5 s of transport retries (timeout 4.096 us * 2^14 = 67 ms, 7
// retries); RNR retries forever (callers bound their waits), 0.64 ms apart.
inline constexpr uint8_t kRcTimeout = 14, kRcRetry = 7, kRcRnrRetry = 7, kRcMinRnrTimer = 12, kRcHopLimit = 64;
inline int rcRdAtomics(int deviceMax) { return std::clamp(deviceMax, 1, 16); }

// INIT -> RTR -> RTS towards `r` (the connection above).
inline void toRts(ibv_qp* qp, const Port& d, const RcAddress& r, uint32_t sqPsn, const std::string& what) {
  if (r.linkLayer != d.portAttr.link_layer)
    throw Error(what + " is on a different link layer (InfiniBand vs Ethernet)");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = ibv_mtu(std::min<int>(d.portAttr.active_mtu, r.mtu));
  a.dest_qp_num = r.qpn;
  a.rq_psn = r.psn;
  a.max_dest_rd_atomic = uint8_t(rcRdAtomics(d.devAttr.max_qp_rd_atom));
  a.min_rnr_timer = kRcMinRnrTimer;
  a.ah_attr.port_num = uint8_t(d.port);
  a.ah_attr.dlid = r.lid;
  if (d.roce) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, r.gid, 16);
    a.ah_attr.grh.sgid_index = uint8_t(d.gidIndex);
    a.ah_attr.grh.hop_limit = kRcHopLimit;
  }
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    throw Error("ibv_modify_qp(RTR) for " + what + " failed: " + errnoText(errno) +
                (d.roce ? "; on RoCE check GIN_IB_GID_INDEX (show_gids)" : ""));
  ibv_qp_attr b{};
  b.qp_state = IBV_QPS_RTS;
  b.timeout = kRcTimeout;
  b.retry_cnt = kRcRetry;
  b.rnr_retry = kRcRnrRetry;  // 7: indefinitely
  b.sq_psn = sqPsn;
  b.max_rd_atomic = uint8_t(rcRdAtomics(d.devAttr.max_qp_init_rd_atom));
  if (ibv_modify_qp(qp, &b,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    throw Error("ibv_modify_qp(RTS) for " + what + " failed: " + errnoText(errno));
}

#if GIN_WITH_CUDA
// A dma-buf fd for the whole cudaMalloc allocation that holds `base` (the
// driver wants page-aligned ranges) and base's offset in it; -1 and *why on
// failure. The driver function comes through the runtime's entry-point
// lookup, as in memory.hpp, so programs need not link libcuda.
inline int dmabufFd(const char* base, int cudaDevice, uint64_t* offset, std::string* why) {
  try {
    if (cudaDevice >= 0) GIN_CUDA_CHECK(cudaSetDevice(cudaDevice));
    const auto [allocBase, allocBytes] = cudaAllocationRange(base);
    using Fn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &q) !=
            cudaSuccess ||
        !fn || q != cudaDriverEntryPointSuccess)
      return (void)cudaGetLastError(), *why = "the CUDA driver has no cuMemGetHandleForAddressRange", -1;
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t b = uintptr_t(allocBase) & ~(page - 1);
    const uintptr_t e = (uintptr_t(allocBase) + allocBytes + page - 1) & ~(page - 1);
    int fd = -1;
    const CUresult r =
        reinterpret_cast<Fn>(fn)(&fd, CUdeviceptr(b), size_t(e - b), CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS || fd < 0)
      return *why = "cuMemGetHandleForAddressRange returned " + std::to_string(int(r)), -1;
    *offset = uint64_t(uintptr_t(base) - b);
    return fd;
  } catch (const std::exception& e) {
    *why = e.what();
    return -1;
  }
}
#endif

// Register [base, base+bytes) with `access`: host memory with ibv_reg_mr; GPU
// memory (cudaMalloc) through dma-buf, else through ibv_reg_mr, which works
// when the nvidia-peermem kernel module is loaded.
inline Own<ibv_mr> registerMemory(ibv_pd* pd, char* base, uint64_t bytes, bool gpu, int access, int cudaDevice = -1) {
  if (!gpu) {
    Own<ibv_mr> mr(ibv_reg_mr(pd, base, bytes, access));
    if (!mr) throw Error("ibv_reg_mr(" + std::to_string(bytes) + " bytes of host memory) failed: " + errnoText(errno));
    return mr;
  }
#if GIN_WITH_CUDA
  std::string dmabufWhy;
  uint64_t offset = 0;
  const int fd = dmabufFd(base, cudaDevice, &offset, &dmabufWhy);
  if (fd >= 0) {
    Own<ibv_mr> mr(ibv_reg_dmabuf_mr(pd, offset, bytes, uint64_t(uintptr_t(base)), fd, access));
    const int e = errno;
    ::close(fd);  // the MR holds its own reference to the dma-buf
    if (mr) return mr;
    dmabufWhy = "ibv_reg_dmabuf_mr: " + errnoText(e);
  }
  // Fallback: the nvidia-peermem kernel module lets ibv_reg_mr pin GPU memory.
  Own<ibv_mr> mr(ibv_reg_mr(pd, base, bytes, access));
  if (!mr)
    throw Error("cannot register " + std::to_string(bytes) + " bytes of GPU memory: dma-buf failed (" + dmabufWhy +
                ") and ibv_reg_mr failed (" + errnoText(errno) + "; is nvidia-peermem loaded?)");
  return mr;
#else
  (void)cudaDevice;
  throw Error("a GPU buffer to register, but gin was built without the CUDA runtime");
#endif
}

#endif  // GIN_WITH_VERBS

}  // namespace gin::verbs
