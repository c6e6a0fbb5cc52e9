// The ibgda transport's mlx5 NIC (gin/host/ibgda_mlx5.hpp) end to end on CPU
// ranks as threads, over tests/common/fake_verbs.hpp: an in-process model of
// libibverbs and the mlx5dv calls the NIC makes (this executable links
// neither library), whose "hardware" is one gin::SoftNic per QP consuming the
// send queue, doorbell record, UAR word and CQ that mlx5dv_init_obj handed
// out. What this proves: the host setup itself — device choice, PD, CQs and
// QPs and their geometry checks, the tables the device code reads, key and
// address exchange, INIT/RTR/RTS with atomic access, window and signal
// registration, teardown order — and that the device API works through it.
// What it cannot prove: anything about a ConnectX NIC (none was available).
#include "../common/fake_verbs.hpp"  // first: defines the ibv_* and mlx5dv_* functions

#define GIN_IBGDA_MLX5 1
#include <catch2/catch_get_random_seed.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include "../common/net_checks.hpp"
#include "gin/host/test_access.hpp"

using namespace gin;
using Catch::Matchers::ContainsSubstring;
using gin::test::CommAccess;
using gintest::expect;
using gintest::runRanks;

namespace {

void resetFake() {
  fakeverbs::ctl.devicePresent = true;
  fakeverbs::ctl.linkLayer = IBV_LINK_LAYER_ETHERNET;
  fakeverbs::ctl.overflows = 0;
  fakeverbs::ctl.badAttrs = 0;
  fakeverbs::ctl.lastBadAttr.clear();
  fakeverbs::ctl.mlx5 = true;
  fakeverbs::ctl.atomicCap = IBV_ATOMIC_HCA;
  fakeverbs::ctl.forceCqeSize = 0;
  fakeverbs::ctl.extraSqFactor = 1;
  fakeverbs::ctl.mlx5Qps = 0;
  fakeverbs::ctl.devxQps = 0;
  fakeverbs::ctl.devxFailOpcode = 0;
  fakeverbs::ctl.nicExecuted = 0;
  fakeverbs::ctl.maxMsgBytes = 1u << 30;
}

CommConfig mlx5Config(uint32_t depth = 64, uint32_t maxWqeBytes = 4096, int nContexts = 2, bool devx = false) {
  CommConfig c = gintest::cpuConfig();
  c.transport = TransportChoice::Ibgda;
  c.ibgda.device = IbgdaConfig::Device::Mlx5;
  c.ibgda.queues = devx ? IbgdaConfig::Queues::Gpu : IbgdaConfig::Queues::Host;
  c.ibgda.qpDepth = depth;
  c.ibgda.maxWqeBytes = maxWqeBytes;
  c.nContexts = nContexts;
  return c;
}

// Nothing the model checks went wrong (QP attributes, teardown order).
void requireModelClean() {
  INFO(fakeverbs::ctl.lastBadAttr);
  CHECK(fakeverbs::ctl.badAttrs == 0);
  CHECK(fakeverbs::ctl.overflows == 0);
  std::lock_guard<std::recursive_mutex> lk(fakeverbs::mu);
  CHECK(fakeverbs::qps.empty());
  CHECK(fakeverbs::mrs.empty());
  CHECK(fakeverbs::pds.empty());
  CHECK(fakeverbs::cqs.empty());
  CHECK(fakeverbs::umems.empty());
  CHECK(fakeverbs::uars.empty());
  CHECK(fakeverbs::devxCqs.empty());
}

void requireEveryRank(const std::vector<std::string>& msgs, const std::vector<std::string>& parts) {
  for (size_t r = 0; r < msgs.size(); ++r) {
    INFO("rank " << r << ": " << msgs[r]);
    CHECK(!msgs[r].empty());
    for (const std::string& p : parts) CHECK_THAT(msgs[r], ContainsSubstring(p));
  }
}

}  // namespace

