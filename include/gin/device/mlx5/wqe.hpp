// gin/device/mlx5/wqe.hpp — what one send WQE asks of a NIC, read and checked
// as a ConnectX would before touching memory: the one WQE parser of both soft
// NICs (the host thread, gin/host/soft_nic.hpp, and the GPU NIC,
// gin/host/gpu_nic.hpp). Host and device code.
//
// decodeWqe checks the control segment (WQE index, QP number, ds), the
// opcode, and each shape's segment sizes; what it cannot check alone (keys
// and ranges: the NIC's memory regions) is left to the caller, which reports
// kSynLocalProtErr for a bad lkey or local range and kSynRemoteAccessErr for
// a bad rkey or remote range.
#pragma once

#include "gin/device/mlx5/prm.hpp"

namespace gin::mlx5 {

struct WqeRequest {
  enum Kind : uint8_t { Nop, Write, WriteInline, FetchAdd, CompareSwap, Bad };
  Kind kind = Bad;
  uint8_t opcode = 0;
  uint8_t syndrome = 0;  // Bad: the syndrome of the error CQE
  bool wantCqe = false;  // kCtrlCqUpdate
  uint32_t bytes = 0;    // Write, WriteInline: payload bytes; atomics: 8
  uint64_t raddr = 0;    // Write*, atomics: the target
  uint32_t rkey = 0;
  uint32_t lkey = 0;   // Write: the gather source; atomics: where the old value lands
  uint64_t laddr = 0;  //
  uint64_t swapAdd = 0, compare = 0;  // atomics, host values
};

// The inline payload of a WriteInline request starts this many bytes into the WQE.
inline constexpr uint32_t kInlinePayloadOffset = 36;

// Read the 64-byte WQE at `w` (already copied out of the send queue or read
// once: the producer may reuse the slot after completion) that should carry
// index `index` on QP `qpn`.
GIN_HD inline WqeRequest decodeWqe(const uint8_t* w, uint16_t index, uint32_t qpn) {
  WqeRequest r;
  CtrlSeg ctrl;
  __builtin_memcpy(&ctrl, w, sizeof ctrl);
  const uint8_t ds = ctrlDs(ctrl);
  r.opcode = ctrlOpcode(ctrl);
  r.wantCqe = (ctrl.fmCeSe & kCtrlCqUpdate) != 0;
  const auto bad = [&](uint8_t syndrome) {
    r.kind = WqeRequest::Bad;
    r.syndrome = syndrome;
    return r;
  };
  if (ctrlWqeIndex(ctrl) != index || ctrlQpn(ctrl) != qpn || ds == 0 || ds > 4) return bad(kSynLocalQpOpErr);
  switch (r.opcode) {
    case kOpNop: r.kind = WqeRequest::Nop; return r;
    case kOpRdmaWrite:
    case kOpRdmaWriteImm: {
      RaddrSeg rs;
      __builtin_memcpy(&rs, w + 16, 16);
      r.raddr = raddrAddr(rs);
      r.rkey = raddrKey(rs);
      uint32_t storedCount;
      __builtin_memcpy(&storedCount, w + 32, 4);
      if (isInline(storedCount)) {
        const uint32_t n = inlineBytes(InlineSeg{storedCount});
        if (n > kMaxInlineInOneBB || ds != dsInline(n)) return bad(kSynLocalQpOpErr);
        r.kind = WqeRequest::WriteInline;
        r.bytes = n;
        return r;
      }
      if (ds != kDsWrite) return bad(kSynLocalQpOpErr);
      DataSeg d;
      __builtin_memcpy(&d, w + 32, 16);
      r.kind = WqeRequest::Write;
      r.bytes = dataBytes(d);
      r.lkey = dataKey(d);
      r.laddr = dataAddr(d);
      return r;
    }
    case kOpAtomicFa:
    case kOpAtomicCs: {
      if (ds != kDsAtomic) return bad(kSynLocalQpOpErr);
      RaddrSeg rs;
      AtomicSeg a;
      DataSeg d;
      __builtin_memcpy(&rs, w + 16, 16);
      __builtin_memcpy(&a, w + 32, 16);
      __builtin_memcpy(&d, w + 48, 16);
      if (dataBytes(d) != 8) return bad(kSynLocalLengthErr);
      r.kind = r.opcode == kOpAtomicFa ? WqeRequest::FetchAdd : WqeRequest::CompareSwap;
      r.bytes = 8;
      r.raddr = raddrAddr(rs);
      r.rkey = raddrKey(rs);
      r.lkey = dataKey(d);
      r.laddr = dataAddr(d);
      r.swapAdd = atomicSwapAdd(a);
      r.compare = atomicCompare(a);
      return r;
    }
    default: return bad(kSynLocalQpOpErr);
  }
}

}  // namespace gin::mlx5
