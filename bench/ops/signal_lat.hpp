// bench/ops/signal_lat.hpp — gin-bench signal-lat: signal round-trip latency (SignalInc + waitSignal
// ping-pong between rank 0 and rank 1).
#pragma once

#include "../common.hpp"
#include "../engine.hpp"

namespace bench {

using gin::Window;

void runSignalLat(gin::Comm& comm, Engine& e, const Options& o, const Setup& s, Report* rep,
                  const std::vector<std::string>& where) {
  const int me = comm.rank();
  const bool gpu = e.gpu();
  const int K = o.iters ? int(o.iters) : (gpu ? 10000 : 2000);
  const int warm = std::max(2, std::min(K, 1000));
  uint64_t base = 0;
  constexpr int kModes = 3;
  std::vector<double> evt[kModes], steady[kModes];
  // Each run: both ranks start together (bootstrap barrier), one kernel (or
  // call) per rank runs all the round trips, in each mode of pingPong().
  for (int variant = 0; variant < kModes; ++variant)
    for (int r = -1; r < kLatRuns; ++r) {
      const int iters = r < 0 ? warm : K;
      comm.bootstrap().barrier();
      PingResult p{0, 0};
      if (me <= 1) p = e.pingPong(iters, base, variant);
      base += uint64_t(iters);
      // The rank that started second has no start skew in its time.
      const auto t = allGather(comm, p.seconds);
      if (r >= 0 && me == 0) {
        evt[variant].push_back(std::min(t[0], t[1]) / iters * 1e6);
        steady[variant].push_back(double(p.steadyNs) / (iters - 1) * 1e-3);
      }
    }
  // Both ranks' signal must now hold exactly the number of round trips.
  const uint64_t got = me <= 1 ? e.readSignal(kSigPing) : base;
  const auto all = allGather(comm, got);
  for (int r = 0; r < 2; ++r)
    if (all[size_t(r)] != base)
      throw Failure(fmt("signal-lat verification failed: rank %d's signal is %" PRIu64 " after %" PRIu64
                        " round trips (expected %" PRIu64 ")",
                        r, all[size_t(r)], base, base));
  comm.bootstrap().barrier();
  if (me != 0) return;

  rep->head = headLines(o, s, where);
  rep->method = {
      "ping-pong between rank 0 and rank 1, one thread each side, signal kSigPing:",
      "  rank 0: net.signal(world, 1, SignalInc) then net.waitSignal(CoopThread, sig, i+1);",
      "  rank 1: net.waitSignal(CoopThread, sig, i+1) then net.signal(world, 0, SignalInc)",
      gpu ? fmt("launch: one kernel of 1 CTA x 1 thread per rank, both started after a host barrier, each running "
                "all ITERS = %d round trips",
                K)
          : fmt("launch: one call per rank thread, both started after a host barrier, each running all ITERS = %d "
                "round trips",
                K),
      fmt("warm-up: one run of %d round trips; then %d timed runs; reported: median, min, max over the runs", warm,
          kLatRuns),
      fmt("timer (row 1): %s around each rank's run; per run the smaller of the two", timerName(gpu).c_str()),
      "  times (the rank that started second has no start skew in it) / ITERS",
      fmt("timer (row 2): rank 0's clock inside the run (%s) from the end of round trip 1 to the end,",
          gpu ? "%globaltimer" : "steady_clock"),
      "  / (ITERS-1): the same loop, with no launch or start skew in it",
      "verified: afterwards each rank's signal equals the total number of round trips",
      "rows 'release/acquire': signal() releases the caller's earlier writes, the wait acquires (the defaults);",
      "rows 'alreadyReleased/acquire': the caller has nothing to publish and says so (no release fence);",
      "rows 'alreadyReleased/relaxed': and the wait is relaxed too (nothing to acquire): the signal's own latency",
  };
  if (!gpu) rep->method.push_back("CPU emulation: the waiting thread polls and yields its core every 64 polls");
  auto row = [&](const std::string& name, const std::vector<double>& v) {
    rep->table.rows.push_back({name, fmt("%.3f", median(v)), fmt("%.3f", *std::min_element(v.begin(), v.end())),
                               fmt("%.3f", *std::max_element(v.begin(), v.end())), fmt("%.3f", median(v) / 2)});
  };
  rep->table.header = {"metric", "median us", "min us", "max us", "one-way us (median/2)"};
  for (int v = 0; v < kModes; ++v) {
    const std::string tag = v == 0 ? "release/acquire" : v == 1 ? "alreadyReleased/acquire" : "alreadyReleased/relaxed";
    row("round trip, " + tag + " (" + (gpu ? "cudaEvents" : "chrono") + " / iters)", evt[v]);
    row("round trip, " + tag + " (in-run " + (gpu ? "globaltimer" : "clock") + ")", steady[v]);
  }
  const std::string nccl =
      !gpu ? "CPU emulation: NCCL's device API runs on GPUs only"
           : "not measured: NCCL 2.28's device-side signals belong to ncclGin, which runs over a GIN-capable network "
             "plugin, not over the load/store path between GPUs of one host; its LSA API has no signal object";
  rep->notes.push_back("nccl: " + nccl);
  commonJson(*rep, o, s, where);
  auto arr = [](const std::vector<double>& v) {
    J a = J::arr();
    for (double x : v) a.push(J::num(x));
    return a;
  };
  rep->json.set("method", J::obj()
                              .set("operation", "signal(SignalInc) + waitSignal ping-pong, rank 0 <-> rank 1")
                              .set("launch", "1x1 per rank")
                              .set("iters", double(K))
                              .set("warmup_iters", double(warm))
                              .set("runs", double(kLatRuns))
                              .set("timer", timerName(gpu)));
  rep->json.set("verified", J::boolean(true));
  rep->json.set("results", J::obj()
                               .set("round_trip_us_median", median(evt[0]))
                               .set("round_trip_us_runs", arr(evt[0]))
                               .set("round_trip_in_run_clock_us_median", median(steady[0]))
                               .set("round_trip_in_run_clock_us_runs", arr(steady[0]))
                               .set("already_released_round_trip_us_median", median(evt[1]))
                               .set("already_released_round_trip_us_runs", arr(evt[1]))
                               .set("already_released_in_run_clock_us_median", median(steady[1]))
                               .set("relaxed_round_trip_us_median", median(evt[2]))
                               .set("relaxed_round_trip_us_runs", arr(evt[2])));
  rep->json.set("nccl", J::obj().set("measured", J::boolean(false)).set("reason", nccl));
}

}  // namespace bench
