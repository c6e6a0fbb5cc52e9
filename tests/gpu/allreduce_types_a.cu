// The GPU AllReduce suite's kernels for float and gin::coll::Half (allreduce_cases.cuh).
// One-shot calls here read 2 us late on one rank per call (a test-only hook
// in gin/device/allreduce.hpp), so a slot overwritten too early shows.
#define GIN_ALLREDUCE_TEST_READ_DELAY_NS 2000
#include "allreduce_cases.cuh"

namespace gputest::ar {
GIN_AR_ALLOPS(float);
GIN_AR_ALLOPS(gin::coll::Half);

PathCounts backToBack(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, size_t maxCount, int calls,
                      coll::RingTuning (*tuning)(int), std::vector<std::vector<uint8_t>>& results) {
  const int me = comm.rank();
  const size_t stride = maxCount * 4 + 64;  // 64 guard bytes after each output
  const Window send = comm.allocWindow(stride * size_t(calls)), recv = comm.allocWindow(stride * size_t(calls));
  std::vector<size_t> count(static_cast<size_t>(calls));
  std::vector<uint8_t> h(stride * size_t(calls), kPoison);
  for (int k = 0; k < calls; ++k) {
    count[size_t(k)] = k % 5 == 4 ? maxCount : 1 + size_t(k) * 7919 % maxCount;
    float* in = reinterpret_cast<float*>(h.data() + size_t(k) * stride);
    for (size_t i = 0; i < count[size_t(k)]; ++i) in[i] = input<float, coll::Sum>(uint64_t(k), me, i);
  }
  GPU_CHECK(cudaMemcpy(comm.localPointer(send), h.data(), h.size(), cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemset(comm.localPointer(recv), kPoison, h.size()));
  GPU_CHECK(cudaDeviceSynchronize());
  comm.bootstrap().barrier();
  PathCounts paths;
  for (int k = 0; k < calls; ++k) {  // every third call in place
    const coll::RingPlan plan = coll::planRingAllReduce(comm, ws, count[size_t(k)], 4, tuning(k));
    int& path = plan.ll ? paths.ll : plan.shot ? paths.shot : plan.direct ? paths.direct : paths.ring;
    ++path;
    coll::launchRingAllReduce<float, coll::Sum>(comm, ws, plan, send, size_t(k) * stride, k % 3 == 2 ? send : recv,
                                                size_t(k) * stride, st);
  }
  const cudaError_t e = cudaStreamSynchronize(st);
  comm.check();
  GPU_CHECK(e);
  std::vector<uint8_t> o(h.size()), oi(h.size());
  GPU_CHECK(cudaMemcpy(o.data(), comm.localPointer(recv), o.size(), cudaMemcpyDeviceToHost));
  GPU_CHECK(cudaMemcpy(oi.data(), comm.localPointer(send), oi.size(), cudaMemcpyDeviceToHost));
  std::vector<uint8_t> all;
  for (int k = 0; k < calls; ++k) {
    const uint8_t* out = (k % 3 == 2 ? oi.data() : o.data()) + size_t(k) * stride;
    const size_t bytes = count[size_t(k)] * 4;
    const std::string what = "back-to-back call " + std::to_string(k) + " of " + std::to_string(count[size_t(k)]);
    check<float, coll::Sum>(reinterpret_cast<const float*>(out), comm.nRanks(), count[size_t(k)], uint64_t(k), what);
    bool guard = true;
    for (size_t i = bytes; i < stride; ++i) guard &= out[i] == kPoison;
    expect(guard, what + ": wrote past its output");
    all.insert(all.end(), out, out + bytes);
  }
  results[size_t(me)] = std::move(all);
  comm.bootstrap().barrier();
  for (int r = 0; r < comm.nRanks(); ++r)
    expect(results[size_t(r)] == results[size_t(me)],
           "back-to-back: ranks " + std::to_string(r) + " and " + std::to_string(me) + " disagree bitwise");
  comm.bootstrap().barrier();
  comm.deregisterWindow(send);
  comm.deregisterWindow(recv);
  return paths;
}
}  // namespace gputest::ar
