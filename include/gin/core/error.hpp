// gin/core/error.hpp — how gin reports failure.
//
// Host code throws gin::Error (a std::runtime_error whose message says what went
// wrong, where, and what to do). Device code cannot throw: a wait that gives up,
// or an operation that cannot be carried out, fills the DeviceErrorRecord once
// (first writer wins), raises the abort flag so every other wait returns, and
// the host turns the record into a gin::Error (Comm::check(); the texts are in
// gin/host/error_text.hpp).
#pragma once

#include "gin/core/config.hpp"

// gin::Error stays visible in nvcc's device pass (it parses host code too);
// device code never uses it.
#include <stdexcept>
#include <string>

namespace gin {

// What a device-side operation was doing when it failed. The error record's code
// table: one list for every device writer and the host reader (describe()).
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
  // A rank's host code failed in the middle of a call whose GPU work the
  // other ranks wait for without the host (gin::ep's sync-free calls: an
  // allocation that threw); that rank's exception says what.
  CallAborted,
};

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
    case Op::CallAborted: return "callAborted";
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

// A failure reported to host code. `what()` is the whole message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error("gin: " + message) {}
};

}  // namespace gin
