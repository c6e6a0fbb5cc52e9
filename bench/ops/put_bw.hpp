// bench/ops/put_bw.hpp — gin-bench put-bw: put bandwidth, rank 0 to rank 1, for thread, warp
// and block coops, next to the copy engine.
#pragma once

#include "../common.hpp"
#include "../engine.hpp"

namespace bench {

using gin::Window;

void runPutBw(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
              const std::vector<std::string>& where) {
  const int me = comm.rank();
  const bool gpu = e.gpu();
  const std::vector<uint64_t> sizes = putSizes(o, gpu);
  const size_t maxBytes = size_t(sizes.back());
  const int K = o.iters ? int(o.iters) : 1000;
  const double budget = gpu ? 0.05 : 0.02;  // seconds per timed run

  const gin::Transport want = o.transport == "proxy" ? gin::Transport::Proxy : gin::Transport::Lsa;
  if (me == 0 && comm.transportTo(1) != want)
    throw gin::Error("rank 1 is not reached over " + o.transport + " from rank 0");
  Window src = comm.allocWindow(maxBytes + kGuard);
  Window dst = comm.allocWindow(maxBytes + kGuard);
  // Rank 1's destination as mapped here, for the copy-engine baseline.
  const uint64_t peerDst = me == 0 ? uint64_t(reinterpret_cast<uintptr_t>(comm.lsaPointer(dst, 0, 1))) : 0;
#if defined(__CUDACC__)
  const int peerDev = bcast(comm, comm.cudaDevice(), 1);
  if (gpu) static_cast<GpuEngine&>(e).setPeerDevice(peerDev);
#endif
  const int maxCtas = bcast(comm, e.maxCtas(), 0);

  struct Cell {
    bool done = false;
    Shape shape{0, 0};
    int iters = 0;
    double seconds = 0, gbps = 0;
  };
  bool skipped[3] = {false, false, false};
  std::vector<std::array<Cell, 4>> cells(sizes.size());  // thread, warp, block, copy

  auto fail = [&](const std::string& what) { throw Failure("put-bw verification failed: " + what); };

  // Times `runOnce(iters)` on rank 0: warm-up, a one-iteration probe that
  // sizes the runs to the budget, then kPutRuns runs; returns the median cell.
  auto measure = [&](Shape sh, const std::function<double(int)>& runOnce, size_t bytes, int* totalCalls) {
    Cell c;
    c.shape = sh;
    runOnce(1);  // warm-up (first touch, instruction cache, clocks)
    const double t1 = runOnce(1);
    c.iters = int(std::clamp(budget / std::max(t1, 1e-9), 1.0, double(K)));
    std::vector<double> t;
    for (int r = 0; r < kPutRuns; ++r) t.push_back(runOnce(c.iters));
    c.seconds = median(t);
    c.gbps = double(bytes) * c.iters / c.seconds / 1e9;
    c.done = true;
    *totalCalls = 2 + kPutRuns * c.iters;
    return std::make_pair(c, t1);
  };

  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = size_t(sizes[si]);
    for (int ci = 0; ci < 3; ++ci) {
      if (skipped[ci]) continue;
      const CoopKind k = CoopKind(ci);
      const Shape sh = shapeFor(k, bytes, maxCtas);
      const uint64_t seed = mix(uint64_t(bytes) * 4 + uint64_t(ci));
      // 1. Verify one put: poisoned destination, signal awaited at rank 1,
      //    every byte compared, guard bytes untouched.
      if (me == 0) e.fill(src, bytes, seed);
      if (me == 1) {
        e.poison(dst, bytes + kGuard);
        e.resetSignal(kSigVerify);
        e.resetSignal(kSigTimed);
      }
      comm.bootstrap().barrier();
      if (me == 1) e.beginReceiveCheck(dst, bytes, seed, kSigVerify, uint64_t(sh.ctas));
      if (me == 0) e.put(k, sh, dst, src, bytes, 1, kSigVerify);
      uint64_t bad = me == 1 ? e.endReceiveCheck() : 0;
      bad = bcast(comm, bad, 1);
      if (bad == ~0ull)
        fail(
            fmt("%s coop, %s: rank 1 never saw the put's signal (waitSignal gave up after the communicator's "
                "timeout, GIN_TIMEOUT_MS)",
                kCoopNames[ci], sizeName(bytes).c_str()));
      if (bad)
        fail(fmt("%s coop, %s: rank 1 received %" PRIu64 " wrong bytes (of %zu, plus %zu guard bytes)", kCoopNames[ci],
                 sizeName(bytes).c_str(), bad, bytes, kGuard));
      // 2. Time it on rank 0.
      int calls = 0;
      double t1 = 0;
      if (me == 0) {
        auto [c, probe] = measure(
            sh, [&](int it) { return e.put(k, sh, dst, src, bytes, it, kSigTimed); }, bytes, &calls);
        cells[si][size_t(ci)] = c;
        t1 = probe;
      }
      // 3. Every timed put's signal arrived: rank 1 waits for the count (rank 0's
      //    return from its puts says nothing about their arrival: over the proxy
      //    the engine may still be carrying the last ones out), then reads it
      //    (more would be a signal applied twice).
      const uint64_t expect = bcast(comm, uint64_t(calls) * uint64_t(sh.ctas), 0);
      const bool arrived = bcast(comm, me == 1 ? uint64_t(e.waitSignal(kSigTimed, expect)) : uint64_t(1), 1) != 0;
      const uint64_t got = bcast(comm, me == 1 ? e.readSignal(kSigTimed) : uint64_t(0), 1);
      if (!arrived || got != expect)
        fail(fmt("%s coop, %s: rank 1's signal counted %" PRIu64 " timed puts, expected %" PRIu64 "%s", kCoopNames[ci],
                 sizeName(bytes).c_str(), got, expect,
                 arrived ? "" : " (waitSignal gave up after the communicator's timeout, GIN_TIMEOUT_MS)"));
      skipped[ci] = bcast(comm, t1 > kSlowPutS, 0);
    }
    // Copy engine (GPU) / memcpy (CPU): same bytes, verified the same way.
    const uint64_t seed = mix(uint64_t(bytes) * 4 + 3);
    if (me == 0) e.fill(src, bytes, seed);
    if (me == 1) e.poison(dst, bytes + kGuard);
    comm.bootstrap().barrier();
    if (me == 0) e.copyToPeer(reinterpret_cast<void*>(uintptr_t(peerDst)), src, bytes, 1);
    comm.bootstrap().barrier();
    uint64_t bad = bcast(comm, me == 1 ? e.checkLocal(dst, bytes, seed) : uint64_t(0), 1);
    if (bad)
      fail(fmt("%s baseline, %s: rank 1 received %" PRIu64 " wrong bytes", gpu ? "copy-engine" : "memcpy",
               sizeName(bytes).c_str(), bad));
    if (me == 0) {
      int calls = 0;
      cells[si][3] =
          measure(
              Shape{0, 0},
              [&](int it) { return e.copyToPeer(reinterpret_cast<void*>(uintptr_t(peerDst)), src, bytes, it); }, bytes,
              &calls)
              .first;
    }
    comm.bootstrap().barrier();
  }
  comm.bootstrap().barrier();
  comm.deregisterWindow(dst);
  comm.deregisterWindow(src);
  if (me != 0) return;

