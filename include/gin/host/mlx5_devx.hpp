// gin/host/mlx5_devx.hpp — the mlx5 firmware commands gin sends through DEVX
// (mlx5dv_devx_obj_create / _modify) to build a QP and its CQ on queue memory
// the caller owns (GPU memory, registered as a DEVX umem): CREATE_CQ,
// CREATE_QP, RST2INIT_QP, INIT2RTR_QP, RTR2RTS_QP. Only the layouts and the
// builders live here: no rdma-core dependency; gin/host/ibgda_mlx5.hpp sends
// them.
//
// A command is a big-endian bit string whose fields the ConnectX PRM (and
// the kernel's include/linux/mlx5/mlx5_ifc.h) name by bit offset from the
// start and width; `Field` holds those two numbers and putField/getField
// store and read a field exactly as rdma-core's DEVX_SET/DEVX_GET do (bit 0
// is the most significant bit of the first big-endian 32-bit word). Offsets
// below are absolute within each command's input (the context structures'
// offsets plus where they sit), transcribed from mlx5_ifc.h's create_cq_in
// (cq_context at 0x80), create_qp_in and the modify commands (qpc at 0xc0,
// its primary address path at 0xc0 + 0xc0). Not checked on ConnectX
// hardware (none was available): tests/common/fake_verbs.hpp decodes every
// command with its own, separately written offsets and checks each field.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace gin::mlx5cmd {

struct Field {
  uint32_t off, bits;  // bit offset from the start of the command, width (at most 32, or 64 when 32-aligned)
};

// DEVX_SET: store the low `f.bits` bits of v at f.
inline void putField(void* cmd, Field f, uint64_t v) {
  auto* w = static_cast<uint8_t*>(cmd);
  if (f.bits == 64) {  // two whole big-endian words
    for (int i = 0; i < 8; ++i) w[f.off / 8 + uint32_t(i)] = uint8_t(v >> (56 - 8 * i));
    return;
  }
  const uint32_t word = f.off / 32, shift = 32 - (f.off % 32) - f.bits;  // within the 32-bit big-endian word
  const uint32_t mask = (f.bits == 32 ? 0xffffffffu : ((1u << f.bits) - 1)) << shift;
  uint8_t* p = w + word * 4;
  uint32_t cur = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
  cur = (cur & ~mask) | ((uint32_t(v) << shift) & mask);
  p[0] = uint8_t(cur >> 24), p[1] = uint8_t(cur >> 16), p[2] = uint8_t(cur >> 8), p[3] = uint8_t(cur);
}
// DEVX_GET.
inline uint64_t getField(const void* cmd, Field f) {
  const auto* w = static_cast<const uint8_t*>(cmd);
  if (f.bits == 64) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | w[f.off / 8 + uint32_t(i)];
    return v;
  }
  const uint8_t* p = w + (f.off / 32) * 4;
  const uint32_t cur = (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
  const uint32_t shift = 32 - (f.off % 32) - f.bits;
  return f.bits == 32 ? cur : (cur >> shift) & ((1u << f.bits) - 1);
}

// Command opcodes (the first 16 bits of every input).
enum : uint16_t {
  kCreateCq = 0x400,
  kCreateQp = 0x500,
  kRst2InitQp = 0x502,
  kInit2RtrQp = 0x503,
  kRtr2RtsQp = 0x504,
};
inline constexpr Field kOpcode{0x00, 16};
inline constexpr Field kStatus{0x00, 8};     // in every output
inline constexpr Field kSyndrome{0x20, 32};  // in every output
inline constexpr size_t kInBytes = 0x880 / 8;  // create_cq_in, create_qp_in and the modify commands, without pas
inline constexpr size_t kOutBytes = 0x80 / 8;

