// gin/host/wire.hpp — Wire, the interface through which the proxy engine
// moves bytes and signals to a peer (validate first; write nothing on
// refusal, saying why in a WireReject), and GpuCopier, the per-thread copier
// wires use for GPU windows.
#pragma once

#include <cstdint>

#include "gin/core/config.hpp"
#include "gin/device/transport/proxy.hpp"
#include "gin/host/side_context.hpp"

namespace gin {

// Why a wire refused an operation, in the error record's terms.
struct WireReject {
  uint64_t id = 0, value = 0, limit = 0;
};

// Where the bytes go: LocalWire (gin/host/local_wire.hpp), TcpWire
// (gin/host/tcp_wire.hpp), RoutedWire (gin/host/routed_wire.hpp), VerbsWire (gin/host/verbs_wire.hpp). Both calls
// validate first and write nothing when they return false. Each engine thread
// has a Wire object of its own (which may share a network wire with the
// others, so those must take calls from several threads at once) and calls it
// with the directory's mutex() held shared; when put returns, the source has
// been consumed (the engine then counts a CounterInc).
class Wire {
 public:
  virtual ~Wire() = default;
  // `src` is this rank's window memory (device memory on GPUs).
  virtual bool put(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* src, uint64_t bytes,
                   WireReject* why) = 0;
  // Like put, with the bytes (1..8) in host memory that is gone when the call
  // returns (putValue's value, carried in the descriptor).
  virtual bool putInline(int peer, uint32_t dstWindow, uint64_t dstOffset, const void* bytes, uint64_t n,
                         WireReject* why) {
    return put(peer, dstWindow, dstOffset, bytes, n, why);
  }
  virtual bool signal(int peer, uint32_t id, ProxyAction op, uint64_t value, WireReject* why) = 0;
  // Every put this object accepted so far (so: every put of the calling
  // engine thread) is complete: its bytes are at the target and its source
  // was read. Called by the engine thread before a signal or counter action
  // and before it publishes the consumer index.
  virtual void complete() {}
};

#if GIN_WITH_CUDA
// Copies into and between GPU windows for one host thread (an engine thread,
// the tcp wire's receiver): kernels of gin's side context (side_context.hpp),
// which never queue behind the user's kernels, so a kernel waiting for these
// copies cannot block them. Each thread has its own, so complete() waits for
// that thread's copies only. bind() makes the rank's GPU current for the
// thread's other CUDA calls.
class GpuCopier : public SideCopier {
 public:
  explicit GpuCopier(int device) : SideCopier(device) { bind(); }
  void bind() const { GIN_CUDA_CHECK(cudaSetDevice(device())); }
};
#endif

}  // namespace gin
