// The cases of the GPU AllReduce suite (tests/gpu/allreduce.cu), shared by
// its translation units: allOps<T> runs every op of one element type. Each
// type is instantiated (explicitly) in one of allreduce_types_*.cu, so the
// suite's kernels (4 per type and op) compile in parallel units.
#pragma once

#include <string>
#include <vector>

#include "../common/allreduce_ref.hpp"
#include "gpu_common.cuh"

namespace gputest::ar {

using namespace gin;
using namespace gintest::arref;
using gputest::expect;

struct Bufs {
  Window send, recv;
  size_t bytes;
};

template <class T, class Op>
void gpuCase(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, const Bufs& b, size_t count,
             const coll::RingTuning& tune, bool inPlace, uint64_t seed, std::vector<std::vector<uint8_t>>& results,
             const std::string& what) {
  const int me = comm.rank();
  std::vector<uint8_t> h(b.bytes, kPoison);
  T* in = reinterpret_cast<T*>(h.data() + kHead);
  for (size_t i = 0; i < count; ++i) in[i] = input<T, Op>(seed, me, i);
  GPU_CHECK(cudaMemcpy(comm.localPointer(b.send), h.data(), b.bytes, cudaMemcpyHostToDevice));
  GPU_CHECK(cudaMemset(comm.localPointer(b.recv), kPoison, b.bytes));
  const Window rw = inPlace ? b.send : b.recv;
  const coll::RingPlan plan = coll::planRingAllReduce(comm, ws, count, sizeof(T), tune);  // LL only over lsa
  GPU_CHECK(cudaDeviceSynchronize());
  comm.bootstrap().barrier();
  coll::launchRingAllReduce<T, Op>(comm, ws, plan, b.send, kHead, rw, kHead, st);
  const cudaError_t e = cudaStreamSynchronize(st);
  comm.check();
  GPU_CHECK(e);
  std::vector<uint8_t> o(b.bytes);
  GPU_CHECK(cudaMemcpy(o.data(), comm.localPointer(rw), b.bytes, cudaMemcpyDeviceToHost));
  bool poison = true;
  for (size_t i = 0; i < kHead; ++i) poison &= o[i] == kPoison;
  for (size_t i = kHead + count * sizeof(T); i < b.bytes; ++i) poison &= o[i] == kPoison;
  expect(poison, what + ": wrote outside the output (" + coll::describe(plan) + ")");
  if (!inPlace) {
    std::vector<uint8_t> s(b.bytes);
    GPU_CHECK(cudaMemcpy(s.data(), comm.localPointer(b.send), b.bytes, cudaMemcpyDeviceToHost));
    expect(s == h, what + ": the input changed (out of place)");
  }
  check<T, Op>(reinterpret_cast<const T*>(o.data() + kHead), comm.nRanks(), count, seed,
               what + " (" + coll::describe(plan) + ")");
  results[size_t(me)].assign(o.begin() + kHead, o.begin() + long(kHead + count * sizeof(T)));
  comm.bootstrap().barrier();
  for (int r = 0; r < comm.nRanks(); ++r)
    expect(results[size_t(r)] == results[size_t(me)],
           what + ": ranks " + std::to_string(r) + " and " + std::to_string(me) + " disagree bitwise");
  comm.bootstrap().barrier();
}

template <class T>
void allOps(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, const Bufs& b,
            const std::vector<size_t>& counts, const coll::RingTuning& t, bool inPlace,
            std::vector<std::vector<uint8_t>>& results, const std::string& at) {
  for (size_t count : counts) {
    const std::string w = at + " count " + std::to_string(count) + " n " + std::to_string(comm.nRanks());
    gpuCase<T, coll::Sum>(comm, st, ws, b, count, t, inPlace, count * 4 + 1, results, "sum " + w);
    gpuCase<T, coll::Prod>(comm, st, ws, b, count, t, inPlace, count * 4 + 2, results, "prod " + w);
    gpuCase<T, coll::Min>(comm, st, ws, b, count, t, inPlace, count * 4 + 3, results, "min " + w);
    gpuCase<T, coll::Max>(comm, st, ws, b, count, t, inPlace, count * 4 + 4, results, "max " + w);
  }
}

// `calls` float-sum AllReduces queued back to back on the stream with no
// synchronization or barrier between them (the path's own flags keep calls
// apart): call k reads its own input (seed k) at send + k x stride and
// writes recv + k x stride (every third call: in place), sizes change
// every call up to maxCount, and
// tuning(k) picks the path; then every result is checked and must agree
// bitwise across ranks. Returns how many calls took each path.
struct PathCounts {
  int ll = 0, shot = 0, direct = 0, ring = 0;
};
PathCounts backToBack(Comm& comm, cudaStream_t st, const coll::RingWorkspace& ws, size_t maxCount, int calls,
                      coll::RingTuning (*tuning)(int), std::vector<std::vector<uint8_t>>& results);

// One explicit instantiation per type, each in its own unit.
#define GIN_AR_ALLOPS(T)                                                                          \
  template void allOps<T>(gin::Comm&, cudaStream_t, const gin::coll::RingWorkspace&, const Bufs&, \
                          const std::vector<size_t>&, const gin::coll::RingTuning&, bool,         \
                          std::vector<std::vector<uint8_t>>&, const std::string&)
extern GIN_AR_ALLOPS(float);
extern GIN_AR_ALLOPS(gin::coll::Half);
extern GIN_AR_ALLOPS(gin::coll::BFloat16);
extern GIN_AR_ALLOPS(double);
extern GIN_AR_ALLOPS(int32_t);
extern GIN_AR_ALLOPS(int64_t);

}  // namespace gputest::ar
