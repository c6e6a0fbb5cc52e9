// bench/common.hpp — what every part of gin-bench shares: the includes (gin,
// gin::ep, CUDA and NCCL under __CUDACC__), the constants and op list, small
// host utilities, the report rank 0 prints, the parsed options, the run's
// setup and the helpers of the timed ops (sizes, JSON head, min-rank timing).
//
// gin-bench is one translation unit (gin_bench.cu, or gin_bench_cpu.cpp for a
// plain C++ compiler) that includes these headers: everything that touches
// CUDA sits under __CUDACC__.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gin/gin.hpp"
// The transports' counters (msg-rate): gin internals, not the user API.
#include "gin/host/test_access.hpp"
// The MoE layer is gin::ep's own code (device bodies, CPU driver, host
// reference), not a copy: gin-bench moe times exactly what the library runs.
#include "gin/ep/cpu.hpp"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include "gin/ep/gpu.hpp"
#if defined(GIN_BENCH_HAVE_NCCL) && GIN_BENCH_HAVE_NCCL
// NCCL's device headers trip -Wunused-parameter in the host pass; not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl.h>
#include <nccl_device.h>
#pragma GCC diagnostic pop
#define GIN_BENCH_NCCL 1
#endif
#endif
#ifndef GIN_BENCH_NCCL
#define GIN_BENCH_NCCL 0
#endif

#include "json.hpp"

