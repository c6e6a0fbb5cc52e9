// Tests of gin/device/mlx5/prm.hpp: every segment gin builds is byte-identical
// to the one rdma-core's own helpers and structs (<infiniband/mlx5dv.h>) build
// from the same randomized fields, and CQEs parse back exactly both ways.
#include <infiniband/mlx5dv.h>

#include <catch2/catch_test_macros.hpp>
#include <cstring>
#include <random>

#include "gin/device/mlx5/prm.hpp"

namespace m = gin::mlx5;

namespace {
constexpr int kRounds = 20000;

template <class A, class B>
bool sameBytes(const A& a, const B& b) {
  static_assert(sizeof(A) == sizeof(B));
  return std::memcmp(&a, &b, sizeof(A)) == 0;
}
}  // namespace

TEST_CASE("mlx5 prm: constants equal rdma-core's", "[mlx5]") {
  STATIC_REQUIRE(int(m::kOpNop) == int(MLX5_OPCODE_NOP));
  STATIC_REQUIRE(int(m::kOpRdmaWrite) == int(MLX5_OPCODE_RDMA_WRITE));
  STATIC_REQUIRE(int(m::kOpRdmaWriteImm) == int(MLX5_OPCODE_RDMA_WRITE_IMM));
  STATIC_REQUIRE(int(m::kOpAtomicCs) == int(MLX5_OPCODE_ATOMIC_CS));
  STATIC_REQUIRE(int(m::kOpAtomicFa) == int(MLX5_OPCODE_ATOMIC_FA));
  STATIC_REQUIRE(int(m::kCtrlCqUpdate) == int(MLX5_WQE_CTRL_CQ_UPDATE));
  STATIC_REQUIRE(int(m::kCtrlSolicited) == int(MLX5_WQE_CTRL_SOLICITED));
  STATIC_REQUIRE(int(m::kCtrlFence) == int(MLX5_WQE_CTRL_FENCE));
  STATIC_REQUIRE(int(m::kInlineSeg) == int(MLX5_INLINE_SEG));
  STATIC_REQUIRE(int(m::kSendWqeBB) == int(MLX5_SEND_WQE_BB));
  STATIC_REQUIRE(int(m::kCqeReq) == int(MLX5_CQE_REQ));
  STATIC_REQUIRE(int(m::kCqeReqErr) == int(MLX5_CQE_REQ_ERR));
  STATIC_REQUIRE(int(m::kCqeRespErr) == int(MLX5_CQE_RESP_ERR));
  STATIC_REQUIRE(int(m::kCqeInvalid) == int(MLX5_CQE_INVALID));
  STATIC_REQUIRE(int(m::kSynLocalProtErr) == int(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR));
  STATIC_REQUIRE(int(m::kSynRemoteAccessErr) == int(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR));
  STATIC_REQUIRE(int(m::kSynLocalQpOpErr) == int(MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR));
  STATIC_REQUIRE(int(m::kSynRemoteInvalReqErr) == int(MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR));
  STATIC_REQUIRE(int(m::kSynWrFlushErr) == int(MLX5_CQE_SYNDROME_WR_FLUSH_ERR));
  STATIC_REQUIRE(int(m::kSynLocalLengthErr) == int(MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR));
  STATIC_REQUIRE(sizeof(m::CtrlSeg) == sizeof(mlx5_wqe_ctrl_seg));
  STATIC_REQUIRE(sizeof(m::Cqe64) == sizeof(mlx5_cqe64));
  STATIC_REQUIRE(offsetof(mlx5_cqe64, wqe_counter) == m::kCqeWqeCounter);
  STATIC_REQUIRE(offsetof(mlx5_cqe64, op_own) == m::kCqeOpOwn);
  STATIC_REQUIRE(offsetof(mlx5_cqe64, signature) == m::kCqeSignature);
  STATIC_REQUIRE(offsetof(mlx5_cqe64, byte_cnt) == m::kCqeByteCnt);
  STATIC_REQUIRE(offsetof(mlx5_cqe64, sop_drop_qpn) == m::kCqeSopDropQpn);
  STATIC_REQUIRE(offsetof(mlx5_err_cqe, syndrome) == m::kCqeSyndrome);
  STATIC_REQUIRE(offsetof(mlx5_err_cqe, vendor_err_synd) == m::kCqeVendorSyndrome);
  STATIC_REQUIRE(offsetof(mlx5_err_cqe, s_wqe_opcode_qpn) == m::kCqeSopDropQpn);
}

