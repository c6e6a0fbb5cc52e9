// moe — one mixture-of-experts layer written the way a DeepEP user writes it,
// on gin::ep's Buffer (gin/ep/buffer.hpp, gin/ep/gpu_buffer.hpp): every rank
// makes tokens with top-k expert choices, dispatch brings each rank the
// tokens routed to its experts, the rank runs its experts on them (this
// program's own code: expert e scales its input by 1 + e/64), and combine
// brings the outputs back to the tokens' sources. Each rank checks its
// result against a host reference computed from its own inputs.
//
// Normal mode: each received row comes with its local top-k choices and
// weights; the rank returns one row per received token (the weighted sum of
// its local experts' outputs) and combine sums them. Low-latency mode:
// tokens arrive packed per local expert ([L][ranks x max tokens][H]); each
// expert returns its output for each row and combine weighs them with the
// top-k weights.
//
// Runs on the GPUs when there are some (gin::ep::GpuBuffer: device arrays,
// the experts as a kernel, one thread per GPU) and on CPU ranks otherwise
// (gin::ep::CpuBuffer: host arrays, one thread per rank):
//   moe [--ranks N] [--cpu] [--mode normal|ll] [--tokens T] [--hidden H]
//       [--experts E] [--topk K]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../common/thread_ranks.hpp"
#include "gin/ep/buffer.hpp"
#include "gin/gin.hpp"
#if defined(__CUDACC__)
#include "gin/ep/gpu_buffer.hpp"
#endif