// create_cq_in: cq_context (cqc) at bit 0x80.
namespace cq {
inline constexpr Field kDbrUmemValid{0x80 + 0x06, 1};
inline constexpr Field kCqeSize{0x80 + 0x08, 3};  // 0: 64-byte CQEs
inline constexpr Field kCollapsed{0x80 + 0x0b, 1};
inline constexpr Field kOverrunIgnore{0x80 + 0x0e, 1};
inline constexpr Field kDbrUmemId{0x80 + 0x20, 32};
inline constexpr Field kPageOffset{0x80 + 0x54, 6};
inline constexpr Field kTimestampFormat{0x80 + 0x5e, 2};
inline constexpr Field kLogSize{0x80 + 0x63, 5};
inline constexpr Field kUarPage{0x80 + 0x68, 24};
inline constexpr Field kEqn{0x80 + 0xa0, 32};  // c_eqn_or_apu_element (the EQN in its low bits)
inline constexpr Field kLogPageSize{0x80 + 0xc3, 5};  // log2(page) - 12
inline constexpr Field kDbrAddr{0x80 + 0x1c0, 64};    // with a dbr umem: the offset in it
inline constexpr Field kUmemOffset{0x280, 64};
inline constexpr Field kUmemId{0x2c0, 32};
inline constexpr Field kUmemValid{0x2e0, 1};
inline constexpr Field kCqn{0x48, 24};  // create_cq_out
}  // namespace cq

// create_qp_in and {rst2init,init2rtr,rtr2rts}_qp_in: qpc at bit 0xc0, its
// primary_address_path (ads) at 0xc0 + 0xc0.
namespace qp {
inline constexpr Field kQpn{0x48, 24};  // the modify commands' input, create_qp_out
inline constexpr Field kOptParamMask{0x80, 32};
inline constexpr uint32_t kQpc = 0xc0, kAds = kQpc + 0xc0;
inline constexpr Field kServiceType{kQpc + 0x08, 8};  // 0: RC
inline constexpr Field kPmState{kQpc + 0x13, 2};      // 3: migrated
inline constexpr Field kPd{kQpc + 0x28, 24};
inline constexpr Field kMtu{kQpc + 0x40, 3};  // IB encoding: 5 = 4096
inline constexpr Field kLogMsgMax{kQpc + 0x43, 5};
inline constexpr Field kLogRqSize{kQpc + 0x49, 4};
inline constexpr Field kLogRqStride{kQpc + 0x4d, 3};
inline constexpr Field kNoSq{kQpc + 0x50, 1};
inline constexpr Field kLogSqSize{kQpc + 0x51, 4};
inline constexpr Field kTimestampFormat{kQpc + 0x58, 2};
inline constexpr Field kUarPage{kQpc + 0x68, 24};
inline constexpr Field kLogPageSize{kQpc + 0xa3, 5};
inline constexpr Field kRemoteQpn{kQpc + 0xa8, 24};
inline constexpr Field kPkeyIndex{kAds + 0x10, 16};
inline constexpr Field kGrh{kAds + 0x28, 1};
inline constexpr Field kRlid{kAds + 0x30, 16};
inline constexpr Field kAckTimeout{kAds + 0x40, 5};
inline constexpr Field kSrcAddrIndex{kAds + 0x48, 8};
inline constexpr Field kHopLimit{kAds + 0x58, 8};
inline constexpr uint32_t kRgid = kAds + 0x80;  // 16 bytes, network order
inline constexpr Field kUdpSport{kAds + 0x110, 16};
inline constexpr Field kSl{kAds + 0x124, 4};
inline constexpr Field kVhcaPort{kAds + 0x128, 8};
inline constexpr uint32_t kRmac = kAds + 0x130;  // 6 bytes, network order
inline constexpr Field kLogSraMax{kQpc + 0x388, 3};
inline constexpr Field kRetryCount{kQpc + 0x38d, 3};
inline constexpr Field kRnrRetry{kQpc + 0x390, 3};
inline constexpr Field kNextSendPsn{kQpc + 0x3c8, 24};
inline constexpr Field kCqnSnd{kQpc + 0x3e8, 24};
inline constexpr Field kLogRraMax{kQpc + 0x488, 3};
inline constexpr Field kAtomicMode{kQpc + 0x48c, 4};  // 3: atomics up to 8 bytes
inline constexpr Field kRre{kQpc + 0x490, 1};
inline constexpr Field kRwe{kQpc + 0x491, 1};
inline constexpr Field kRae{kQpc + 0x492, 1};
inline constexpr Field kPageOffset{kQpc + 0x494, 6};
inline constexpr Field kMinRnrNak{kQpc + 0x4a3, 5};
inline constexpr Field kNextRcvPsn{kQpc + 0x4a8, 24};
inline constexpr Field kCqnRcv{kQpc + 0x4e8, 24};
inline constexpr Field kDbrAddr{kQpc + 0x500, 64};  // with a dbr umem: the offset in it
inline constexpr Field kRqType{kQpc + 0x565, 3};    // 3: zero-length receive queue
inline constexpr Field kDbrUmemValid{kQpc + 0x683, 1};
inline constexpr Field kDbrUmemId{kQpc + 0x720, 32};
inline constexpr Field kWqUmemOffset{0x800, 64};
inline constexpr Field kWqUmemId{0x840, 32};
inline constexpr Field kWqUmemValid{0x860, 1};
}  // namespace qp