TEST_CASE("mlx5 prm: control segment is byte-identical to mlx5dv_set_ctrl_seg and parses back", "[mlx5]") {
  std::mt19937_64 rng(1);
  const uint8_t ops[] = {m::kOpNop, m::kOpRdmaWrite, m::kOpRdmaWriteImm, m::kOpAtomicCs, m::kOpAtomicFa};
  for (int i = 0; i < kRounds; ++i) {
    const uint16_t pi = uint16_t(rng());
    const uint8_t opcode = ops[rng() % 5], opmod = uint8_t(rng()), ds = uint8_t(rng() % 64);
    const uint32_t qpn = uint32_t(rng()) & 0xffffff, imm = uint32_t(rng());
    const uint8_t fmCeSe = uint8_t(rng()), signature = uint8_t(rng());
    mlx5_wqe_ctrl_seg ref;
    std::memset(&ref, 0, sizeof ref);
    mlx5dv_set_ctrl_seg(&ref, pi, opcode, opmod, qpn, fmCeSe, ds, signature, imm);
    const m::CtrlSeg ours = m::makeCtrl(pi, opcode, opmod, qpn, ds, fmCeSe, imm, signature);
    REQUIRE(sameBytes(ours, ref));
    REQUIRE(m::ctrlOpcode(ours) == opcode);
    REQUIRE(m::ctrlWqeIndex(ours) == pi);
    REQUIRE(m::ctrlOpmod(ours) == opmod);
    REQUIRE(m::ctrlQpn(ours) == qpn);
    REQUIRE(m::ctrlDs(ours) == ds);
    REQUIRE(ours.fmCeSe == fmCeSe);
    REQUIRE(ours.imm == imm);
  }
}

TEST_CASE("mlx5 prm: data, remote address, inline and atomic segments match mlx5dv.h", "[mlx5]") {
  std::mt19937_64 rng(2);
  for (int i = 0; i < kRounds; ++i) {
    const uint32_t len = uint32_t(rng()), key = uint32_t(rng()), rkey = uint32_t(rng());
    const uint64_t addr = rng(), raddr = rng(), add = rng(), cmp = rng();

    mlx5_wqe_data_seg dref;
    mlx5dv_set_data_seg(&dref, len, key, uintptr_t(addr));
    const m::DataSeg d = m::makeData(len, key, addr);
    REQUIRE(sameBytes(d, dref));
    REQUIRE((m::dataBytes(d) == len && m::dataKey(d) == key && m::dataAddr(d) == addr));

    mlx5_wqe_raddr_seg rref;
    rref.raddr = htobe64(raddr);
    rref.rkey = htobe32(rkey);
    rref.reserved = 0;
    const m::RaddrSeg r = m::makeRaddr(raddr, rkey);
    REQUIRE(sameBytes(r, rref));
    REQUIRE((m::raddrAddr(r) == raddr && m::raddrKey(r) == rkey));

    mlx5_wqe_atomic_seg aref;
    aref.swap_add = htobe64(add);
    aref.compare = 0;
    const m::AtomicSeg fa = m::makeFetchAdd(add);
    REQUIRE(sameBytes(fa, aref));
    REQUIRE(m::atomicSwapAdd(fa) == add);
    aref.compare = htobe64(cmp);
    const m::AtomicSeg cs = m::makeCompareSwap(cmp, add);
    REQUIRE(sameBytes(cs, aref));
    REQUIRE((m::atomicSwapAdd(cs) == add && m::atomicCompare(cs) == cmp));

    const uint32_t inl = len & 0x3ff;
    mlx5_wqe_inl_data_seg iref;
    iref.byte_count = htobe32(inl | MLX5_INLINE_SEG);
    const m::InlineSeg is = m::makeInline(inl);
    REQUIRE(sameBytes(is, iref));
    REQUIRE(m::inlineBytes(is) == inl);
    REQUIRE(m::isInline(is.byteCount));
    REQUIRE(!m::isInline(dref.byte_count) == !(len & MLX5_INLINE_SEG));
  }
}

