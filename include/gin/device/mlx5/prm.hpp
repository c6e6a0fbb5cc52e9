// gin/device/mlx5/prm.hpp — the mlx5 wire formats gin emits and reads: send WQE
// segments (control, remote address, data, inline data, atomic) and the 64-byte
// CQE, in the big-endian layout of the ConnectX programmer's reference manual.
//
// Shared by the device side of the ibgda transport (builds WQEs, parses CQEs),
// the host and the soft NIC (parses WQEs, builds CQEs). No rdma-core dependency;
// tests/device/mlx5_prm.cpp checks every builder byte for byte against
// rdma-core's own helpers and structs in <infiniband/mlx5dv.h>.
//
// Every multi-byte field is stored big-endian. The structs hold the stored
// (wire) value; builders take host values and parsers return host values. gin
// runs on little-endian agents only (x86-64, aarch64, NVIDIA GPUs).
#pragma once

#include "gin/core/config.hpp"

namespace gin::mlx5 {

#if !GIN_DEVICE_CODE && defined(__BYTE_ORDER__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "gin's mlx5 code assumes a little-endian host");
#endif

// Byte swaps written as shifts: host compilers turn them into bswap, nvcc into prmt.
GIN_HD constexpr uint16_t bswap16(uint16_t v) { return uint16_t((v >> 8) | (v << 8)); }
GIN_HD constexpr uint32_t bswap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
}
GIN_HD constexpr uint64_t bswap64(uint64_t v) {
  return (uint64_t(bswap32(uint32_t(v))) << 32) | bswap32(uint32_t(v >> 32));
}

// Send opcodes (control segment, low byte of opmod_idx_opcode).
enum Opcode : uint8_t {
  kOpNop = 0x00,
  kOpRdmaWrite = 0x08,
  kOpRdmaWriteImm = 0x09,
  kOpAtomicCs = 0x11,
  kOpAtomicFa = 0x12,
};

// fm_ce_se byte of the control segment.
inline constexpr uint8_t kCtrlSolicited = 1u << 1;  // solicited event at the responder
inline constexpr uint8_t kCtrlCqUpdate = 2u << 2;   // write a CQE when this WQE completes
// Fence mode (bits 7..5). kCtrlFence is what libmlx5 emits for IBV_SEND_FENCE:
// the WQE waits for earlier RDMA reads and atomics of the QP to complete.
inline constexpr uint8_t kCtrlFence = 4u << 5;

inline constexpr uint32_t kInlineSeg = 0x80000000u;  // inline data segment marker in byte_count
inline constexpr uint32_t kSendWqeBB = 64;           // a WQE basic block
inline constexpr uint32_t kDsBytes = 16;             // ds counts 16-byte units
// The most bytes a data (gather) segment can describe: its byte count has 31
// bits, because bit 31 is kInlineSeg and a NIC would read the segment as
// inline data. (A port's max_msg_sz is usually lower still: 1 GiB on ConnectX.)
inline constexpr uint32_t kMaxDataSegBytes = kInlineSeg - 1;

// CQE opcodes (high nibble of op_own).
enum CqeOpcode : uint8_t {
  kCqeReq = 0,      // requester completion
  kCqeReqErr = 13,  // requester error: syndrome says why
  kCqeRespErr = 14,
  kCqeInvalid = 15,  // what software initialises a CQE to (never written by a NIC)
};

// Error CQE syndromes (the ones the soft NIC produces, and the usual others).
enum Syndrome : uint8_t {
  kSynLocalLengthErr = 0x01,
  kSynLocalQpOpErr = 0x02,
  kSynLocalProtErr = 0x04,
  kSynWrFlushErr = 0x05,
  kSynBadRespErr = 0x10,
  kSynLocalAccessErr = 0x11,
  kSynRemoteInvalReqErr = 0x12,
  kSynRemoteAccessErr = 0x13,
  kSynRemoteOpErr = 0x14,
  kSynTransportRetryExcErr = 0x15,
  kSynRnrRetryExcErr = 0x16,
  kSynRemoteAbortedErr = 0x22,
};