TEST_CASE("ibgda on mlx5: a QP per (context, peer); the tables point at the queues libmlx5 or the DEVX commands made",
          "[ibgda][mlx5][devx]") {
  resetFake();
  const bool devx = GENERATE(false, true);
  CAPTURE(devx);
  gintest::EnvVar noDev("GIN_IB_DEVICE", nullptr);
  REQUIRE_NOTHROW(runRanks(
      3,
      [devx](Comm& comm) {
        const DevComm dc = comm.devComm();
        IbgdaTransport* t = CommAccess::ibgda(comm);
        expect(t && t->mlx5() && t->mlx5()->devx() == devx, "no mlx5 NIC with this placement behind the transport");
        expect(t->mlx5()->deviceName() == "fake0" && t->mlx5()->roce() && t->mlx5()->gidIndex() == 3,
               "device fake0, RoCE, the v2 IPv4 GID (index 3)");
        bool threw = false;
        try {
          (void)t->nic();
        } catch (const Error&) {
          threw = true;
        }
        expect(threw, "nic() on an mlx5 transport must say there is no soft NIC");
        std::set<const void*> sqs, uarsSeen;
        for (int ctx = 0; ctx < dc.nContexts; ++ctx) {
          const uint64_t* uar = nullptr;
          for (int p = 0; p < comm.nRanks(); ++p) {
            const IbgdaQpDev* d = ibgda::qpOf(dc, ctx, p);
            const Mlx5Nic::Queues* q = t->mlx5()->queues(ctx, p);
            expect(q && d->qpn == q->qpn && d->sq == q->sq && d->cq == q->cq && d->dbrec == q->dbrec &&
                       d->uar == q->uar && d->cqDbrec == q->cqDbrec,
                   "IbgdaQpDev does not carry the queue addresses");
            // libmlx5 makes a CQ of cqe + 1 rounded up (128); DEVX ones hold qpDepth CQEs.
            expect(d->nWqe == 64 && d->nCqe == (devx ? 64u : 128u), "nWqe is qpDepth; nCqe what the CQ holds");
            expect(d->scratchLkey == t->mlx5()->scratchLkey(), "scratch lkey");
            if (devx) {
              expect(uintptr_t(d->sq) % 4096 == 0 && uintptr_t(d->cq) % 4096 == 0, "queues on 4 KiB boundaries");
              expect(!uar || uar == d->uar, "the QPs of one context share its UAR");
            }
            uar = d->uar;
            sqs.insert(d->sq);
          }
          uarsSeen.insert(uar);
        }
        expect(sqs.size() == size_t(dc.nContexts * comm.nRanks()), "every QP has its own send queue");
        if (devx) expect(uarsSeen.size() == size_t(dc.nContexts), "one UAR per context");
        for (int p = 0; p < comm.nRanks(); ++p)
          expect(dc.ibgda->signalRemotes[p].rkey != 0 && dc.ibgda->signalRemotes[p].addr != 0, "signal remote key");
        comm.bootstrap().barrier();
      },
      mlx5Config(64, 4096, 2, devx)));
  CHECK(fakeverbs::ctl.mlx5Qps == 3 * 3 * 2);
  CHECK(fakeverbs::ctl.devxQps == (devx ? 3u * 3 * 2 : 0u));
  requireModelClean();
}