inline constexpr uint32_t kServiceRc = 0, kPmMigrated = 3, kRqZeroLength = 3, kAtomicUpTo8B = 3;
inline constexpr uint32_t kTimestampDefault = 1;

using In = std::array<uint8_t, kInBytes>;

// Where a queue's memory is: a DEVX umem and the byte offset in it.
struct UmemAt {
  uint32_t umem = 0;
  uint64_t offset = 0;
};

// CREATE_CQ: 2^logSize 64-byte CQEs at `buf`, doorbell record at `dbr`; a
// ring (not collapsed), overrun checked: gin's pollers read every CQE and
// publish their consumer index.
inline In createCq(uint32_t logSize, UmemAt buf, UmemAt dbr, uint32_t uarPage, uint32_t eqn) {
  In in{};
  putField(in.data(), kOpcode, kCreateCq);
  putField(in.data(), cq::kCqeSize, 0);
  putField(in.data(), cq::kTimestampFormat, kTimestampDefault);
  putField(in.data(), cq::kLogSize, logSize);
  putField(in.data(), cq::kUarPage, uarPage);
  putField(in.data(), cq::kEqn, eqn);
  putField(in.data(), cq::kLogPageSize, 0);  // 4 KiB pages; buffers start on one
  putField(in.data(), cq::kPageOffset, 0);
  putField(in.data(), cq::kUmemValid, 1);
  putField(in.data(), cq::kUmemId, buf.umem);
  putField(in.data(), cq::kUmemOffset, buf.offset);
  putField(in.data(), cq::kDbrUmemValid, 1);
  putField(in.data(), cq::kDbrUmemId, dbr.umem);
  putField(in.data(), cq::kDbrAddr, dbr.offset);
  return in;
}

// CREATE_QP: an RC QP with 2^logSq 64-byte send WQEBBs at `sq`, no receive
// queue, doorbell record at `dbr`, both directions completing on `cqn`.
inline In createQp(uint32_t pdn, uint32_t cqn, uint32_t logSq, UmemAt sq, UmemAt dbr, uint32_t uarPage) {
  In in{};
  putField(in.data(), kOpcode, kCreateQp);
  putField(in.data(), qp::kServiceType, kServiceRc);
  putField(in.data(), qp::kPmState, kPmMigrated);
  putField(in.data(), qp::kPd, pdn);
  putField(in.data(), qp::kUarPage, uarPage);
  putField(in.data(), qp::kCqnSnd, cqn);
  putField(in.data(), qp::kCqnRcv, cqn);
  putField(in.data(), qp::kLogSqSize, logSq);
  putField(in.data(), qp::kRqType, kRqZeroLength);
  putField(in.data(), qp::kLogRqSize, 0);
  putField(in.data(), qp::kTimestampFormat, kTimestampDefault);
  putField(in.data(), qp::kLogPageSize, 0);
  putField(in.data(), qp::kPageOffset, 0);
  putField(in.data(), qp::kWqUmemValid, 1);
  putField(in.data(), qp::kWqUmemId, sq.umem);
  putField(in.data(), qp::kWqUmemOffset, sq.offset);
  putField(in.data(), qp::kDbrUmemValid, 1);
  putField(in.data(), qp::kDbrUmemId, dbr.umem);
  putField(in.data(), qp::kDbrAddr, dbr.offset);
  return in;
}

