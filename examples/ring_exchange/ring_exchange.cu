// ring_exchange — gin's main demo. Each rank fills a block with its own data,
// puts it into the next rank's window with a SignalInc, waits for the block
// from the previous rank, and checks every byte.
//
// Runs on the GPUs when there are some (one process driving every visible GPU,
// or one process per GPU under torchrun/srun/mpirun), and on CPU ranks
// otherwise (threads of this process, or one process per rank under a launcher):
//   ring_exchange [--ranks N] [--bytes B] [--cpu]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common/thread_ranks.hpp"
#include "gin/gin.hpp"

namespace {

GIN_HD inline uint8_t blockByte(int rank, size_t i) { return uint8_t((rank * 131 + i * 7 + (i >> 8)) & 0xff); }

// What each rank's kernel does; the same code runs on a GPU block and on a CPU rank.
template <class Coop>
GIN_HD void ringStep(const gin::DevComm& dc, gin::Window win, size_t bytes, Coop coop) {
  gin::Net net(dc, 0);
  const int next = (dc.rank + 1) % dc.nRanks;
  // Our outgoing block sits at offset 0; the incoming one lands at offset `bytes`.
  net.put(gin::teamWorld(dc), next, win, bytes, win, 0, bytes, gin::SignalInc{0}, gin::None{}, coop);
  net.waitSignal(coop, 0, 1);
}

#ifdef __CUDACC__
__global__ void ringKernel(gin::DevComm dc, gin::Window win, size_t bytes) {
  ringStep(dc, win, bytes, gin::CoopBlock{});
}
#endif

// Runs one rank: returns the number of wrong bytes received.
size_t runRank(gin::Comm& comm, size_t bytes) {
  const int me = comm.rank(), prev = (me + comm.nRanks() - 1) % comm.nRanks();
  gin::Window win = comm.allocWindow(2 * bytes);
  std::vector<uint8_t> h(2 * bytes);
  for (size_t i = 0; i < bytes; ++i) h[i] = blockByte(me, i);
  std::memset(h.data() + bytes, 0xEE, bytes);  // poison the landing zone
  if (comm.onGpu()) {
#ifdef __CUDACC__
    cudaMemcpy(comm.localPointer(win), h.data(), h.size(), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    comm.bootstrap().barrier();
    ringKernel<<<1, 512>>>(comm.devComm(), win, bytes);
    comm.synchronize();
    cudaMemcpy(h.data(), comm.localPointer(win), h.size(), cudaMemcpyDeviceToHost);
#endif
  } else {
    std::memcpy(comm.localPointer(win), h.data(), h.size());
    comm.bootstrap().barrier();
    ringStep(comm.devComm(), win, bytes, gin::CoopThread{});
    comm.check();
    std::memcpy(h.data(), comm.localPointer(win), h.size());
  }
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += h[bytes + i] != blockByte(prev, i);
  std::printf("rank %d (%s): received %zu bytes from rank %d: %s\n", me,
              comm.onGpu() ? ("GPU " + std::to_string(comm.cudaDevice())).c_str() : "CPU", bytes, prev,
              wrong ? "WRONG" : "ok");
  comm.bootstrap().barrier();
  comm.deregisterWindow(win);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 0;
  size_t bytes = 1 << 20;
  bool cpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc)
      ranks = std::atoi(argv[++i]);
    else if (a == "--bytes" && i + 1 < argc)
      bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--cpu")
      cpu = true;
    else {
      std::fprintf(stderr, "usage: %s [--ranks N] [--bytes B] [--cpu]\n", argv[0]);
      return 2;
    }
  }
  gin::CommConfig cfg;
  const int gpus = cpu ? 0 : gin::cudaDeviceCountOrZero();
  cfg.device = gpus > 0 ? gin::DeviceKind::Gpu : gin::DeviceKind::Cpu;
  try {
    if (std::getenv("RANK") || std::getenv("SLURM_PROCID") || std::getenv("OMPI_COMM_WORLD_RANK")) {
      auto bs = gin::TcpBootstrap::fromEnvironment();  // one process per rank
      gin::Comm comm(*bs, cfg);
      return runRank(comm, bytes) ? 1 : 0;
    }
    if (ranks <= 0) ranks = gpus > 0 ? gpus : 4;
    if (gpus > 0 && ranks > gpus) ranks = gpus;
    std::printf("ring_exchange: %d ranks on %s, %zu bytes per rank\n", ranks,
                gpus > 0 ? "GPUs (one thread per GPU)" : "CPU ranks (threads)", bytes);
    const int bad =
        examples::runThreadRanks(ranks, cfg, gpus > 0, [&](gin::Comm& comm) { return runRank(comm, bytes); });
    std::printf("ring_exchange: %s\n", bad ? "FAILED" : "every rank received its neighbour's block intact");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_exchange: %s\n", e.what());
    return 1;
  }
}