// The data-path cases run with both placements: the queues libmlx5 made
// (host memory) and DEVX objects on the rank's own memory (queues = Gpu;
// host memory on these CPU ranks).
TEST_CASE("ibgda on mlx5: puts of every size arrive whole, signal and counter count", "[ibgda][mlx5]") {
  resetFake();
  const bool devx = GENERATE(false, true);
  const int nRanks = GENERATE(1, 2, 3);
  const size_t bytes = GENERATE(size_t(0), size_t(1), size_t(4096), size_t(70001));
  CAPTURE(devx, nRanks, bytes);
  REQUIRE_NOTHROW(runRanks(
      nRanks, [&](Comm& comm) { gintest::allToAllPut(comm, bytes, 3, 5, bytes + 17); },
      mlx5Config(64, 4096, 2, devx)));
  // Every put is its payload WQEs (4096 bytes each) and a signal WQE, per context and peer.
  const uint64_t perPut = (bytes + 4095) / 4096 + 1;
  CHECK(fakeverbs::ctl.nicExecuted == uint64_t(nRanks) * uint64_t(nRanks) * 2 * perPut);
  CHECK(fakeverbs::ctl.devxQps == (devx ? uint64_t(nRanks) * uint64_t(nRanks) * 2 : 0));
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: putValue of every width, SignalInc/Add/Set (host-order words), counters", "[ibgda][mlx5]") {
  resetFake();
  const bool devx = GENERATE(false, true);
  CAPTURE(devx);
  REQUIRE_NOTHROW(runRanks(
      3,
      [](Comm& comm) {
        gintest::putValueAndSignals(comm);
        Window w = comm.allocWindow(64 * size_t(comm.nRanks()));
        gintest::putValueWidths(comm, w, 1);
        comm.bootstrap().barrier();
        comm.deregisterWindow(w);
      },
      mlx5Config(64, 4096, 2, devx)));
  CHECK(fakeverbs::ctl.devxQps == (devx ? 3u * 3 * 2 : 0u));
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: a waiter that sees the signal sees the payload; a small queue wraps", "[ibgda][mlx5]") {
  resetFake();
  const bool devx = GENERATE(false, true);
  CAPTURE(devx);
  REQUIRE_NOTHROW(runRanks(
      2, [](Comm& comm) { gintest::signalAfterPayload(comm); }, mlx5Config(16, 1024, 3, devx)));
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: GIN_IB_DEVICE names the device; a missing one is an error on every rank", "[ibgda][mlx5]") {
  resetFake();
  {
    gintest::EnvVar dev("GIN_IB_DEVICE", "fake0:1");
    REQUIRE_NOTHROW(runRanks(
        2, [](Comm& comm) { expect(CommAccess::ibgda(comm)->mlx5()->port() == 1, "port 1"); }, mlx5Config()));
  }
  {
    gintest::EnvVar dev("GIN_IB_DEVICE", "mlx5_9");
    requireEveryRank(gintest::rankErrors(3, mlx5Config()), {"ibgda (mlx5): setting up the mlx5 NIC failed on rank",
                                                            "GIN_IB_DEVICE=mlx5_9: no such device", "found: fake0"});
  }
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: no RDMA device, or none that is mlx5: a clear error on every rank, no hang",
          "[ibgda][mlx5]") {
  resetFake();
  gintest::EnvVar noDev("GIN_IB_DEVICE", nullptr);
  fakeverbs::ctl.devicePresent = false;
  requireEveryRank(gintest::rankErrors(3, mlx5Config()),
                   {"no RDMA device found", "GIN_TRANSPORT=proxy", "GIN_IBGDA_DEVICE=soft"});
  fakeverbs::ctl.devicePresent = true;
  fakeverbs::ctl.mlx5 = false;
  requireEveryRank(gintest::rankErrors(2, mlx5Config()), {"no mlx5 device among the RDMA devices found (fake0)"});
  {
    gintest::EnvVar dev("GIN_IB_DEVICE", "fake0");
    requireEveryRank(gintest::rankErrors(2, mlx5Config()), {"GIN_IB_DEVICE=fake0 is not a mlx5 device"});
  }
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: a GID index outside the table is an error on every rank", "[ibgda][mlx5]") {
  resetFake();
  gintest::EnvVar gid("GIN_IB_GID_INDEX", "9");
  requireEveryRank(gintest::rankErrors(2, mlx5Config()),
                   {"GIN_IB_GID_INDEX=\"9\" is not an index of the GID table (0..3)"});
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: a device without host-order atomics, or queues that do not fit, are refused",
          "[ibgda][mlx5]") {
  resetFake();
  fakeverbs::ctl.atomicCap = IBV_ATOMIC_NONE;
  requireEveryRank(gintest::rankErrors(2, mlx5Config()), {"IBV_ATOMIC_NONE", "GIN_TRANSPORT=proxy"});
  resetFake();
  fakeverbs::ctl.forceCqeSize = 128;
  requireEveryRank(gintest::rankErrors(2, mlx5Config()), {"do not fit gin's device code", "CQE size 128 (need 64)"});
  resetFake();
  fakeverbs::ctl.extraSqFactor = 2;
  requireEveryRank(gintest::rankErrors(2, mlx5Config()), {"send queue of 128 WQEBBs (need exactly qpDepth = 64)"});
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: InfiniBand addressing (LID, no GRH) connects too", "[ibgda][mlx5]") {
  resetFake();
  const bool devx = GENERATE(false, true);
  CAPTURE(devx);
  fakeverbs::ctl.linkLayer = IBV_LINK_LAYER_INFINIBAND;
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        expect(!CommAccess::ibgda(comm)->mlx5()->roce(), "InfiniBand expected");
        gintest::allToAllPut(comm, 100, 0, 0, 7);
      },
      mlx5Config(64, 4096, 2, devx)));
  CHECK(fakeverbs::ctl.devxQps == (devx ? 2u * 2 * 2 : 0u));
  requireModelClean();
}

TEST_CASE("ibgda on mlx5: maxWqeBytes above the port's max_msg_sz is lowered to it; puts split accordingly",
          "[ibgda][mlx5]") {
  resetFake();
  fakeverbs::ctl.maxMsgBytes = 1000;
  REQUIRE_NOTHROW(runRanks(
      2,
      [](Comm& comm) {
        expect(comm.devComm().ibgda->maxWqeBytes == 1000, "the device table's maxWqeBytes is " +
                                                              std::to_string(comm.devComm().ibgda->maxWqeBytes) +
                                                              ", the port allows 1000 per message");
        expect(CommAccess::ibgda(comm)->config().maxWqeBytes == 1000, "config() does not report the value in use");
        gintest::allToAllPut(comm, 70001, 3, 5, 23);
      },
      mlx5Config(64, 4096)));
  // Every put: 71 payload WQEs of at most 1000 bytes and a signal WQE, per context and peer.
  CHECK(fakeverbs::ctl.nicExecuted == 2ull * 2 * 2 * (71 + 1));
  // A port that reports more than asked for leaves maxWqeBytes as it is.
  resetFake();
  REQUIRE_NOTHROW(runRanks(
      1, [](Comm& comm) { expect(comm.devComm().ibgda->maxWqeBytes == 4096, "maxWqeBytes 4096 changed"); },
      mlx5Config(64, 4096)));
  requireModelClean();
}