inline In modifyQp(uint16_t opcode, uint32_t qpn) {
  In in{};
  putField(in.data(), kOpcode, opcode);
  putField(in.data(), qp::kQpn, qpn);
  return in;
}

// RST2INIT: remote read, write and 8-byte atomics granted; port `port`.
inline In rst2Init(uint32_t qpn, uint32_t port) {
  In in = modifyQp(kRst2InitQp, qpn);
  putField(in.data(), qp::kPmState, kPmMigrated);
  putField(in.data(), qp::kPkeyIndex, 0);
  putField(in.data(), qp::kVhcaPort, port);
  putField(in.data(), qp::kRre, 1);
  putField(in.data(), qp::kRwe, 1);
  putField(in.data(), qp::kRae, 1);
  putField(in.data(), qp::kAtomicMode, kAtomicUpTo8B);
  return in;
}

// The remote end of an RC connection as INIT2RTR needs it.
struct Path {
  uint32_t remoteQpn = 0, rcvPsn = 0;
  uint32_t mtu = 0;        // IB encoding (1 = 256 ... 5 = 4096)
  uint32_t logMsgMax = 0;  // log2 of the largest message
  uint32_t logRraMax = 0;  // log2 of the RDMA reads/atomics a peer may have in flight here
  uint32_t minRnrNak = 0;  // min_rnr_nak (ibv's min_rnr_timer encoding)
  uint32_t port = 0;
  bool grh = false;  // RoCE: GRH with the fields below; InfiniBand: the LID
  uint16_t rlid = 0;
  uint32_t srcAddrIndex = 0, hopLimit = 0, udpSport = 0;
  uint8_t rgid[16] = {};
  uint8_t rmac[6] = {};
};

inline In init2Rtr(uint32_t qpn, const Path& p) {
  In in = modifyQp(kInit2RtrQp, qpn);
  putField(in.data(), qp::kMtu, p.mtu);
  putField(in.data(), qp::kLogMsgMax, p.logMsgMax);
  putField(in.data(), qp::kRemoteQpn, p.remoteQpn);
  putField(in.data(), qp::kNextRcvPsn, p.rcvPsn);
  putField(in.data(), qp::kLogRraMax, p.logRraMax);
  putField(in.data(), qp::kMinRnrNak, p.minRnrNak);
  putField(in.data(), qp::kVhcaPort, p.port);
  if (p.grh) {
    putField(in.data(), qp::kGrh, 1);
    putField(in.data(), qp::kSrcAddrIndex, p.srcAddrIndex);
    putField(in.data(), qp::kHopLimit, p.hopLimit);
    putField(in.data(), qp::kUdpSport, p.udpSport);
    std::memcpy(in.data() + qp::kRgid / 8, p.rgid, 16);
    std::memcpy(in.data() + qp::kRmac / 8, p.rmac, 6);
  } else {
    putField(in.data(), qp::kRlid, p.rlid);
  }
  return in;
}

// RTR2RTS: up to 2^logSraMax reads/atomics in flight, the ack timeout
// (4.096 us * 2^ackTimeout), transport and RNR retry counts (IB encodings).
inline In rtr2Rts(uint32_t qpn, uint32_t sendPsn, uint32_t logSraMax, uint32_t ackTimeout, uint32_t retry,
                  uint32_t rnrRetry) {
  In in = modifyQp(kRtr2RtsQp, qpn);
  putField(in.data(), qp::kNextSendPsn, sendPsn);
  putField(in.data(), qp::kLogSraMax, logSraMax);
  putField(in.data(), qp::kRetryCount, retry);
  putField(in.data(), qp::kRnrRetry, rnrRetry);
  putField(in.data(), qp::kAckTimeout, ackTimeout);
  return in;
}

}  // namespace gin::mlx5cmd