TEST_CASE("mlx5 prm: CQEs parse back exactly, both ways", "[mlx5]") {
  std::mt19937_64 rng(3);
  for (int i = 0; i < kRounds; ++i) {
    const uint16_t wc = uint16_t(rng());
    const uint32_t qpn = uint32_t(rng()) & 0xffffff, bytes = uint32_t(rng());
    const uint8_t syn = uint8_t(rng()), vsyn = uint8_t(rng()), wop = uint8_t(rng()), owner = uint8_t(rng() & 1);
    const bool err = (rng() & 1) != 0;
    const uint8_t opcode = err ? m::kCqeReqErr : m::kCqeReq;

    // Ours -> rdma-core's view.
    m::Cqe64 c;
    std::memset(&c, 0xEE, sizeof c);
    m::fillCqe(c, wc, qpn, bytes, err ? syn : 0, err ? vsyn : 0, err ? wop : 0);
    c.b[m::kCqeOpOwn] = m::makeOpOwn(opcode, owner);
    mlx5_cqe64 ref;
    std::memcpy(&ref, &c, sizeof ref);
    REQUIRE(mlx5dv_get_cqe_owner(&ref) == owner);
    REQUIRE(mlx5dv_get_cqe_opcode(&ref) == opcode);
    REQUIRE(be16toh(ref.wqe_counter) == wc);
    REQUIRE(be32toh(ref.byte_cnt) == bytes);
    REQUIRE((be32toh(ref.sop_drop_qpn) & 0xffffff) == qpn);
    if (err) {
      mlx5_err_cqe eref;
      std::memcpy(&eref, &c, sizeof eref);
      REQUIRE(eref.syndrome == syn);
      REQUIRE(eref.vendor_err_synd == vsyn);
      REQUIRE(be32toh(eref.s_wqe_opcode_qpn) >> 24 == wop);
    }

    // rdma-core's -> ours.
    mlx5_cqe64 r2;
    std::memset(&r2, 0, sizeof r2);
    r2.wqe_counter = htobe16(wc);
    r2.byte_cnt = htobe32(bytes);
    r2.sop_drop_qpn = htobe32((uint32_t(wop) << 24) | qpn);
    r2.op_own = uint8_t(opcode << 4);
    mlx5dv_set_cqe_owner(&r2, owner);
    m::Cqe64 c2;
    std::memcpy(&c2, &r2, sizeof c2);
    REQUIRE(m::cqeWqeCounter(c2) == wc);
    REQUIRE(m::cqeByteCount(c2) == bytes);
    REQUIRE(m::cqeQpn(c2) == qpn);
    REQUIRE(m::cqeErrWqeOpcode(c2) == wop);
    REQUIRE(m::cqeOwner(c2.b[m::kCqeOpOwn]) == owner);
    REQUIRE(m::cqeOpcode(c2.b[m::kCqeOpOwn]) == opcode);
    if (err) {
      mlx5_err_cqe e2;
      std::memcpy(&e2, &r2, sizeof e2);
      e2.syndrome = syn;
      e2.vendor_err_synd = vsyn;
      std::memcpy(&c2, &e2, sizeof c2);
      REQUIRE(m::cqeSyndrome(c2) == syn);
      REQUIRE(m::cqeVendorSyndrome(c2) == vsyn);
    }
  }
}