namespace bench {

using gin::Window;

// ---------------------------------------------------------------------------
// Constants that shape the measurements (printed in the method section).

constexpr uint32_t kSigVerify = 0;  // put-bw: the verification put's signal
constexpr uint32_t kSigTimed = 1;   // put-bw: the timed puts' signals (counted afterwards)
constexpr uint32_t kSigPing = 2;    // signal-lat
constexpr uint32_t kSigMsg = 3;     // msg-rate
constexpr size_t kGuard = 64;       // bytes after each put's destination that must stay poisoned
constexpr uint8_t kPoison = 0xAB;
constexpr int kBlockThreads = 512;         // put-bw block coop
constexpr size_t kBytesPerCta = 32 << 10;  // put-bw block coop: one CTA per 32 KiB, up to one per SM
constexpr int kCpuCtas = 132;              // CPU emulation: CTA count of an H100 SXM
constexpr int kBarrierThreads = 256;
constexpr int kBarrierCtas[] = {1, 32, 132};
constexpr double kSlowPutS = 0.25;  // a coop whose single put takes longer stops at that size
constexpr int kPutRuns = 3, kLatRuns = 5, kBarRuns = 5;
constexpr int kArRuns = 5;                       // allreduce: timed runs per size (median)
constexpr uint32_t kArSignalBase = 64;           // allreduce: the ring's signal ids (4 per block)
constexpr uint32_t kArMaxBlocks = 32;            // allreduce: the workspace's most blocks (the plans use 16 or 32)
constexpr int kSrRuns = 5;                       // sendrecv: timed runs per size (median)
constexpr int kSrThreads = 512;                  // sendrecv: threads of each sending or receiving CTA
constexpr int kSrMaxChannelsGpu = 32;            // sendrecv: most channels (CTA pairs), GPUs
constexpr int kSrMaxChannelsCpu = 2;             // sendrecv: most channels, CPU ranks
constexpr size_t kSrBytesPerChannel = 16 << 10;  // sendrecv: one channel per 16 KiB, up to the most
constexpr uint64_t kSrChunkGpu = 128 << 10;      // sendrecv: FIFO slot (one step), GPUs (NCCL's p2p chunk)
constexpr uint64_t kSrChunkCpu = 32 << 10;       // sendrecv: FIFO slot, CPU ranks
constexpr uint32_t kSrSlots = 8;                 // sendrecv: FIFO depth (NCCL_STEPS)
constexpr int kMoeExpertsPerRank = 8;
constexpr int kMoeTopk = 8;

enum class Op { PutBw, SignalLat, Barrier, MsgRate, AllReduce, SendRecv, Moe };
enum class CoopKind { Thread = 0, Warp = 1, Block = 2 };
constexpr const char* kCoopNames[] = {"thread", "warp", "block"};

struct Shape {
  int ctas, threads;
};

// ---------------------------------------------------------------------------
// Small host utilities.

struct Failure : std::runtime_error {  // a verification failure: exit 1
  using std::runtime_error::runtime_error;
};
std::string sizeName(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1ull << 10) && b % (1ull << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Collectives on plain values through the communicator's bootstrap.
template <class T>
T bcast(gin::Comm& c, T v, int root) {
  c.bootstrap().broadcast(&v, sizeof v, root);
  return v;
}
template <class T>
std::vector<T> allGather(gin::Comm& c, T v) {
  std::vector<T> all(size_t(c.nRanks()));
  all[size_t(c.rank())] = v;
  c.bootstrap().allGather(all.data(), sizeof(T));
  return all;
}

struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  void print() const {
    std::vector<size_t> w(header.size());
    for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
    for (auto& r : rows)
      for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
    auto line = [&](const std::vector<std::string>& r) {
      std::string o = " ";
      for (size_t c = 0; c < w.size(); ++c) {
        const std::string cell = c < r.size() ? r[c] : "";
        const std::string fill(w[c] - std::min(w[c], cell.size()), ' ');
        o += "  " + (c == 0 ? cell + fill : fill + cell);
      }
      std::printf("%s\n", o.c_str());
    };
    line(header);
    std::string rule = " ";
    for (size_t c = 0; c < w.size(); ++c) rule += "  " + std::string(w[c], '-');
    std::printf("%s\n", rule.c_str());
    for (auto& r : rows) line(r);
  }
};

// What rank 0 prints and writes.
struct Report {
  std::vector<std::string> head, method, notes;
  Table table;
  J json = J::obj();
};

// ---------------------------------------------------------------------------
// Options.

struct Options {
  Op op = Op::PutBw;
  std::string opName;
  std::string transport = "lsa";
  bool transportGiven = false;
  int ranks = 0;  // 0: default
  bool emulate = false;
  bool sizesGiven = false;
  uint64_t minSize = 8, maxSize = 0;
  long iters = 0;  // 0: default
  std::string json;
  bool noNccl = false;
  int channels = 0;            // sendrecv: most channels; moe: normal mode's channels; 0: default
  uint64_t channelBytes = 0;   // sendrecv: one channel per this many bytes; 0: kSrBytesPerChannel
  int64_t llBytes = -1;        // sendrecv: p2p::Config::llMaxBytes; -1: its default
  std::string mode = "both";   // moe: normal, ll or both
  int tokens = 0, hidden = 0;  // moe: 0: default
  int batch = 1;               // moe: normal mode's slots per tail/head signal
  int slots = 0;               // moe: normal mode's ring slots; 0: default
  bool modeGiven = false, tokensGiven = false;
  int contexts = 0;            // network contexts (CommConfig::nContexts); 0: the default
  int qpDepth = 0;             // ibgda: WQEs per QP (IbgdaConfig::qpDepth); 0: the default
  bool deferDoorbell = false;  // ibgda: IbgdaConfig::deferDoorbell
  int postBatch = 0;           // ibgda msg-rate: PostBatch slots per warp; 0: one call at a time
};

// ---------------------------------------------------------------------------
// The ops. Every rank runs the same function; collectives keep them in step
// and rank 0 builds the report.

struct Setup {
  bool gpu = false;
  int ranks = 2;
  int gpus = 0;             // visible; ranks > gpus: ranks share GPUs round-robin (proxy only)
  std::string whyEmulated;  // when emulating without --emulate
};

std::vector<uint64_t> putSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 8;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (16ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t s = lo; s <= hi; s *= 2) {
    v.push_back(s);
    if (s > (~0ull >> 2)) break;
  }
  return v;
}

Shape shapeFor(CoopKind k, size_t bytes, int maxCtas) {
  if (k == CoopKind::Thread) return {1, 1};
  if (k == CoopKind::Warp) return {1, 32};
  const size_t want = (bytes + kBytesPerCta - 1) / kBytesPerCta;
  return {int(std::clamp<size_t>(want, 1, size_t(maxCtas))), kBlockThreads};
}