// Their names, for error messages (the values of MLX5_CQE_SYNDROME_* in mlx5dv.h).
GIN_HD inline const char* cqeSyndromeName(uint32_t s) {
  switch (s) {
    case 0x01: return "local length error";
    case 0x02: return "local QP operation error (malformed WQE: opcode, size or index)";
    case 0x04: return "local protection error (bad lkey, or local address outside its region)";
    case 0x05: return "work request flushed (QP in error)";
    case 0x06: return "memory window bind error";
    case 0x10: return "bad response";
    case 0x11: return "local access error";
    case 0x12: return "remote invalid request (bad opcode, size or alignment)";
    case 0x13: return "remote access error (bad rkey, or remote address outside the peer's region)";
    case 0x14: return "remote operation error";
    case 0x15: return "transport retry counter exceeded";
    case 0x16: return "RNR retry counter exceeded";
    case 0x22: return "remote aborted";
  }
  return "unknown syndrome";
}

// ---- send WQE segments (each 16 bytes) ----

struct CtrlSeg {
  uint32_t opmodIdxOpcode;  // opmod << 24 | wqe index << 8 | opcode
  uint32_t qpnDs;           // qpn << 8 | ds (16-byte units in the WQE, control included)
  uint8_t signature;
  uint8_t dciStreamChannelId[2];
  uint8_t fmCeSe;  // kCtrlFence | kCtrlCqUpdate | kCtrlSolicited
  uint32_t imm;    // stored as given (RDMA_WRITE_IMM: the immediate, already big-endian)
};

struct RaddrSeg {
  uint64_t raddr;
  uint32_t rkey;
  uint32_t reserved;
};

struct DataSeg {
  uint32_t byteCount;
  uint32_t lkey;
  uint64_t addr;
};

// Inline data: the 4-byte header (byte count | kInlineSeg), then the bytes,
// padded to a 16-byte boundary.
struct InlineSeg {
  uint32_t byteCount;
};

// Atomic operands, in network byte order. Fetch-add: swapAdd is the addend
// (compare unused). Compare-and-swap: swapAdd is the new value, compare the
// expected one. The value fetched lands at the WQE's data segment.
struct AtomicSeg {
  uint64_t swapAdd;
  uint64_t compare;
};

static_assert(sizeof(CtrlSeg) == 16 && sizeof(RaddrSeg) == 16 && sizeof(DataSeg) == 16 && sizeof(AtomicSeg) == 16,
              "mlx5 WQE segments are 16 bytes");

GIN_HD GIN_INLINE CtrlSeg makeCtrl(uint16_t wqeIndex, uint8_t opcode, uint8_t opmod, uint32_t qpn, uint8_t ds,
                                   uint8_t fmCeSe, uint32_t imm = 0, uint8_t signature = 0) {
  CtrlSeg s{};
  s.opmodIdxOpcode = bswap32((uint32_t(opmod) << 24) | (uint32_t(wqeIndex) << 8) | opcode);
  s.qpnDs = bswap32((qpn << 8) | ds);
  s.signature = signature;
  s.fmCeSe = fmCeSe;
  s.imm = imm;
  return s;
}
GIN_HD GIN_INLINE uint8_t ctrlOpcode(const CtrlSeg& s) { return uint8_t(bswap32(s.opmodIdxOpcode)); }
GIN_HD GIN_INLINE uint16_t ctrlWqeIndex(const CtrlSeg& s) { return uint16_t(bswap32(s.opmodIdxOpcode) >> 8); }
GIN_HD GIN_INLINE uint8_t ctrlOpmod(const CtrlSeg& s) { return uint8_t(bswap32(s.opmodIdxOpcode) >> 24); }
GIN_HD GIN_INLINE uint32_t ctrlQpn(const CtrlSeg& s) { return bswap32(s.qpnDs) >> 8; }
GIN_HD GIN_INLINE uint8_t ctrlDs(const CtrlSeg& s) { return uint8_t(bswap32(s.qpnDs)); }

