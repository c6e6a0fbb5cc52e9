// GPU suite: MoE dispatch/combine (gin::ep) on 1, 2 and 4 ranks (ranks
// share GPUs round-robin when there are fewer; each rank runs on its own
// non-blocking stream), normal and low-latency modes, over lsa and the proxy,
// checked against the host reference. Skips (exit 77) without a GPU.
#include <catch2/catch_session.hpp>
#include <catch2/catch_test_macros.hpp>

#include <cmath>

#include "gin/ep/cpu.hpp"
#include "gin/ep/gpu.hpp"
#include "gpu_common.cuh"

using namespace gin;
using gputest::expect;

namespace {
void check(const gin::ep::Shape& sh, bool ll, TransportChoice tr, double noExpert = 0) {
  CommConfig cfg = gputest::gpuConfig();
  cfg.transport = tr;
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  gputest::runRanksOnStreams(
      sh.ranks,
      [&](Comm& comm, cudaStream_t st) {
        gin::ep::GpuLayer layer(comm, sh, ll, st);
        for (int round = 0; round < 2; ++round) {
          const gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 91 + uint64_t(round), noExpert);
          const std::vector<float> out = layer.run(in);
          size_t first = 0;
          const size_t bad = gin::ep::mismatches(out, gin::ep::reference(sh, in), &first);
          expect(bad == 0, "rank " + std::to_string(comm.rank()) + " round " + std::to_string(round) + ": " +
                               std::to_string(bad) + " wrong outputs, first at " + std::to_string(first));
        }
      },
      cfg);
}
}  // namespace

TEST_CASE("GPU moe: normal and low-latency modes match the host reference", "[gpu][moe]") {
  for (int ranks : {1, 2, 4})
    for (TransportChoice tr : {TransportChoice::Lsa, TransportChoice::Proxy}) {
      if (ranks > gputest::maxRanks()) continue;
      if (!gputest::queuesFor(ranks)) {
        WARN(ranks << " ranks in one process need " << ranks + 1 << " hardware queues; CUDA_DEVICE_MAX_CONNECTIONS="
                   << gputest::hardwareQueues());
        continue;
      }
      gin::ep::Shape sh;
      sh.ranks = ranks;
      sh.experts = 16;
      sh.hidden = 7168;
      sh.topk = 8;
      sh.channels = 4;
      sh.slots = 4;
      for (int tokens : {0, 1, 131})
        for (int batch : {1, 3, 6}) {  // tails/heads per token, every 3 slots, more than the ring's 4
          sh.tokens = tokens;
          sh.batch = batch;
          CAPTURE(ranks, tokens, batch, int(tr));
          CHECK_NOTHROW(check(sh, false, tr));
        }
      sh.batch = 1;
      sh.tokens = 128;
      CAPTURE(ranks, int(tr));
      CHECK_NOTHROW(check(sh, true, tr));
      // A third of the choices are -1 (no expert): both modes skip them.
      CHECK_NOTHROW(check(sh, false, tr, 0.33));
      CHECK_NOTHROW(check(sh, true, tr, 0.33));
    }
}

int main(int argc, char** argv) {
  gputest::widenQueues();  // before CUDA starts
  if (gputest::gpuCount() == 0) return gputest::skipNoGpu("GPU moe suite");
  return Catch::Session().run(argc, argv);
}
