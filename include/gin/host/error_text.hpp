// gin/host/error_text.hpp — the text of a device error: describe() turns a
// DeviceErrorRecord (gin/core/error.hpp) into the message Comm::check() throws.
// Tests match substrings of these texts.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

#include "gin/core/error.hpp"
#include "gin/device/mlx5/prm.hpp"
#include "gin/host/tcp_frame.hpp"

namespace gin {

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
         std::to_string(r.objectId) + " failed, " + hex + ": " + mlx5::cqeSyndromeName(uint32_t(r.expected)) +
         ". The QP is in error; nothing after that WQE was carried out.";
    return s;
  }
  if (op == Op::CallAborted) {
    s += " (its host code failed in the middle of a call whose GPU work the other ranks wait for without the "
         "host: an allocation threw; that rank's exception says what. The communicator is stopped: make a new one)";
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
         ". Is the NIC (soft NIC thread) running? Is a gin::PostBatch on this context still open (its WQEs go "
         "to the NIC only when it closes: close it before waiting)? Raise CommConfig::timeoutNs if it is just slow.";
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