namespace {

using gin::ep::bf16ToFloat;
using gin::ep::expertScale;
using gin::ep::floatToBf16;

// This program's experts on one row: y = bf16(coef * x), thread `from` of
// `step` (a CPU rank: 0 of 1).
GIN_HD void expertRow(const uint16_t* x, uint16_t* y, int hidden, float coef, int from, int step) {
  for (int i = from; i < hidden; i += step) y[i] = floatToBf16(coef * bf16ToFloat(x[i]));
}

// Normal mode: received row i's coefficient, the sum over its local choices
// k (idx >= 0) of weight x the expert's scale (experts of this rank start at
// firstExpert).
GIN_HD float rowCoef(const int32_t* idx, const float* weight, int topk, int firstExpert) {
  float coef = 0;
  for (int k = 0; k < topk; ++k)
    if (idx[k] >= 0) coef += weight[k] * expertScale(firstExpert + idx[k]);
  return coef;
}

#if defined(__CUDACC__)
// A block per received row (normal mode).
__global__ void expertsKernel(const uint16_t* x, const int32_t* idx, const float* weight, int rows, int hidden,
                              int topk, int firstExpert, uint16_t* y) {
  for (int i = int(blockIdx.x); i < rows; i += int(gridDim.x))
    expertRow(x + size_t(i) * hidden, y + size_t(i) * hidden, hidden,
              rowCoef(idx + size_t(i) * topk, weight + size_t(i) * topk, topk, firstExpert), int(threadIdx.x),
              int(blockDim.x));
}
// A block per (local expert, row) of the packed layout (low-latency mode);
// rows past count[el] hold nothing.
__global__ void llExpertsKernel(const uint16_t* x, const int* count, int perExpert, int hidden, int firstExpert,
                                uint16_t* y) {
  const int el = int(blockIdx.y);
  for (int r = int(blockIdx.x); r < count[el]; r += int(gridDim.x)) {
    const size_t at = (size_t(el) * perExpert + size_t(r)) * hidden;
    expertRow(x + at, y + at, hidden, expertScale(firstExpert + el), int(threadIdx.x), int(blockDim.x));
  }
}

template <class T>
gin::ep::DeviceArray<T> upload(const gin::ep::GpuBuffer& buf, const std::vector<T>& v, cudaStream_t st) {
  gin::ep::DeviceArray<T> a = buf.deviceArray<T>(v.size());
  GIN_CUDA_CHECK(cudaMemcpyAsync(a.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, st));
  return a;
}

// One layer on a GPU rank; returns the combined outputs [T][H] on the host.
std::vector<uint16_t> layerOnGpu(gin::ep::GpuBuffer& buf, const gin::ep::Inputs& in, bool ll, int rank,
                                 cudaStream_t st) {
  const gin::ep::Shape sh = buf.shape();
  const int H = sh.hidden, K = sh.topk, L = sh.localExperts(), T = int(in.idx.size()) / K;
  const auto x = upload(buf, in.x, st);
  const auto idx = upload(buf, in.idx, st);
  const auto weight = upload(buf, in.weight, st);
  gin::ep::DeviceArray<uint16_t> out;
  if (!ll) {
    gin::ep::GpuDispatched d = buf.dispatch(x.data(), idx.data(), weight.data(), T);
    const int n = int(d.x.size()) / H;
    auto y = buf.deviceArray<uint16_t>(d.x.size());
    if (n > 0)
      expertsKernel<<<std::min(n, 1024), 256, 0, st>>>(d.x.data(), d.topkIdx.data(), d.topkWeights.data(), n, H, K,
                                                       rank * L, y.data());
    GIN_CUDA_CHECK(cudaGetLastError());
    out = buf.combine(y.data(), d.handle);
  } else {
    gin::ep::GpuLlDispatched d = buf.lowLatencyDispatch(x.data(), idx.data(), weight.data(), T);
    const int perExpert = sh.ranks * sh.tokens;
    auto y = buf.deviceArray<uint16_t>(d.x.size());
    llExpertsKernel<<<dim3(128, unsigned(L)), 256, 0, st>>>(d.x.data(), d.handle.count.data(), perExpert, H, rank * L,
                                                            y.data());
    GIN_CUDA_CHECK(cudaGetLastError());
    out = buf.lowLatencyCombine(y.data(), idx.data(), weight.data(), d.handle);
  }
  return out.toHost();
}
#endif

// One layer on a CPU rank; returns the combined outputs [T][H].
std::vector<uint16_t> layerOnCpu(gin::ep::CpuBuffer& buf, const gin::ep::Inputs& in, bool ll, int rank) {
  const gin::ep::Shape sh = buf.shape();
  const int H = sh.hidden, K = sh.topk, L = sh.localExperts();
  if (!ll) {
    const gin::ep::Dispatched d = buf.dispatch(in);
    std::vector<uint16_t> y(d.x.size());
    for (size_t i = 0; i < d.x.size() / size_t(H); ++i)
      expertRow(&d.x[i * H], &y[i * H], H, rowCoef(&d.topkIdx[i * K], &d.topkWeights[i * K], K, rank * L), 0, 1);
    return buf.combine(y.data(), d.handle);
  }
  const gin::ep::LlDispatched d = buf.lowLatencyDispatch(in);
  const size_t perExpert = size_t(sh.ranks) * size_t(sh.tokens);
  std::vector<uint16_t> y(d.x.size());
  for (int el = 0; el < L; ++el)
    for (size_t r = 0; r < size_t(d.handle.count[size_t(el)]); ++r) {
      const size_t at = (size_t(el) * perExpert + r) * H;
      expertRow(&d.x[at], &y[at], H, expertScale(rank * L + el), 0, 1);
    }
  return buf.lowLatencyCombine(y.data(), in.idx.data(), in.weight.data(), d.handle);
}

// Outputs off the host reference by more than bf16 allows (the experts'
// rows and the result are rounded to bf16: 2^-8 of the sum of the terms'
// sizes, with room); *first: the first one.
size_t wrongOutputs(const gin::ep::Shape& sh, const gin::ep::Inputs& in, const std::vector<uint16_t>& out,
                    size_t* first) {
  const std::vector<double> ref = gin::ep::reference(sh, in);
  size_t bad = out.size() == ref.size() ? 0 : 1;
  for (size_t i = 0; i < ref.size() && i < out.size(); ++i) {
    const size_t t = i / size_t(sh.hidden);
    double size = 0;
    for (int k = 0; k < sh.topk; ++k)
      if (const int e = in.idx[t * sh.topk + k]; e >= 0)
        size += std::fabs(in.weight[t * sh.topk + k] * expertScale(e) * bf16ToFloat(in.x[i]));
    if (!(std::fabs(double(bf16ToFloat(out[i])) - ref[i]) <= size / 64 + 1e-6) && bad++ == 0) *first = i;
  }
  return bad;
}

// Two layers on this rank (the second reuses the buffer); returns the
// number of wrong outputs.
size_t runRank(gin::Comm& comm, gin::ep::Shape sh, bool ll) {
  size_t wrong = 0, first = 0;
  const int tokens = sh.tokens;
  auto layer = [&](auto&& run) {
    for (int round = 0; round < 2; ++round) {
      const gin::ep::Inputs in = gin::ep::makeInputs(sh, comm.rank(), 1 + uint64_t(round), 0.05);
      wrong += wrongOutputs(sh, in, run(in), &first);
    }
  };
  if (comm.onGpu()) {
#if defined(__CUDACC__)
    cudaStream_t st = nullptr;
    GIN_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    {
      gin::ep::Shape auto_ = sh;
      auto_.channels = auto_.slots = 0;  // chosen for this GPU
      gin::ep::GpuBuffer buf(comm, auto_, ll, st);
      layer([&](const gin::ep::Inputs& in) { return layerOnGpu(buf, in, ll, comm.rank(), st); });
    }
    (void)cudaStreamDestroy(st);
#endif
  } else {
    gin::ep::CpuBuffer buf(comm, sh, ll);
    layer([&](const gin::ep::Inputs& in) { return layerOnCpu(buf, in, ll, comm.rank()); });
  }
  std::printf("rank %d (%s): %d tokens dispatched, through the experts and combined twice: %s\n", comm.rank(),
              comm.onGpu() ? ("GPU " + std::to_string(comm.cudaDevice())).c_str() : "CPU", tokens,
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
  // The GPU buffer picks up to 64 channels: signals for that many.
  gin::ep::Shape most = sh;
  most.channels = 64;
  cfg.nSignals = int(gin::ep::signalsNeeded(gpus > 0 ? most : sh)) + 4;
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