GIN_HD GIN_INLINE RaddrSeg makeRaddr(uint64_t raddr, uint32_t rkey) {
  RaddrSeg s{};
  s.raddr = bswap64(raddr);
  s.rkey = bswap32(rkey);
  return s;
}
GIN_HD GIN_INLINE uint64_t raddrAddr(const RaddrSeg& s) { return bswap64(s.raddr); }
GIN_HD GIN_INLINE uint32_t raddrKey(const RaddrSeg& s) { return bswap32(s.rkey); }

GIN_HD GIN_INLINE DataSeg makeData(uint32_t bytes, uint32_t lkey, uint64_t addr) {
  DataSeg s{};
  s.byteCount = bswap32(bytes);
  s.lkey = bswap32(lkey);
  s.addr = bswap64(addr);
  return s;
}
GIN_HD GIN_INLINE uint32_t dataBytes(const DataSeg& s) { return bswap32(s.byteCount); }
GIN_HD GIN_INLINE uint32_t dataKey(const DataSeg& s) { return bswap32(s.lkey); }
GIN_HD GIN_INLINE uint64_t dataAddr(const DataSeg& s) { return bswap64(s.addr); }

GIN_HD GIN_INLINE InlineSeg makeInline(uint32_t bytes) { return InlineSeg{bswap32(bytes | kInlineSeg)}; }
GIN_HD GIN_INLINE bool isInline(uint32_t storedByteCount) { return (bswap32(storedByteCount) & kInlineSeg) != 0; }
GIN_HD GIN_INLINE uint32_t inlineBytes(const InlineSeg& s) { return bswap32(s.byteCount) & ~kInlineSeg; }

GIN_HD GIN_INLINE AtomicSeg makeFetchAdd(uint64_t add) { return AtomicSeg{bswap64(add), 0}; }
GIN_HD GIN_INLINE AtomicSeg makeCompareSwap(uint64_t compare, uint64_t swap) {
  return AtomicSeg{bswap64(swap), bswap64(compare)};
}
GIN_HD GIN_INLINE uint64_t atomicSwapAdd(const AtomicSeg& s) { return bswap64(s.swapAdd); }
GIN_HD GIN_INLINE uint64_t atomicCompare(const AtomicSeg& s) { return bswap64(s.compare); }

// WQE sizes in 16-byte units (ds) for the shapes gin posts; each fits one 64-byte BB.
inline constexpr uint8_t kDsWrite = 3;   // ctrl + raddr + data
inline constexpr uint8_t kDsAtomic = 4;  // ctrl + raddr + atomic + data (where the fetched value goes)
inline constexpr uint8_t kDsNop = 1;     // ctrl
GIN_HD constexpr uint8_t dsInline(uint32_t bytes) { return uint8_t((16 + 16 + 4 + bytes + 15) / 16); }
inline constexpr uint32_t kMaxInlineInOneBB = kSendWqeBB - 16 - 16 - 4;  // 28 bytes

// ---- the 64-byte CQE ----
//
// Byte offsets of the fields gin reads and the soft NIC writes (struct
// mlx5_cqe64 and struct mlx5_err_cqe in mlx5dv.h).
struct Cqe64 {
  uint8_t b[64];
};
static_assert(sizeof(Cqe64) == 64);
inline constexpr int kCqeByteCnt = 44;         // __be32: bytes transferred (responder) / 0
inline constexpr int kCqeVendorSyndrome = 54;  // error CQE
inline constexpr int kCqeSyndrome = 55;        // error CQE
inline constexpr int kCqeSopDropQpn = 56;      // __be32: (error CQE: WQE opcode << 24) | qpn
inline constexpr int kCqeWqeCounter = 60;      // __be16: index of the completed WQE
inline constexpr int kCqeSignature = 62;
inline constexpr int kCqeOpOwn = 63;  // opcode << 4 | format << 2 | solicited event << 1 | owner

// What software writes into every CQE before handing the CQ to the NIC: an
// invalid opcode with owner 1, which a first-pass poll (expects owner 0) skips.
inline constexpr uint8_t kCqeInitOpOwn = uint8_t(kCqeInvalid << 4) | 1u;