TEST_CASE("mlx5 prm: owner bit flips every pass over the CQ; init value is never valid", "[mlx5]") {
  for (uint32_t n : {1u, 2u, 64u, 4096u}) {
    for (uint64_t ci = 0; ci < 4ull * n; ++ci) REQUIRE(m::cqeExpectedOwner(ci, n) == ((ci / n) & 1));
  }
  REQUIRE(m::cqeOpcode(m::kCqeInitOpOwn) == MLX5_CQE_INVALID);
  REQUIRE(m::cqeOwner(m::kCqeInitOpOwn) == 1);
  REQUIRE(m::dsInline(8) == 3);
  REQUIRE(m::dsInline(m::kMaxInlineInOneBB) == 4);
  REQUIRE(m::bswap64(0x0102030405060708ull) == 0x0807060504030201ull);
}

// The whole WQEs the ibgda transport posts (gin/device/transport/ibgda.hpp),
// against the same WQEs assembled from rdma-core's helpers and structs.
#include "gin/device/transport/ibgda.hpp"

namespace {
struct RefWqe {
  uint8_t b[64];
};
RefWqe refCtrlOnly(uint8_t opcode, uint8_t ds, uint8_t fmCeSe) {
  RefWqe r;
  std::memset(&r, 0, sizeof r);
  auto* c = reinterpret_cast<mlx5_wqe_ctrl_seg*>(r.b);
  mlx5dv_set_ctrl_seg(c, 0, opcode, 0, 0, fmCeSe, ds, 0, 0);
  return r;
}
}  // namespace

TEST_CASE("mlx5 prm: the ibgda transport's WQEs equal rdma-core-built ones", "[mlx5][ibgda]") {
  std::mt19937_64 rng(4);
  for (int i = 0; i < kRounds / 10; ++i) {
    const uint64_t raddr = rng(), laddr = rng(), value = rng();
    const uint32_t rkey = uint32_t(rng()), lkey = uint32_t(rng()), len = uint32_t(rng());

    // RDMA WRITE: ctrl + raddr + data, CQE requested.
    gin::ibgda::Wqe q;
    gin::ibgda::makeWrite(q, raddr, rkey, laddr, lkey, len);
    RefWqe r = refCtrlOnly(MLX5_OPCODE_RDMA_WRITE, 3, MLX5_WQE_CTRL_CQ_UPDATE);
    auto* rs = reinterpret_cast<mlx5_wqe_raddr_seg*>(r.b + 16);
    rs->raddr = htobe64(raddr);
    rs->rkey = htobe32(rkey);
    mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(r.b + 32), len, lkey, uintptr_t(laddr));
    REQUIRE(std::memcmp(q.w, r.b, 64) == 0);

    // Atomic fetch-add: ctrl + raddr + atomic + data (the fetched value's home).
    gin::ibgda::makeFetchAdd(q, raddr, rkey, value, laddr, lkey);
    r = refCtrlOnly(MLX5_OPCODE_ATOMIC_FA, 4, MLX5_WQE_CTRL_CQ_UPDATE);
    rs = reinterpret_cast<mlx5_wqe_raddr_seg*>(r.b + 16);
    rs->raddr = htobe64(raddr);
    rs->rkey = htobe32(rkey);
    reinterpret_cast<mlx5_wqe_atomic_seg*>(r.b + 32)->swap_add = htobe64(value);
    mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(r.b + 48), 8, lkey, uintptr_t(laddr));
    REQUIRE(std::memcmp(q.w, r.b, 64) == 0);

    // Inline RDMA WRITE of 1..8 bytes (SignalSet: 8 bytes and the fence).
    const uint32_t n = 1 + uint32_t(rng() % 8);
    const uint8_t flags = (rng() & 1) ? MLX5_WQE_CTRL_FENCE : 0;
    gin::ibgda::makeWriteInline(q, raddr, rkey, &value, n, flags);
    r = refCtrlOnly(MLX5_OPCODE_RDMA_WRITE, uint8_t((16 + 16 + 4 + n + 15) / 16),
                    uint8_t(MLX5_WQE_CTRL_CQ_UPDATE | flags));
    rs = reinterpret_cast<mlx5_wqe_raddr_seg*>(r.b + 16);
    rs->raddr = htobe64(raddr);
    rs->rkey = htobe32(rkey);
    reinterpret_cast<mlx5_wqe_inl_data_seg*>(r.b + 32)->byte_count = htobe32(n | MLX5_INLINE_SEG);
    std::memcpy(r.b + 36, &value, n);
    REQUIRE(std::memcmp(q.w, r.b, 64) == 0);

    // NOP.
    gin::ibgda::makeNop(q);
    r = refCtrlOnly(MLX5_OPCODE_NOP, 1, MLX5_WQE_CTRL_CQ_UPDATE);
    REQUIRE(std::memcmp(q.w, r.b, 64) == 0);
  }
}