  // ---- report ----
  const char* base = gpu ? "CE" : "memcpy";
  rep->head = headLines(o, s, where);
  rep->method = {
      "rank 0 puts SIZE bytes from its src window into rank 1's dst window with gin Net<lsa>::put(..., SignalInc):",
      "  every put carries a remote SignalInc (system-scope release), one per CTA for the block coop",
      fmt("launch: thread = 1 CTA x 1 thread; warp = 1 CTA x 32 threads; block = min(%d, ceil(SIZE / 32 KiB)) CTAs x "
          "%d threads,",
          maxCtas, kBlockThreads),
      "  CTA b moving a contiguous 16-byte aligned share, or, from 2 x 64 KiB per CTA up, 64 KiB chunks dealt",
      "  round-robin to the CTAs (CTA b: chunks b, b+G, ...; SignalInc on each CTA's last put) (shape per size in the "
      "table)",
      fmt("iterations: one %s runs ITERS puts back to back; ITERS = min(%d, %.0f ms / time of one put), at least 1;",
          gpu ? "kernel" : "call (per rank thread)", K, budget * 1e3),
      "  warm-up: one untimed put, then a timed one-put probe that sets ITERS",
      fmt("timer: %s; reported: median of %d runs;", timerName(gpu).c_str(), kPutRuns),
      gpu ? "  GB/s = SIZE * ITERS / time / 1e9 (time of the whole kernel, launch included)"
          : "  GB/s = SIZE * ITERS / time / 1e9 (time of the whole call)",
      gpu ? "baseline: copy engine, ITERS x cudaMemcpyPeerAsync(rank 1 dst, GPU 1, rank 0 src, GPU 0, SIZE) in one "
            "stream between the same events"
          : "baseline: ITERS x std::memcpy from rank 0's src into rank 1's dst (the emulation's copy engine)",
      "verified before timing: rank 1 waits for the put's signal, compares every byte with the source pattern and",
      fmt("  checks %zu guard bytes after it are untouched; after timing it checks its signal counted every timed put",
          kGuard),
      fmt("  (the %s baseline's bytes are checked the same way)", base),
      fmt("a coop's larger sizes are skipped once one put takes more than %.2f s ('-' in the table)", kSlowPutS),
  };
  if (!gpu)
    rep->method.push_back(
        "CPU emulation: every coop is one thread on the host, and the block coop's CTAs run one after another");
  rep->table.header = {"size",
                       "thread GB/s",
                       "warp GB/s",
                       "block GB/s",
                       "block launch",
                       std::string(base) + " GB/s",
                       std::string("thread/") + base,
                       std::string("warp/") + base,
                       std::string("block/") + base,
                       "iters t/w/b/" + std::string(gpu ? "ce" : "memcpy")};
  J rows = J::arr();
  for (size_t si = 0; si < sizes.size(); ++si) {
    const auto& c = cells[si];
    auto g = [&](int i) { return c[size_t(i)].done ? fmt("%.3f", c[size_t(i)].gbps) : std::string("-"); };
    auto ratio = [&](int i) {
      return c[size_t(i)].done && c[3].gbps > 0 ? fmt("%.2f", c[size_t(i)].gbps / c[3].gbps) : std::string("-");
    };
    auto it = [&](int i) { return c[size_t(i)].done ? std::to_string(c[size_t(i)].iters) : std::string("-"); };
    rep->table.rows.push_back({sizeName(sizes[si]), g(0), g(1), g(2),
                               c[2].done ? fmt("%dx%d", c[2].shape.ctas, c[2].shape.threads) : std::string("-"), g(3),
                               ratio(0), ratio(1), ratio(2), it(0) + "/" + it(1) + "/" + it(2) + "/" + it(3)});
    J row = J::obj();
    row.set("bytes", double(sizes[si]));
    for (int i = 0; i < 4; ++i) {
      const Cell& x = c[size_t(i)];
      J m = J::obj();
      if (!x.done) {
        m = J::obj().set("skipped", J::boolean(true));
      } else {
        if (i < 3) m.set("launch", fmt("%dx%d", x.shape.ctas, x.shape.threads));
        m.set("iters", double(x.iters)).set("seconds", x.seconds).set("GBps", x.gbps);
        if (i < 3 && c[3].gbps > 0) m.set("ratio_to_baseline", x.gbps / c[3].gbps);
      }
      row.set(i < 3 ? std::string("gin_") + kCoopNames[i] : std::string(gpu ? "copy_engine" : "memcpy"), std::move(m));
    }
    rows.push(std::move(row));
  }
  const std::string nccl =
      !gpu ? "CPU emulation: NCCL's device API runs on GPUs only"
           : "not measured: NCCL 2.28's LSA device API has no put (a kernel copies through ncclGetLsaPointer itself, "
             "which would time the same copy loop as gin's lsa put), and ncclGin::put needs a GIN-capable network, "
             "not the load/store path between GPUs of one host";
  rep->notes.push_back("nccl: " + nccl);
  commonJson(*rep, o, s, where);
  rep->json.set("method",
                J::obj()
                    .set("operation", "Net<lsa>::put + SignalInc, rank 0 -> rank 1")
                    .set("block_launch", fmt("min(%d, ceil(bytes/32KiB)) CTAs x %d threads", maxCtas, kBlockThreads))
                    .set("iters_max", double(K))
                    .set("budget_seconds_per_run", budget)
                    .set("runs", double(kPutRuns))
                    .set("statistic", "median")
                    .set("timer", timerName(gpu))
                    .set("GB", "1e9 bytes")
                    .set("baseline", gpu ? "cudaMemcpyPeerAsync" : "std::memcpy"));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", std::move(rows));
  rep->json.set("nccl", J::obj().set("measured", J::boolean(false)).set("reason", nccl));
}

}  // namespace bench
