// Tests of the ring AllReduce baseline (examples/allreduce/ring_allreduce.hpp)
// on CPU ranks: float, double, int32 and int64 with sum, prod, min and max,
// counts 0, 1, primes and sizes that are not multiples of anything, 1..8 ranks,
// checked against a host reference with a tolerance per type, results
// bitwise identical on every rank, poison around the data intact; once more
// over the proxy transport.
#include <catch2/catch_test_macros.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "../../examples/allreduce/ring_allreduce.hpp"
#include "../common/ranks.hpp"

using namespace gin;
using gintest::expect;
using gintest::runRanks;

namespace {
constexpr uint8_t kPoison = 0xAB;
constexpr size_t kHead = 24;  // data starts 24 bytes into the window: poison before it

uint64_t mixBits(uint64_t seed, int rank, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ (uint64_t(i) * 0xD1B54A32D192ED03ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// Rank `rank`'s element i: [-1, 1] (prod: [0.5, 1.5]) for floating point,
// [-1000, 1000] (prod: one of -2, -1, 1, 2) for integers.
template <class T, class Op>
T input(uint64_t seed, int rank, size_t i) {
  const uint64_t x = mixBits(seed, rank, i);
  constexpr bool prod = std::is_same_v<Op, ginex::Prod>;
  if constexpr (std::is_floating_point_v<T>) {
    const T u = T(double(x >> 11) * 0x1.0p-53);  // [0, 1)
    return prod ? T(0.5) + u : T(2) * u - T(1);
  } else {
    if (prod) {
      const T v[] = {-2, -1, 1, 2};
      return v[x % 4];
    }
    return T(int64_t(x % 2001) - 1000);
  }
}

template <class T, class Op>
void check(const std::vector<T>& got, int n, size_t count, uint64_t seed, const std::string& what) {
  const Op op{};
  for (size_t i = 0; i < count; ++i) {
    T ref = input<T, Op>(seed, 0, i);
    double mag = std::fabs(double(ref));
    for (int r = 1; r < n; ++r) {
      const T x = input<T, Op>(seed, r, i);
      ref = op(ref, x);
      mag += std::fabs(double(x));
    }
    bool good;
    if constexpr (std::is_floating_point_v<T>) {
      const double eps = double(std::numeric_limits<T>::epsilon());
      // Sum: n roundings of partial sums bounded by sum |x|. Prod: n relative roundings.
      const double tol = std::is_same_v<Op, ginex::Prod>  ? 4.0 * n * eps * std::fabs(double(ref))
                         : std::is_same_v<Op, ginex::Sum> ? 2.0 * n * eps * mag
                                                          : 0.0;
      good = std::fabs(double(got[i]) - double(ref)) <= tol;
    } else {
      good = got[i] == ref;
    }
    if (!good)
      expect(false, what + ": element " + std::to_string(i) + " of " + std::to_string(count) + " is " +
                        std::to_string(double(got[i])) + ", reference " + std::to_string(double(ref)));
  }
}

// One AllReduce on every rank; results gathered into `results[rank]`.
template <class T, class Op>
void oneCase(Comm& comm, const p2p::Endpoint<>& ep, Window w, size_t winBytes, size_t count, size_t tmpElts,
             uint64_t seed, std::vector<std::vector<uint8_t>>& results, const std::string& what) {
  const int me = comm.rank();
  auto* base = static_cast<uint8_t*>(comm.localPointer(w));
  std::memset(base, kPoison, winBytes);
  T* data = reinterpret_cast<T*>(base + kHead);
  for (size_t i = 0; i < count; ++i) data[i] = input<T, Op>(seed, me, i);
  std::vector<T> tmp(tmpElts);
  comm.bootstrap().barrier();
  expect(ginex::ringAllReduce(CoopThread{}, ep, w, kHead, count, tmp.data(), tmpElts, Op{}), what + ": gave up");
  bool poison = true;
  for (size_t i = 0; i < kHead; ++i) poison &= base[i] == kPoison;
  for (size_t i = kHead + count * sizeof(T); i < winBytes; ++i) poison &= base[i] == kPoison;
  expect(poison, what + ": wrote outside the data");
  std::vector<T> got(data, data + count);
  check<T, Op>(got, comm.nRanks(), count, seed, what);
  results[size_t(me)].assign(reinterpret_cast<uint8_t*>(data), reinterpret_cast<uint8_t*>(data + count));
  comm.bootstrap().barrier();
  for (int r = 0; r < comm.nRanks(); ++r)
    expect(results[size_t(r)] == results[size_t(me)],
           what + ": ranks " + std::to_string(r) + " and " + std::to_string(me) + " disagree bitwise");
  comm.bootstrap().barrier();
}

template <class T>
void allOps(Comm& comm, const p2p::Endpoint<>& ep, Window w, size_t winBytes, const std::vector<size_t>& counts,
            size_t tmpElts, std::vector<std::vector<uint8_t>>& results, const char* type) {
  for (size_t count : counts) {
    const std::string at =
        std::string(type) + " count " + std::to_string(count) + " n " + std::to_string(comm.nRanks());
    oneCase<T, ginex::Sum>(comm, ep, w, winBytes, count, tmpElts, count * 4 + 1, results, "sum " + at);
    oneCase<T, ginex::Prod>(comm, ep, w, winBytes, count, tmpElts, count * 4 + 2, results, "prod " + at);
    oneCase<T, ginex::Min>(comm, ep, w, winBytes, count, tmpElts, count * 4 + 3, results, "min " + at);
    oneCase<T, ginex::Max>(comm, ep, w, winBytes, count, tmpElts, count * 4 + 4, results, "max " + at);
  }
}

void allTypes(int n, const std::vector<size_t>& counts, CommConfig cfg) {
  size_t maxCount = 0;
  for (size_t c : counts) maxCount = std::max(maxCount, c);
  std::vector<std::vector<uint8_t>> results(size_t(n), std::vector<uint8_t>{});
  REQUIRE_NOTHROW(runRanks(
      n,
      [&](Comm& comm) {
        p2p::Config pc;
        pc.chunkBytes = 256;
        pc.nSlots = 4;
        p2p::Fifo fifo = p2p::create(comm, pc);
        const size_t winBytes = kHead + maxCount * 8 + 40;
        Window w = comm.allocWindow(winBytes);
        p2p::Endpoint ep(Net(comm.devComm(), 0), fifo);
        const size_t tmpElts = 37;  // pieces smaller than the shards: the ReduceScatter pipelines
        allOps<float>(comm, ep, w, winBytes, counts, tmpElts, results, "float");
        allOps<double>(comm, ep, w, winBytes, counts, tmpElts, results, "double");
        allOps<int32_t>(comm, ep, w, winBytes, counts, tmpElts, results, "int32");
        allOps<int64_t>(comm, ep, w, winBytes, counts, tmpElts, results, "int64");
        comm.check();
        comm.bootstrap().barrier();
        comm.deregisterWindow(w);
        p2p::destroy(comm, fifo);
      },
      cfg));
}
}  // namespace

TEST_CASE("ring AllReduce: float, double, int32, int64 x sum, prod, min, max; counts 0, 1, primes; 1..8 ranks",
          "[allreduce]") {
  const std::vector<size_t> counts = {0, 1, 2, 3, 7, 8, 13, 97, 1000, 4099};
  for (int n : {1, 2, 3, 5, 8}) {
    CAPTURE(n);
    allTypes(n, counts, gintest::cpuConfig());
  }
}

TEST_CASE("ring AllReduce: 65537 elements on 4 ranks", "[allreduce]") { allTypes(4, {65537}, gintest::cpuConfig()); }

TEST_CASE("ring AllReduce over the proxy transport", "[allreduce][proxy]") {
  CommConfig cfg = gintest::cpuConfig();
  cfg.transport = TransportChoice::Proxy;
  allTypes(3, {0, 1, 5, 97, 1001}, cfg);
}