namespace detail {
GIN_HD GIN_INLINE uint32_t loadBe32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
GIN_HD GIN_INLINE void storeBe32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24), p[1] = uint8_t(v >> 16), p[2] = uint8_t(v >> 8), p[3] = uint8_t(v);
}
}  // namespace detail

GIN_HD GIN_INLINE uint8_t cqeOwner(uint8_t opOwn) { return opOwn & 1u; }
GIN_HD GIN_INLINE uint8_t cqeOpcode(uint8_t opOwn) { return uint8_t(opOwn >> 4); }
// The CQE format (mlx5dv_get_cqe_format): 0 plain; 1 and 2 (MLX5_INLINE_SCATTER_32
// and _64) mean data was scattered to the CQE, and the completion fields gin
// reads stay where they are; kCqeFormatCompressed marks a mini-CQE array of a
// compression session (a CQ created with CQE compression): several
// completions packed into 64 bytes that are not a CQE at all.
inline constexpr uint8_t kCqeFormatCompressed = 3;
GIN_HD GIN_INLINE uint8_t cqeFormat(uint8_t opOwn) { return uint8_t((opOwn >> 2) & 3u); }
GIN_HD GIN_INLINE uint16_t cqeWqeCounter(const Cqe64& c) {
  return uint16_t((uint32_t(c.b[kCqeWqeCounter]) << 8) | c.b[kCqeWqeCounter + 1]);
}
GIN_HD GIN_INLINE uint8_t cqeSyndrome(const Cqe64& c) { return c.b[kCqeSyndrome]; }
GIN_HD GIN_INLINE uint8_t cqeVendorSyndrome(const Cqe64& c) { return c.b[kCqeVendorSyndrome]; }
GIN_HD GIN_INLINE uint32_t cqeQpn(const Cqe64& c) { return detail::loadBe32(c.b + kCqeSopDropQpn) & 0xffffffu; }
GIN_HD GIN_INLINE uint8_t cqeErrWqeOpcode(const Cqe64& c) { return c.b[kCqeSopDropQpn]; }
GIN_HD GIN_INLINE uint32_t cqeByteCount(const Cqe64& c) { return detail::loadBe32(c.b + kCqeByteCnt); }

// The owner bit a valid CQE at consumer index `ci` carries, for a CQ of nCqe
// (a power of two) entries: it flips on every pass over the queue.
GIN_HD constexpr uint8_t cqeExpectedOwner(uint64_t ci, uint32_t nCqe) { return uint8_t((ci & nCqe) ? 1 : 0); }

// Fill every field of a CQE except op_own, which the writer stores last (with
// release order) so a poller that sees the new owner bit sees the rest.
// Success: opcode kCqeReq, syndromes ignored. Error: kCqeReqErr with the
// syndrome and the failed WQE's opcode.
GIN_HD GIN_INLINE void fillCqe(Cqe64& c, uint16_t wqeCounter, uint32_t qpn, uint32_t byteCount, uint8_t syndrome = 0,
                               uint8_t vendorSyndrome = 0, uint8_t wqeOpcode = 0) {
  for (int i = 0; i < kCqeOpOwn; ++i) c.b[i] = 0;
  detail::storeBe32(c.b + kCqeByteCnt, byteCount);
  c.b[kCqeVendorSyndrome] = vendorSyndrome;
  c.b[kCqeSyndrome] = syndrome;
  detail::storeBe32(c.b + kCqeSopDropQpn, (uint32_t(wqeOpcode) << 24) | (qpn & 0xffffffu));
  c.b[kCqeWqeCounter] = uint8_t(wqeCounter >> 8);
  c.b[kCqeWqeCounter + 1] = uint8_t(wqeCounter);
}
GIN_HD constexpr uint8_t makeOpOwn(uint8_t cqeOpcode, uint8_t owner) {
  return uint8_t((cqeOpcode << 4) | (owner & 1u));
}

// The doorbell record: two big-endian words, [0] receive counter, [1] send
// counter (the SQ producer index, modulo 2^16).
inline constexpr int kDbrRecv = 0;
inline constexpr int kDbrSend = 1;

}  // namespace gin::mlx5