// ---- queues = Gpu: DEVX objects on the rank's own memory (host memory on
// these CPU ranks; GPU memory on GPU ranks, which no ConnectX ran).

CommConfig devxConfig(uint32_t depth = 64, uint32_t maxWqeBytes = 4096, int nContexts = 2) {
  return mlx5Config(depth, maxWqeBytes, nContexts, true);
}

TEST_CASE("ibgda on mlx5: GIN_IBGDA_QUEUES=gpu picks the DEVX queues, =host the libmlx5 ones", "[ibgda][mlx5][devx]") {
  for (const char* v : {"gpu", "host"}) {
    resetFake();
    gintest::EnvVar q("GIN_IBGDA_QUEUES", v);
    CommConfig c = mlx5Config();
    c.ibgda.queues = IbgdaConfig::Queues::Auto;
    const bool want = std::string(v) == "gpu";
    REQUIRE_NOTHROW(runRanks(
        2,
        [&](Comm& comm) {
          expect(CommAccess::ibgda(comm)->mlx5()->devx() == want, std::string("GIN_IBGDA_QUEUES=") + v);
          gintest::allToAllPut(comm, 64, 0, 0, 3);
        },
        c));
    CHECK(fakeverbs::ctl.devxQps == (want ? 2u * 2 * 2 : 0u));
    requireModelClean();
  }
}

TEST_CASE("ibgda on mlx5, queues = Gpu: a firmware command that fails is an error on every rank, naming it",
          "[ibgda][mlx5][devx]") {
  const std::pair<uint32_t, const char*> cmds[] = {
      {0x400, "DEVX CREATE_CQ"}, {0x500, "DEVX CREATE_QP"}, {0x502, "DEVX RST2INIT_QP"},
      {0x503, "DEVX INIT2RTR_QP"}, {0x504, "DEVX RTR2RTS_QP"}};
  for (const auto& [op, name] : cmds) {
    resetFake();
    fakeverbs::ctl.devxFailOpcode = op;
    INFO(name);
    requireEveryRank(gintest::rankErrors(2, devxConfig()), {name, "status 0x3, syndrome 0x5eed"});
    requireModelClean();
  }
}

TEST_CASE("mlx5 commands: putField/getField store and read fields as the model's bit-by-bit reader does",
          "[mlx5][devx]") {
  std::mt19937_64 rng(Catch::getSeed());
  for (int i = 0; i < 5000; ++i) {
    mlx5cmd::In a{};
    for (auto& b : a) b = uint8_t(rng());
    const mlx5cmd::In before = a;
    const uint32_t bits = rng() % 8 == 0 ? 64 : 1 + uint32_t(rng() % 32);
    const uint32_t off =
        bits == 64 ? 32 * uint32_t(rng() % 66) : 32 * uint32_t(rng() % 68) + uint32_t(rng() % (33 - bits));
    const uint64_t v = rng() & (bits == 64 ? ~0ull : (1ull << bits) - 1);
    mlx5cmd::putField(a.data(), {off, bits}, v);
    INFO("field at bit " << off << ", " << bits << " bits, value " << v);
    REQUIRE(fakeverbs::fld(a.data(), off, bits) == v);
    REQUIRE(mlx5cmd::getField(a.data(), {off, bits}) == v);
    bool othersKept = true;  // every other bit is as it was
    for (uint32_t b = 0; b < a.size() * 8; ++b)
      if (b < off || b >= off + bits)
        othersKept &= fakeverbs::fld(a.data(), b, 1) == fakeverbs::fld(before.data(), b, 1);
    REQUIRE(othersKept);
  }
  // The PRM's own example: the opcode is the first 16 bits, big-endian.
  mlx5cmd::In c = mlx5cmd::modifyQp(mlx5cmd::kInit2RtrQp, 0xabcdef);
  CHECK(c[0] == 0x05);
  CHECK(c[1] == 0x03);
  CHECK((c[9] == 0xab && c[10] == 0xcd && c[11] == 0xef));  // qpn: bits 0x48..0x5f
}
