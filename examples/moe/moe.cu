// moe — one expert-parallel layer of gin::ep (gin/ep/*.hpp): every rank makes
// tokens with top-k expert choices, dispatch sends each token to the ranks
// that host its experts, the experts run there, and combine brings the
// outputs back, summed with the routing weights. Each rank checks its result
// against a host reference computed from its own inputs.
//
// Runs on the GPUs when there are some (gin::ep::GpuLayer: kernels on one
// stream per rank, one thread per GPU) and on CPU ranks otherwise
// (gin::ep::CpuLayer: one thread per rank runs the same device bodies):
//   moe [--ranks N] [--cpu] [--mode normal|ll] [--tokens T] [--hidden H]
//       [--experts E] [--topk K]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/thread_ranks.hpp"
#include "gin/ep/cpu.hpp"
#include "gin/gin.hpp"
#if defined(__CUDACC__)
#include "gin/ep/gpu.hpp"
#endif

namespace {

// Runs one layer (twice: the second reuses the reset signals) on this rank;
// returns the number of wrong outputs.
size_t runRank(gin::Comm& comm, const gin::ep::Shape& sh, bool ll) {
  size_t wrong = 0, first = 0;
  auto check = [&](const gin::ep::Inputs& in, const std::vector<float>& out) {
    wrong += gin::ep::mismatches(out, gin::ep::reference(sh, in), &first);
  };
  if (comm.onGpu()) {
#if defined(__CUDACC__)
    cudaStream_t st = nullptr;
    GIN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    {
      gin::ep::GpuLayer layer(comm, sh, ll, st);
      for (int round = 0; round < 2; ++round) {
        const gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 1 + uint64_t(round));
        check(in, layer.run(in));
      }
    }
    (void)cudaStreamDestroy(st);
#endif
  } else {
    gin::ep::CpuLayer layer(comm, sh, ll);
    for (int round = 0; round < 2; ++round) {
      const gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 1 + uint64_t(round));
      check(in, layer.run(in));
    }
  }
  std::printf("rank %d (%s): %d tokens dispatched and combined twice: %s\n", comm.rank(),
              comm.onGpu() ? ("GPU " + std::to_string(comm.cudaDevice())).c_str() : "CPU", sh.tokens,
              wrong ? ("WRONG (" + std::to_string(wrong) + ", first at " + std::to_string(first) + ")").c_str()
                    : "ok");
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0, experts = 0;
  bool cpu = false, ll = false;
  gin::ep::Shape sh;
  sh.tokens = 128;
  sh.hidden = 256;
  sh.topk = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool more = i + 1 < argc;
    if (a == "--ranks" && more)
      ranks = std::atoi(argv[++i]);
    else if (a == "--cpu")
      cpu = true;
    else if (a == "--mode" && more && (std::string(argv[i + 1]) == "normal" || std::string(argv[i + 1]) == "ll"))
      ll = std::string(argv[++i]) == "ll";
    else if (a == "--tokens" && more)
      sh.tokens = std::atoi(argv[++i]);
    else if (a == "--hidden" && more)
      sh.hidden = std::atoi(argv[++i]);
    else if (a == "--experts" && more)
      experts = std::atoi(argv[++i]);
    else if (a == "--topk" && more)
      sh.topk = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--cpu] [--mode normal|ll] [--tokens T] [--hidden H] [--experts E] "
                   "[--topk K]\n",
                   argv[0]);
      return 2;
    }
  }
  gin::CommConfig cfg;
  const int gpus = cpu ? 0 : gin::cudaDeviceCountOrZero();
  cfg.device = gpus > 0 ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
  if (ranks <= 0) ranks = gpus > 0 ? gpus : 4;
  if (gpus > 0 && ranks > gpus) ranks = gpus;
  sh.ranks = ranks;
  sh.experts = experts > 0 ? experts : 4 * ranks;  // default: 4 experts per rank
  cfg.nSignals = int(gin::ep::signalsNeeded(sh)) + 4;
  std::printf("moe: %d ranks on %s, %s mode, %d tokens per rank, hidden %d bf16, %d experts, top-%d\n", ranks,
              gpus > 0 ? "GPUs (one thread per GPU)" : "CPU ranks (threads)", ll ? "low-latency" : "normal", sh.tokens,
              sh.hidden, sh.experts, sh.topk);
  try {
    const int bad =
        examples::runThreadRanks(ranks, cfg, gpus > 0, [&](gin::Comm& comm) { return runRank(comm, sh, ll); });
    std::printf("moe: %s\n", bad ? "FAILED" : "every rank's combined outputs match the host reference");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: %s\n", e.what());
    return 1;
  }
}