TEST_CASE("mlx5 prm: an inline WRITE longer than the WQE's room is refused; nothing is written past the slot",
          "[mlx5][ibgda]") {
  struct Guarded {
    gin::ibgda::Wqe q;
    uint8_t after[64];
  } g;
  static_assert(offsetof(Guarded, after) == sizeof(gin::ibgda::Wqe));
  uint8_t value[128];
  for (size_t i = 0; i < sizeof value; ++i) value[i] = uint8_t(0x80 | i);
  for (uint32_t n = 0; n <= 100; ++n) {
    CAPTURE(n);
    std::memset(&g, 0x5c, sizeof g);
    (void)gin::ibgda::makeWriteInline(g.q, 0x1000, 7, value, n, 0);
    for (uint8_t b : g.after) REQUIRE(b == 0x5c);
    if (n <= m::kMaxInlineInOneBB) {
      // What fits is built whole: the header says n bytes, ds covers them.
      m::CtrlSeg c;
      std::memcpy(&c, g.q.w, sizeof c);
      REQUIRE(m::ctrlDs(c) == m::dsInline(n));
      m::InlineSeg h;
      std::memcpy(&h, reinterpret_cast<const char*>(g.q.w) + 32, 4);
      REQUIRE(m::inlineBytes(h) == n);
      REQUIRE(std::memcmp(reinterpret_cast<const char*>(g.q.w) + 36, value, n) == 0);
    }
  }
}

TEST_CASE("mlx5 prm: makeWriteInline says whether it built the WQE; a refused one is left as it was", "[mlx5][ibgda]") {
  uint8_t value[64] = {};
  gin::ibgda::Wqe q;
  for (uint32_t n = 0; n <= 64; ++n) {
    CAPTURE(n);
    std::memset(&q, 0x5c, sizeof q);
    const bool built = gin::ibgda::makeWriteInline(q, 0x1000, 7, value, n, 0);
    REQUIRE(built == (n <= m::kMaxInlineInOneBB));
    if (!built)
      for (int i = 0; i < 64; ++i) REQUIRE(reinterpret_cast<const uint8_t*>(q.w)[i] == 0x5c);
  }
}

TEST_CASE("mlx5 prm: the CQE format (bits 3..2 of op_own) equals mlx5dv_get_cqe_format; 3 is compressed", "[mlx5]") {
  for (int v = 0; v < 256; ++v) {
    mlx5_cqe64 ref;
    std::memset(&ref, 0, sizeof ref);
    ref.op_own = uint8_t(v);
    REQUIRE(m::cqeFormat(uint8_t(v)) == mlx5dv_get_cqe_format(&ref));
    REQUIRE(m::cqeOpcode(uint8_t(v)) == mlx5dv_get_cqe_opcode(&ref));
    REQUIRE(m::cqeOwner(uint8_t(v)) == mlx5dv_get_cqe_owner(&ref));
  }
  REQUIRE(m::cqeFormat(m::kCqeInitOpOwn) != m::kCqeFormatCompressed);
  REQUIRE(m::cqeFormat(m::makeOpOwn(m::kCqeReq, 1)) == 0);
}