std::string timerName(bool gpu) {
  return gpu ? "cudaEvents on the measuring rank's stream" : "std::chrono::steady_clock on the measuring rank's thread";
}

void commonJson(Report& rep, const Options& o, const Setup& s, const std::vector<std::string>& where) {
  rep.json.set("tool", "gin-bench");
  rep.json.set("gin_version", fmt("%d.%d.%d", gin::kVersionMajor, gin::kVersionMinor, gin::kVersionPatch));
  rep.json.set("op", o.opName);
  rep.json.set("mode", s.gpu ? "gpu" : "cpu-emulation");
  if (!s.gpu)
    rep.json.set("note", fmt("CPU emulation: ranks are threads of one process on a %u-core machine; the numbers are "
                             "CPU numbers, not GPU numbers",
                             std::thread::hardware_concurrency()));
  rep.json.set("transport", o.transport);
  rep.json.set("ranks", double(s.ranks));
  J w = J::arr();
  for (auto& x : where) w.push(J::str(x));
  rep.json.set("rank_devices", std::move(w));
}

std::vector<std::string> headLines(const Options& o, const Setup& s, const std::vector<std::string>& where) {
  std::vector<std::string> h;
  h.push_back(
      fmt("gin-bench %s: transport %s, %d ranks, %s", o.opName.c_str(), o.transport.c_str(), s.ranks,
          s.gpu ? "GPUs of one host (one gin::Comm per GPU)" : "CPU emulation (CPU ranks running the gin device API)"));
  if (!s.whyEmulated.empty()) h.push_back("  note: " + s.whyEmulated);
  if (s.gpu && s.ranks > s.gpus)
    h.push_back(fmt("  note: %d ranks share %d GPU%s (round-robin); over the proxy the GPUs never address each other",
                    s.ranks, s.gpus, s.gpus == 1 ? "" : "s"));
  if (!s.gpu)
    h.push_back(fmt("  CPU numbers on a %u-core machine, not GPU numbers", std::thread::hardware_concurrency()));
  std::string r = " ";
  for (size_t i = 0; i < where.size(); ++i) r += fmt(" rank %zu: %s;", i, where[i].c_str());
  r.pop_back();
  h.push_back(r);
  return h;
}

// ---- sendrecv and moe: shared pieces ----

// Every rank times its own run of `iters` operations after a host barrier; a
// run counts the smallest time over the ranks (the rank that started last has
// no start skew) / iters. Returns seconds per operation, one per run.
std::vector<double> timeRunsMinRank(gin::Comm& comm, int iters, int runs, const std::function<double(int)>& once) {
  comm.bootstrap().barrier();
  once(std::max(1, iters / 10));  // warm-up
  std::vector<double> v;
  for (int r = 0; r < runs; ++r) {
    comm.bootstrap().barrier();
    const double t = once(iters);
    const auto all = allGather(comm, t);
    v.push_back(*std::min_element(all.begin(), all.end()) / iters);
  }
  return v;
}

// A count of bad bytes (or outputs) on some rank fails every rank alike.
void agreeBad(gin::Comm& comm, const std::string& what, uint64_t bad) {
  const auto all = allGather(comm, bad);
  for (int r = 0; r < comm.nRanks(); ++r)
    if (all[size_t(r)])
      throw Failure(fmt("%s: rank %d has %" PRIu64 " wrong bytes or values", what.c_str(), r, all[size_t(r)]));
}

double gbs(double bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0.0; }

J runsJson(const std::vector<double>& secs) {
  J a = J::arr();
  for (double x : secs) a.push(J::num(x * 1e6));
  return a;
}

// Seeds of the data rank `from` sends in verification round `seed` (sendrecv,
// and moe's NCCL all-to-all).
uint64_t srSeed(uint64_t seed, int from) { return mix(seed * 4096 + uint64_t(from)); }

}  // namespace bench
