// gin/core/error.hpp — how gin reports failure.
//
// Host code throws gin::Error (a std::runtime_error whose message says what went
// wrong, where, and what to do). Device code cannot throw: a wait that gives up,
// or an operation that cannot be carried out, fills the DeviceErrorRecord once
// (first writer wins), raises the abort flag so every other wait returns, and
// the host turns the record into a gin::Error (Comm::check()).
#pragma once

#include "gin/core/config.hpp"

// Host-only declarations below stay visible in nvcc's device pass (it parses
// host code too); they are never called from device code.
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace gin {

// What a device-side operation was doing when it failed.
enum class Op : uint32_t {
  None = 0,
  WaitSignal,
  WaitCounter,
  WaitShadow,
  LsaBarrier,
  WorldBarrier,
  RailBarrier,
  Put,
  Signal,
  BadArgument,
  NoTransport,
  ProxyFull,      // a producer waited for a free slot in a proxy ring
  ProxyFlush,     // flush waited for the proxy engine to consume descriptors
  ProxyEngine,    // the proxy engine stopped on an internal failure
  PeerLost,       // the network connection to a peer closed or failed (tcp wire)
  WireFrame,      // a frame from a peer was malformed and rejected (tcp wire)
  LlWait,         // an LL packet reader waited for the round's flag (gin/device/ll.hpp)
  P2pSend,        // p2p send waited for the receiver to free a FIFO slot (gin/device/p2p.hpp)
  P2pRecv,        // p2p recv waited for the sender to fill a FIFO slot
  IbgdaFull,      // a producer waited for free WQE slots (or for earlier posts to be published)
  IbgdaFlush,     // flush waited for completions of posted WQEs
  IbgdaCqe,       // the NIC completed a WQE with an error (syndrome in the record)
  AllReduceSend,  // ring AllReduce waited for the next rank to free a temporary slot (gin/device/allreduce.hpp)
  AllReduceRecv,  // ring AllReduce waited for a neighbour's data
  // The ibgda poller met a compressed CQE (a mini-CQE array), which it cannot parse.
  IbgdaCqeCompressed,
  // A wait stopped because another rank of the communicator failed first
  // (peer: that rank; objectId: the Op of the wait; expected: its id).
  PeerFailed,
  // The ibgda transport's soft NIC thread stopped (its reason printed to stderr).
  IbgdaNic,
};

// Why the tcp wire rejected a frame (DeviceErrorRecord::objectId for Op::WireFrame).
enum class WireFault : uint32_t {
  None = 0,
  BadMagic,         // not a gin wire frame: corrupt stream or another program
  BadVersion,       // the peer speaks another wire version (another gin release)
  HeaderChecksum,   // the header's checksum does not match its bytes
  BadType,          // unknown frame type
  BadSender,        // sender rank field differs from the connection's peer
  Sequence,         // frame sequence number skipped or repeated
  Reserved,         // a reserved field is not zero
  Oversized,        // payload length above the wire's maximum frame payload
  BadLength,        // payload length not allowed for the frame type
  BadAction,        // unknown signal action, or one the frame type cannot carry
  BadSignal,        // signal id past the receiver's signal words
  UnknownWindow,    // no window with that id on the receiver
  OutOfBounds,      // offset + length past the end of the window
  PayloadChecksum,  // the payload's checksum does not match its bytes
  BadFence,         // fence number out of order
};

GIN_HD inline const char* wireFaultName(WireFault f) {
  switch (f) {
    case WireFault::None: return "none";
    case WireFault::BadMagic: return "bad magic";
    case WireFault::BadVersion: return "unsupported wire version";
    case WireFault::HeaderChecksum: return "header checksum mismatch";
    case WireFault::BadType: return "unknown frame type";
    case WireFault::BadSender: return "sender rank does not match the connection";
    case WireFault::Sequence: return "sequence number out of order";
    case WireFault::Reserved: return "reserved field not zero";
    case WireFault::Oversized: return "oversized payload";
    case WireFault::BadLength: return "payload length not allowed for the frame type";
    case WireFault::BadAction: return "bad signal action";
    case WireFault::BadSignal: return "signal id out of range";
    case WireFault::UnknownWindow: return "unknown window";
    case WireFault::OutOfBounds: return "range past the end of the window";
    case WireFault::PayloadChecksum: return "payload checksum mismatch";
    case WireFault::BadFence: return "fence out of order";
  }
  return "unknown fault";
}

GIN_HD inline const char* opName(Op op) {
  switch (op) {
    case Op::None: return "none";
    case Op::WaitSignal: return "waitSignal";
    case Op::WaitCounter: return "waitCounter";
    case Op::WaitShadow: return "waitSignalShadow";
    case Op::LsaBarrier: return "lsaBarrier";
    case Op::WorldBarrier: return "worldBarrier";
    case Op::RailBarrier: return "railBarrier";
    case Op::Put: return "put";
    case Op::Signal: return "signal";
    case Op::BadArgument: return "badArgument";
    case Op::NoTransport: return "noTransport";
    case Op::ProxyFull: return "proxyRingFull";
    case Op::ProxyFlush: return "proxyFlush";
    case Op::ProxyEngine: return "proxyEngine";
    case Op::PeerLost: return "peerLost";
    case Op::WireFrame: return "wireFrame";
    case Op::LlWait: return "llWait";
    case Op::P2pSend: return "p2pSend";
    case Op::P2pRecv: return "p2pRecv";
    case Op::IbgdaFull: return "ibgdaQueueFull";
    case Op::IbgdaFlush: return "ibgdaFlush";
    case Op::IbgdaCqe: return "ibgdaCompletionError";
    case Op::AllReduceSend: return "allReduceSend";
    case Op::AllReduceRecv: return "allReduceRecv";
    case Op::IbgdaCqeCompressed: return "ibgdaCompressedCqe";
    case Op::PeerFailed: return "peerFailed";
    case Op::IbgdaNic: return "ibgdaNic";
  }
  return "unknown";
}

// The first device-side failure of a communicator. Lives in memory both the
// GPU and the host can read (mapped pinned memory; plain memory on CPU ranks).
// `state` goes 0 -> 1 (claimed, being written) -> 2 (complete).
struct DeviceErrorRecord {
  uint32_t state;
  uint32_t op;      // gin::Op
  int32_t rank;     // world rank that failed
  int32_t peer;     // world rank it was waiting on or talking to; -1: any/unknown
  int32_t context;  // network context index; -1: none
  uint32_t pad;
  uint64_t objectId;  // signal, counter or barrier index
  uint64_t expected;  // value waited for (or argument that was bad)
  uint64_t observed;  // value last seen (or limit it broke)
};

namespace detail {
// Names of mlx5 error-CQE syndromes (the values of MLX5_CQE_SYNDROME_* in
// mlx5dv.h). Here, not in device/mlx5/prm.hpp, because describe() needs them
// and core does not include device headers.
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
}  // namespace detail

// A failure reported to host code. `what()` is the whole message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error("gin: " + message) {}
};

