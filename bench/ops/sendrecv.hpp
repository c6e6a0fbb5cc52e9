// bench/ops/sendrecv.hpp — gin-bench sendrecv: p2p send/recv ring shift, next to
// ncclSend/ncclRecv on GPUs.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"
#include "../nccl.hpp"

namespace bench {

using gin::Window;

std::vector<uint64_t> srSizes(const Options& o, bool gpu) {
  const uint64_t lo = o.sizesGiven ? o.minSize : 4096;
  const uint64_t hi = o.sizesGiven ? o.maxSize : (gpu ? (1ull << 30) : (1ull << 20));
  std::vector<uint64_t> v;
  for (uint64_t b = lo; b <= hi; b *= 2) v.push_back(b);
  return v;
}

int srIters(const Options& o, uint64_t bytes, bool gpu) {
  if (o.iters) return int(o.iters);
  if (!gpu) return bytes <= (64u << 10) ? 20 : 4;
  return bytes <= (1u << 20) ? 200 : bytes <= (64u << 20) ? 50 : 10;
}

int srMaxChannels(const Options& o, bool gpu) {
  return o.channels ? o.channels : gpu ? kSrMaxChannelsGpu : kSrMaxChannelsCpu;
}

// One channel per `per` bytes (--channel-bytes, default kSrBytesPerChannel),
// at least one, at most the FIFO's.
uint64_t srBytesPerChannel(const Options& o) { return o.channelBytes ? o.channelBytes : kSrBytesPerChannel; }
int srChannels(uint64_t bytes, int maxCh, uint64_t per) {
  const uint64_t want = (bytes + per - 1) / per;
  return int(std::clamp<uint64_t>(want, 1, uint64_t(maxCh)));
}

void runSendRecv(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                 const std::vector<std::string>& where) {
  const int me = comm.rank(), n = comm.nRanks(), from = (me + n - 1) % n;
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = srSizes(o, gpu);
  const uint64_t maxBytes = sizes.back();
  const int maxCh = srMaxChannels(o, gpu);
  gin::p2p::Config pc;
  pc.nChannels = uint32_t(maxCh);
  pc.chunkBytes = gpu ? kSrChunkGpu : kSrChunkCpu;
  pc.nSlots = kSrSlots;
  if (o.llBytes >= 0) pc.llMaxBytes = uint64_t(o.llBytes);
  const gin::p2p::Fifo fifo = gin::p2p::create(comm, pc);
  Window src = comm.allocWindow(size_t(maxBytes)), dst = comm.allocWindow(size_t(maxBytes + kGuard));
  uint64_t seed = 1;

  std::string ncclReason = ncclSkipReason(o, gpu);
#if GIN_BENCH_NCCL
  NcclSide nccl;
  const bool withNccl = nccl.start(comm, ncclReason, 0, size_t(maxBytes), size_t(maxBytes + kGuard));
  auto *ncclSend = static_cast<uint8_t*>(nccl.send), *ncclRecv = static_cast<uint8_t*>(nccl.recv);
#else
  const bool withNccl = false;
#endif

  struct Row {
    uint64_t bytes;
    int channels, iters;
    std::vector<double> gin, nccl;  // seconds per ring shift, per run
  };
  std::vector<Row> rows;
  for (uint64_t bytes : sizes) {
    Row row{bytes, srChannels(bytes, maxCh, srBytesPerChannel(o)), srIters(o, bytes, gpu), {}, {}};
    // Verified first, twice (the second call reuses the FIFO rings, their
    // step counts carried over in the signal shadows).
    for (int k = 0; k < 2; ++k) {
      ++seed;
      e.fill(src, size_t(bytes), srSeed(seed, me));
      e.poison(dst, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)e.ringShift(fifo, src, dst, size_t(bytes), row.channels, 1);
      comm.bootstrap().barrier();
      agreeBad(comm, fmt("sendrecv verification failed: gin p2p, %s", sizeName(bytes).c_str()),
               e.checkLocal(dst, size_t(bytes), srSeed(seed, from)));
    }
    row.gin = timeRunsMinRank(comm, row.iters, kSrRuns,
                              [&](int it) { return e.ringShift(fifo, src, dst, size_t(bytes), row.channels, it); });
#if GIN_BENCH_NCCL
    if (withNccl) {
      auto& ge = static_cast<GpuEngine&>(e);
      // The same ring shift as one ncclSend + ncclRecv group (with 1 rank,
      // both to itself, as gin's).
      std::vector<size_t> sends(size_t(n), 0), recvs(size_t(n), 0), offs(size_t(n), 0);
      sends[size_t((me + 1) % n)] = size_t(bytes);
      recvs[size_t(from)] = size_t(bytes);
      ge.copyLocal(ncclSend, comm.localPointer(src), size_t(bytes));
      ge.poisonBytes(ncclRecv, size_t(bytes + kGuard));
      comm.bootstrap().barrier();
      (void)ge.ncclExchange(nccl.comm, ncclSend, offs, sends, ncclRecv, offs, recvs, 1);
      agreeBad(comm, fmt("sendrecv verification failed: ncclSend/ncclRecv, %s", sizeName(bytes).c_str()),
               ge.checkBytes(ncclRecv, size_t(bytes), srSeed(seed, from), kGuard));
      row.nccl = timeRunsMinRank(comm, row.iters, kSrRuns, [&](int it) {
        return ge.ncclExchange(nccl.comm, ncclSend, offs, sends, ncclRecv, offs, recvs, it);
      });
    }
#endif
    rows.push_back(std::move(row));
  }
  comm.bootstrap().barrier();
#if GIN_BENCH_NCCL
  nccl.close();
#endif
  comm.deregisterWindow(src);
  comm.deregisterWindow(dst);
  gin::p2p::destroy(comm, fifo);
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "gin: gin::p2p send/recv (step FIFO, NCCL's P2P design) as a ring shift: every rank sends BYTES from its",
      "  source window to rank+1 and receives BYTES from rank-1; one rank sends to itself",
      fmt("  the bytes are cut into CH contiguous shares, one p2p channel each (its own FIFO ring of %u x %s slots),",
          kSrSlots, sizeName(pc.chunkBytes).c_str()),
      fmt("  CH = one per %s, 1 to %d (--channels)", sizeName(srBytesPerChannel(o)).c_str(), maxCh),
      pc.llMaxBytes ? fmt("  a share of up to %s to an lsa peer goes as one LL16 step (flagged packets, no fence; "
                          "--ll-bytes)",
                          sizeName(pc.llMaxBytes).c_str())
                    : std::string("  every share through the FIFO slots (--ll-bytes 0)"),
      gpu ? fmt("launch: one kernel per shift, CH sending CTAs (Endpoint::send) + CH receiving CTAs (Endpoint::recv) x "
                "%d threads, ITERS back to back on the rank's stream",
                kSrThreads)
          : "CPU emulation: each rank thread runs Endpoint::sendRecv (interleaved steps) channel after channel",
      fmt("timer: %s around ITERS shifts; per run the smallest time over the ranks / ITERS; warm-up ITERS/10;",
          timerName(gpu).c_str()),
      fmt("  %d runs, median reported; latency = time per shift, GB/s = BYTES / time (each rank sends and receives "
          "BYTES)",
          kSrRuns),
      "verified first, twice per size: seeded pseudo-random bytes, the receive buffer poisoned, every byte",
      "  compared with the sender's pattern, 64 guard bytes after it untouched",
  };
  if (withNccl)
    rep->method.push_back(
        "nccl: ncclGroupStart; ncclSend(rank+1); ncclRecv(rank-1); ncclGroupEnd per shift, same sizes, same timing, "
        "its own cudaMalloc buffers, verified the same way");
  if (gpu)
    rep->table.header = {"bytes", "CH", "gin us", "gin GB/s", "nccl us", "nccl GB/s", "gin/nccl time"};
  else
    rep->table.header = {"bytes", "CH", "us", "GB/s"};
  J jrows = J::arr();
  for (const Row& r : rows) {
    const double g = median(r.gin), c = withNccl ? median(r.nccl) : 0.0;
    if (gpu)
      rep->table.rows.push_back({sizeName(r.bytes), std::to_string(r.channels), fmt("%.2f", g * 1e6),
                                 fmt("%.2f", gbs(double(r.bytes), g)), withNccl ? fmt("%.2f", c * 1e6) : "-",
                                 withNccl ? fmt("%.2f", gbs(double(r.bytes), c)) : "-",
                                 withNccl && c > 0 ? fmt("%.2f", g / c) : "-"});
    else
      rep->table.rows.push_back(
          {sizeName(r.bytes), std::to_string(r.channels), fmt("%.2f", g * 1e6), fmt("%.3f", gbs(double(r.bytes), g))});
    J row = J::obj();
    row.set("bytes", double(r.bytes))
        .set("channels", double(r.channels))
        .set("iters", double(r.iters))
        .set("gin_us", g * 1e6)
        .set("gin_gbs", gbs(double(r.bytes), g))
        .set("gin_runs_us", runsJson(r.gin));
    if (withNccl)
      row.set("nccl_us", c * 1e6).set("nccl_gbs", gbs(double(r.bytes), c)).set("nccl_runs_us", runsJson(r.nccl));
    jrows.push(std::move(row));
  }
  rep->notes.push_back(withNccl ? "nccl: measured (ncclSend/ncclRecv group on the same GPUs, same sizes)"
                                : "nccl: not measured (" + ncclReason + ")");
  commonJson(*rep, o, s, where);
  rep->json.set("method", J::obj()
                              .set("operation", "gin::p2p ring shift: send to rank+1, recv from rank-1")
                              .set("chunk_bytes", double(pc.chunkBytes))
                              .set("slots", double(kSrSlots))
                              .set("ll_max_bytes", double(pc.llMaxBytes))
                              .set("max_channels", double(maxCh))
                              .set("runs", double(kSrRuns))
                              .set("statistic", "median over runs of the smallest per-rank time / iters")
                              .set("gbs", "bytes / time (each rank sends and receives bytes)")
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(jrows));
  rep->json.set("nccl", withNccl ? J::obj().set("measured", J::boolean(true))
                                 : J::obj().set("measured", J::boolean(false)).set("reason", ncclReason));
}

}  // namespace bench