inline std::string describe(const DeviceErrorRecord& r) {
  std::string s = "device error on rank " + std::to_string(r.rank) + ": " + opName(static_cast<Op>(r.op));
  const Op op = static_cast<Op>(r.op);
  if (op == Op::BadArgument) {
    s += " (argument check failed: value " + std::to_string(r.expected) + ", limit " + std::to_string(r.observed) +
         ", id " + std::to_string(r.objectId) + ")";
    return s;
  }
  if (op == Op::NoTransport) {
    s += " (no compiled-in transport reaches peer " + std::to_string(r.peer) +
         "; build the kernel with a backend mask that includes it)";
    return s;
  }
  if (op == Op::ProxyEngine) {
    s += " (the host proxy engine stopped; its message was printed to stderr)";
    return s;
  }
  if (op == Op::IbgdaNic) {
    s += " (the ibgda soft NIC stopped consuming work requests; its message was printed to stderr)";
    return s;
  }
  if (op == Op::PeerLost) {
    // objectId: errno of the failure (0: the peer closed without saying goodbye);
    // expected/observed: bytes of the frame in progress and bytes of it received.
    s += " (lost the connection to peer " + std::to_string(r.peer) + ": " +
         (r.objectId == 0 ? std::string("it closed the connection without a goodbye")
                          : std::string(std::strerror(int(r.objectId)))) +
         (r.expected != 0 ? "; " + std::to_string(r.observed) + " of the " + std::to_string(r.expected) +
                                " bytes of a frame had arrived and were discarded"
                          : std::string()) +
         ". Its process exited or crashed, or it rejected a frame of ours: look at its output)";
    return s;
  }
  if (op == Op::WireFrame) {
    s += " (rejected a frame from peer " + std::to_string(r.peer) + ": " +
         wireFaultName(static_cast<WireFault>(r.objectId)) + ", value " + std::to_string(r.expected) + ", limit " +
         std::to_string(r.observed) +
         "; nothing of it was written and nothing more from that peer is applied. The peer runs another gin "
         "version or the stream is corrupt; this rank's stderr shows the frame)";
    return s;
  }
  if (op == Op::ProxyFull || op == Op::ProxyFlush) {
    // A proxy wait depends on this rank's own engine, not on a peer.
    s +=
        " timed out on context " + std::to_string(r.context) + ": the proxy engine consumed " +
        std::to_string(r.observed) + " descriptors, " + std::to_string(r.expected) +
        " were needed. Is the engine running (Comm alive, not paused)? Raise CommConfig::timeoutNs if it is just slow.";
    return s;
  }
  if (op == Op::IbgdaCqe) {
    char hex[64];
    std::snprintf(hex, sizeof hex, "syndrome 0x%02x, vendor syndrome 0x%02x, QP 0x%06x", unsigned(r.expected),
                  unsigned(r.observed >> 32), unsigned(r.observed & 0xffffff));
    s += " on context " + std::to_string(r.context) + " to peer " + std::to_string(r.peer) + ": WQE index " +
         std::to_string(r.objectId) + " failed, " + hex + ": " + detail::cqeSyndromeName(uint32_t(r.expected)) +
         ". The QP is in error; nothing after that WQE was carried out.";
    return s;
  }
  if (op == Op::PeerFailed) {
    s += ": stopped its " + std::string(opName(static_cast<Op>(r.objectId))) + " on context " +
         std::to_string(r.context) + " (id " + std::to_string(r.expected) + ") because rank " + std::to_string(r.peer) +
         " failed first; rank " + std::to_string(r.peer) + "'s own error says what went wrong";
    return s;
  }
  if (op == Op::IbgdaCqeCompressed) {
    // objectId: the first WQE not known complete; expected: op_own; observed: CQ index.
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", unsigned(r.expected & 0xff));
    s += " on context " + std::to_string(r.context) + " to peer " + std::to_string(r.peer) + ": CQ index " +
         std::to_string(r.observed) + " holds a compressed CQE (op_own " + hex +
         ", format 3: a mini-CQE array), which gin cannot parse; whether WQE index " + std::to_string(r.objectId) +
         " and later ones completed is unknown, so this QP is no longer used. gin creates its CQs without CQE "
         "compression: the CQ was created or changed by other code (mlx5dv_create_cq with "
         "MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE), or its memory was overwritten.";
    return s;
  }
  if (op == Op::IbgdaFull || op == Op::IbgdaFlush) {
    s += " timed out on context " + std::to_string(r.context) + " to peer " + std::to_string(r.peer) +
         ": waited for WQE " + std::to_string(r.expected) + ", the QP had reached " + std::to_string(r.observed) +
         (op == Op::IbgdaFull ? " (free slots: completions, or earlier posts being published)" : " (completions)") +
         ". Is the NIC (soft NIC thread) running? Raise CommConfig::timeoutNs if it is just slow.";
    return s;
  }
  s += " timed out";
  if (r.peer >= 0) s += " waiting for peer " + std::to_string(r.peer);
  if (r.context >= 0) s += " on context " + std::to_string(r.context);
  s += ": id " + std::to_string(r.objectId) + ", expected " + std::to_string(r.expected) + ", observed " +
       std::to_string(r.observed) +
       ". A peer did not arrive or signal; check that every rank runs the matching "
       "operation, or raise CommConfig::timeoutNs.";
  return s;
}

}  // namespace gin
