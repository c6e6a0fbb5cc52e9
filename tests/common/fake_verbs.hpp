// tests/common/fake_verbs.hpp — an in-process stand-in for libibverbs, so the
// verbs wire's own logic (connection setup, send-queue accounting, unsignaled
// WRs and fences, completions, errors, the receiver thread) runs on CPU ranks
// as threads. It is a model of RC semantics, not of a NIC: WRs execute when
// posted, in order per QP; a SEND that finds no posted receive waits (RNR)
// and blocks the WRs behind it on its QP until the receiver posts one; a WR
// to a destroyed QP fails with "retry exceeded" and moves the QP to error.
// It says nothing about real hardware (PCIe ordering, MTU, timing).
//
// The mlx5dv entry points the ibgda transport's mlx5 NIC uses
// (gin/host/ibgda_mlx5.hpp) are modelled too: mlx5dv_init_obj hands out host
// buffers for a QP's send queue, doorbell record and UAR word and a CQ's
// entries and doorbell record, and once the QP is RTS a gin::SoftNic (one per
// QP) consumes that send queue as the "hardware": it reads WQEs, resolves
// lkeys against this context's MRs and rkeys against the destination's, and
// writes CQEs. The model checks the teardown order rdma-core enforces (a CQ
// outlives its QPs, a PD its QPs and MRs, a device its PDs).
//
// DEVX too (the placement that puts the queues in the rank's own memory):
// umem registration, UARs, the EQN, the PD number, address handles (the
// peer's MAC) and the firmware commands CREATE_CQ, CREATE_QP, RST2INIT,
// INIT2RTR and RTR2RTS. The model decodes every command bit by bit with
// offsets written here from the PRM (mlx5_ifc.h), separately from gin's
// own table (gin/host/mlx5_devx.hpp), checks each field gin must set (a
// wrong one is a bad attribute, and the test fails), and once a QP is RTS
// runs a soft NIC on the memory the commands named: the umem's bytes at the
// offsets the commands gave.
//
// Include in exactly ONE translation unit of a test executable that does NOT
// link libibverbs (or libmlx5): it defines the libraries' functions itself.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <memory>
#include <set>

#include "gin/host/soft_nic.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fakeverbs {

// What the test controls and observes.
struct Control {
  bool devicePresent = true;
  uint8_t linkLayer = IBV_LINK_LAYER_ETHERNET;
  uint32_t maxMsgBytes = 1u << 30;
  std::atomic<uint64_t> postedSends{0};  // WRs accepted by post_send
  std::atomic<uint64_t> overflows{0};    // a send queue or CQ overflow: a wire bug
  std::atomic<uint64_t> badAttrs{0};     // QP attributes that break the wire's rules
  std::atomic<uint64_t> rnrWaits{0};     // SENDs that found no receive posted
  std::atomic<bool> freezeSends{false};
  std::atomic<uint64_t> opened{
      0};  // ibv_open_device calls  // SENDs wait forever and no error comes back (a stuck peer)
  std::string lastBadAttr;
  // mlx5: whether the device is one (mlx5dv_is_supported), its atomic
  // capability, and geometry faults to inject.
  bool mlx5 = true;
  ibv_atomic_cap atomicCap = IBV_ATOMIC_HCA;
  uint32_t forceCqeSize = 0;             // nonzero: CQEs of this size whatever was asked
  uint32_t extraSqFactor = 1;            // the send queue gets this many times the WQEBBs asked for
  std::atomic<uint64_t> mlx5Qps{0};      // QPs that reached RTS with a soft NIC behind them
  std::atomic<uint64_t> devxQps{0};      // of them, QPs made by DEVX commands
  uint32_t devxFailOpcode = 0;           // nonzero: the DEVX command with this opcode fails (status 0x3, syndrome 0x5eed)
  std::atomic<uint64_t> nicExecuted{0};  // WQEs those soft NICs executed (counted when their QP goes)
};
inline Control ctl;

struct Cqe {
  ibv_wc wc;
  struct Qp* sender;  // send CQEs: the QP whose WRs this retires
  uint32_t retires;
};
struct Cq {
  union {
    ibv_cq cq;
    ibv_cq_ex cqx;  // mlx5dv_create_cq hands out the extended struct
  };
  std::deque<Cqe> q;
  int capacity = 0;
  // mlx5dv_init_obj view (mlx5dv_create_cq CQs)
  uint32_t cqeCnt = 0, cqeSize = 64;
  std::unique_ptr<uint64_t[]> buf, dbrec;
  Cq() { std::memset(&cqx, 0, sizeof cqx); }
};
struct Qp {
  ibv_qp qp{};
  Cq *scq = nullptr, *rcq = nullptr;
  uint32_t maxSend = 0, maxRecv = 0, dest = 0;
  uint32_t inflight = 0, sinceSignaled = 0;  // send-queue slots in use, as the wire must count them
  bool error = false;
  std::deque<ibv_recv_wr> rq;
  std::deque<std::pair<ibv_send_wr, std::vector<char>>> blocked;  // waiting behind an RNR'd SEND
  std::deque<ibv_sge> rqSge;
  // mlx5dv_init_obj view and the soft NIC behind it
  uint32_t wqeCnt = 0;
  std::unique_ptr<uint64_t[]> sq, dbrec, uar;
  std::unique_ptr<gin::SoftNic> nic;
  // DEVX QPs: the queues where the commands put them (not owned)
  struct DevxCq* dcq = nullptr;
  uint8_t* dsq = nullptr;
  uint32_t* ddbrec = nullptr;
  uint32_t uarPage = 0, wqUmem = 0, dbrUmem = 0;
  uint32_t rcvPsn = 0, sendPsn = 0;
};
struct DevxCq {
  ibv_context* ctx = nullptr;
  uint32_t cqn = 0, n = 0, uarPage = 0, umem = 0, dbrUmem = 0;
  gin::mlx5::Cqe64* buf = nullptr;
  uint32_t* dbrec = nullptr;
};
struct Umem {
  mlx5dv_devx_umem u{};  // first: what the caller holds
  ibv_context* ctx = nullptr;
  char* addr = nullptr;
  size_t size = 0;
};
struct Uar {
  mlx5dv_devx_uar u{};  // first
  ibv_context* ctx = nullptr;
  std::unique_ptr<uint64_t[]> page;
};
struct Mr {
  ibv_mr mr{};
  int access = 0;
};

inline std::recursive_mutex mu;
inline std::map<uint32_t, Qp*> qps;  // by qp_num
inline std::map<uint32_t, Mr*> mrs;  // by key
inline std::set<ibv_pd*> pds;
inline std::set<Cq*> cqs;
inline uint32_t nextQpn = 100, nextKey = 7;
inline std::map<uint32_t, Umem*> umems;  // by umem id
inline std::map<uint32_t, Uar*> uars;    // by page id
inline std::map<uint32_t, DevxCq*> devxCqs;  // by cqn
inline std::map<ibv_pd*, uint32_t> pdns;
inline uint32_t nextUmem = 40, nextUar = 9, nextCqn = 0x300, nextPdn = 3;
inline constexpr uint32_t kEqn = 5;
inline constexpr uint8_t kPeerMac[6] = {0x02, 0x00, 10, 1, 2, 3};  // what an AH to the fake v2 IPv4 GID resolves to

inline void badAttr(const std::string& what) {
  ctl.badAttrs++;
  ctl.lastBadAttr = what;
}
inline void push(Cq* cq, const Cqe& e) {
  if (int(cq->q.size()) >= cq->capacity) ctl.overflows++;
  cq->q.push_back(e);
}
inline Mr* region(uint32_t key, uint64_t addr, uint64_t len) {
  auto it = mrs.find(key);
  if (it == mrs.end()) return nullptr;
  const uint64_t b = uint64_t(uintptr_t(it->second->mr.addr));
  if (addr < b || len > it->second->mr.length || addr - b > it->second->mr.length - len) return nullptr;
  return it->second;
}

inline uint32_t roundUpPow2(uint32_t v) {
  uint32_t r = 1;
  while (r < v) r <<= 1;
  return r;
}
// The regions the soft NIC of QP `q` resolves: MRs of its own context
// (lkeys), and remote-writable MRs of its destination's context (rkeys,
// peer 0 in the soft NIC's terms). Caller holds mu.
inline void addRegions(Qp* q, Mr* m) {
  if (!q->nic) return;
  auto d = qps.find(q->dest);
  char* a = static_cast<char*>(m->mr.addr);
  if (m->mr.context == q->qp.context) q->nic->addLocalRegion(m->mr.lkey, uint64_t(uintptr_t(a)), m->mr.length, a);
  if (d != qps.end() && m->mr.context == d->second->qp.context && (m->access & IBV_ACCESS_REMOTE_WRITE))
    q->nic->addRemoteRegion(0, m->mr.rkey, uint64_t(uintptr_t(a)), m->mr.length, a);
}
// QP `q` reached RTS and has mlx5dv buffers (or DEVX queues): a soft NIC
// consumes its send queue.
inline void startNic(Qp* q) {
  gin::SoftNic::Qp v;
  if (q->dsq) {
    v.sq = q->dsq;
    v.nWqe = q->wqeCnt;
    v.dbrec = q->ddbrec;
    v.uar = uars.count(q->uarPage) ? reinterpret_cast<const uint64_t*>(uars[q->uarPage]->u.reg_addr) : nullptr;
    v.cq = q->dcq->buf;
    v.nCqe = q->dcq->n;
    v.cqDbrec = q->dcq->dbrec;
  } else {
    Cq* c = q->scq;
    if (!q->sq || !c->buf) return badAttr("an mlx5 QP at RTS without mlx5dv_init_obj of its CQ");
    v.sq = reinterpret_cast<uint8_t*>(q->sq.get());
    v.nWqe = q->wqeCnt;
    v.dbrec = reinterpret_cast<const uint32_t*>(q->dbrec.get());
    v.uar = q->uar.get();
    v.cq = reinterpret_cast<gin::mlx5::Cqe64*>(c->buf.get());
    v.nCqe = c->cqeCnt;
    v.cqDbrec = reinterpret_cast<const uint32_t*>(c->dbrec.get());
  }
  q->nic = std::make_unique<gin::SoftNic>();
  v.qpn = q->qp.qp_num;
  v.peer = 0;
  q->nic->addQp(v);
  for (auto& [k, m] : mrs) addRegions(q, m);
  q->nic->start();
  ctl.mlx5Qps++;
  if (q->dsq) ctl.devxQps++;
}

inline void completeSend(Qp* s, const ibv_send_wr& wr, ibv_wc_status st) {
  const bool signaled = wr.send_flags & IBV_SEND_SIGNALED;
  s->sinceSignaled++;
  if (!signaled && st == IBV_WC_SUCCESS) return;
  ibv_wc wc{};
  wc.wr_id = wr.wr_id;
  wc.status = st;
  wc.qp_num = s->qp.qp_num;
  wc.opcode = wr.opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
  push(s->scq, {wc, s, s->sinceSignaled});
  s->sinceSignaled = 0;
}

// Execute one WR of `s`; false when it must wait for a receive (RNR).
inline bool execute(Qp* s, const ibv_send_wr& wr, const std::vector<char>& data) {
  if (s->error) return completeSend(s, wr, IBV_WC_WR_FLUSH_ERR), true;
  auto dit = qps.find(s->dest);
  if (dit == qps.end() || dit->second->error) {  // the peer is gone: transport retries run out
    s->error = true;
    return completeSend(s, wr, IBV_WC_RETRY_EXC_ERR), true;
  }
  Qp* d = dit->second;
  const uint64_t len = data.size();
  if (wr.opcode == IBV_WR_RDMA_WRITE) {
    if (len) {
      Mr* m = region(wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, len);
      if (!m || !(m->access & IBV_ACCESS_REMOTE_WRITE)) {
        s->error = true;
        return completeSend(s, wr, IBV_WC_REM_ACCESS_ERR), true;
      }
      std::memcpy(reinterpret_cast<void*>(uintptr_t(wr.wr.rdma.remote_addr)), data.data(), len);
    }
    return completeSend(s, wr, IBV_WC_SUCCESS), true;
  }
  if (wr.opcode == IBV_WR_SEND_WITH_IMM) {
    if (ctl.freezeSends) return false;
    if (d->rq.empty()) return ctl.rnrWaits++, false;
    const ibv_recv_wr r = d->rq.front();
    const ibv_sge sge = d->rqSge.front();
    d->rq.pop_front(), d->rqSge.pop_front();
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.qp_num = d->qp.qp_num;
    wc.opcode = IBV_WC_RECV;
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = wr.imm_data;
    wc.byte_len = uint32_t(len);
    if (len > sge.length || !region(sge.lkey, sge.addr, len)) {
      wc.status = IBV_WC_LOC_LEN_ERR;
      push(d->rcq, {wc, nullptr, 0});
      s->error = true;
      return completeSend(s, wr, IBV_WC_REM_INV_REQ_ERR), true;
    }
    std::memcpy(reinterpret_cast<void*>(uintptr_t(sge.addr)), data.data(), len);
    wc.status = IBV_WC_SUCCESS;
    push(d->rcq, {wc, nullptr, 0});
    return completeSend(s, wr, IBV_WC_SUCCESS), true;
  }
  s->error = true;
  return completeSend(s, wr, IBV_WC_REM_INV_REQ_ERR), true;
}

inline void progress(Qp* s) {
  while (!s->blocked.empty() && execute(s, s->blocked.front().first, s->blocked.front().second)) s->blocked.pop_front();
}

inline int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  Qp* s = reinterpret_cast<Qp*>(qp);
  for (; wr; wr = wr->next) {
    if (s->qp.state != IBV_QPS_RTS && !s->error) return *bad = wr, EINVAL;
    if (s->inflight + 1 > s->maxSend) return ctl.overflows++, *bad = wr, ENOMEM;
    std::vector<char> data;
    for (int i = 0; i < wr->num_sge; ++i) {
      const ibv_sge& g = wr->sg_list[i];
      if (!(wr->send_flags & IBV_SEND_INLINE) && g.length && !region(g.lkey, g.addr, g.length))
        return *bad = wr, EINVAL;  // a real NIC fails the WR with a local protection error
      if ((wr->send_flags & IBV_SEND_INLINE) && g.length > 16) return *bad = wr, EINVAL;
      const char* p = reinterpret_cast<const char*>(uintptr_t(g.addr));
      data.insert(data.end(), p, p + g.length);
    }
    s->inflight++;
    ctl.postedSends++;
    s->blocked.emplace_back(*wr, std::move(data));
    s->blocked.back().first.next = nullptr;
  }
  progress(s);
  return 0;
}

inline int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  Qp* d = reinterpret_cast<Qp*>(qp);
  for (; wr; wr = wr->next) {
    if (d->rq.size() + 1 > d->maxRecv || wr->num_sge != 1) return ctl.overflows++, *bad = wr, ENOMEM;
    d->rq.push_back(*wr);
    d->rqSge.push_back(wr->sg_list[0]);
  }
  for (auto& [n, s] : qps)
    if (s->dest == d->qp.qp_num) progress(s);
  return 0;
}

inline int pollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  Cq* c = reinterpret_cast<Cq*>(cq);
  int got = 0;
  for (; got < n && !c->q.empty(); ++got) {
    const Cqe e = c->q.front();
    c->q.pop_front();
    wc[got] = e.wc;
    if (e.sender) e.sender->inflight -= std::min(e.sender->inflight, e.retires);
  }
  return got;
}

}  // namespace fakeverbs

extern "C" {
using namespace fakeverbs;

inline ibv_device fakeDevice{};

ibv_device** ibv_get_device_list(int* n) {
  if (!ctl.devicePresent) {
    if (n) *n = 0;
    errno = ENOSYS;
    return nullptr;
  }
  auto** l = new ibv_device* [2] { &fakeDevice, nullptr };
  if (n) *n = 1;
  return l;
}
void ibv_free_device_list(ibv_device** l) { delete[] l; }
const char* ibv_get_device_name(ibv_device*) { return "fake0"; }
ibv_context* ibv_open_device(ibv_device* dev) {
  ctl.opened++;
  auto* c = &(new verbs_context{})->context;  // the whole struct, though only `context` is used
  c->device = dev;
  c->abi_compat = nullptr;  // not extended: ibv_query_port goes to the function below
  c->ops.poll_cq = pollCq;
  c->ops.post_send = postSend;
  c->ops.post_recv = postRecv;
  return c;
}
int ibv_close_device(ibv_context* c) {
  {
    std::lock_guard<std::recursive_mutex> lk(mu);
    for (ibv_pd* p : pds)
      if (p->context == c) return badAttr("ibv_close_device with a PD still open"), EBUSY;
    for (Cq* q : cqs)
      if (q->cq.context == c) return badAttr("ibv_close_device with a CQ still open"), EBUSY;
    for (auto& [id, u] : umems)
      if (u->ctx == c) return badAttr("ibv_close_device with a DEVX umem still registered"), EBUSY;
    for (auto& [id, u] : uars)
      if (u->ctx == c) return badAttr("ibv_close_device with a DEVX UAR still allocated"), EBUSY;
    for (auto& [n, q] : devxCqs)
      if (q->ctx == c) return badAttr("ibv_close_device with a DEVX CQ still open"), EBUSY;
  }
  delete reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(c) - offsetof(verbs_context, context));
  return 0;
}
int ibv_query_device(ibv_context*, ibv_device_attr* a) {
  *a = ibv_device_attr{};
  a->phys_port_cnt = 1;
  a->max_qp_wr = 1024;
  a->max_cqe = 1 << 16;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->atomic_cap = ctl.atomicCap;
  return 0;
}
int(ibv_query_port)(ibv_context*, uint8_t port, _compat_ibv_port_attr* compat) {
  auto* a = reinterpret_cast<ibv_port_attr*>(compat);  // the inline wrapper passes a whole ibv_port_attr
  if (port != 1) return EINVAL;
  a->state = IBV_PORT_ACTIVE;
  a->active_mtu = IBV_MTU_4096;
  a->max_msg_sz = ctl.maxMsgBytes;
  a->gid_tbl_len = 4;
  a->link_layer = ctl.linkLayer;
  a->lid = ctl.linkLayer == IBV_LINK_LAYER_ETHERNET ? 0 : 17;
  return 0;
}
// An mlx5-like RoCE table: fe80 v1, fe80 v2, ::ffff:10.1.2.3 v1, ::ffff:10.1.2.3 v2.
int _ibv_query_gid_ex(ibv_context*, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t, size_t) {
  if (port != 1 || index >= 4) return ENODATA;
  *e = ibv_gid_entry{};
  e->gid_index = index;
  e->port_num = 1;
  e->gid_type = index % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
  if (index < 2)
    e->gid.raw[0] = 0xfe, e->gid.raw[1] = 0x80, e->gid.raw[15] = 1;
  else
    e->gid.raw[10] = e->gid.raw[11] = 0xff, e->gid.raw[12] = 10, e->gid.raw[13] = 1, e->gid.raw[14] = 2,
    e->gid.raw[15] = 3;
  return 0;
}
int ibv_query_gid(ibv_context* c, uint8_t port, int index, ibv_gid* gid) {
  ibv_gid_entry e;
  if (index < 0 || _ibv_query_gid_ex(c, port, uint32_t(index), &e, 0, sizeof e)) return -1;
  *gid = e.gid;
  return 0;
}
ibv_pd* ibv_alloc_pd(ibv_context* c) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  auto* p = new ibv_pd{};
  p->context = c;
  pds.insert(p);
  pdns[p] = nextPdn++;
  return p;
}
int ibv_dealloc_pd(ibv_pd* p) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  for (auto& [n, q] : qps)
    if (q->qp.pd == p) return badAttr("ibv_dealloc_pd with a QP still on it"), EBUSY;
  for (auto& [k, m] : mrs)
    if (m->mr.pd == p) return badAttr("ibv_dealloc_pd with an MR still on it"), EBUSY;
  pds.erase(p);
  pdns.erase(p);
  return delete p, 0;
}
ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void*, ibv_comp_channel*, int) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  auto* q = new Cq;
  q->cq.context = c;
  q->cq.cqe = cqe;
  q->capacity = cqe;
  cqs.insert(q);
  return &q->cq;
}
int ibv_destroy_cq(ibv_cq* c) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  Cq* q = reinterpret_cast<Cq*>(c);
  for (auto& [n, p] : qps)
    if (p->scq == q || p->rcq == q) return badAttr("ibv_destroy_cq while a QP still uses it"), EBUSY;
  cqs.erase(q);
  return delete q, 0;
}
ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* a) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (a->qp_type != IBV_QPT_RC || a->cap.max_inline_data > 64) return errno = EINVAL, nullptr;
  auto* q = new Qp;
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.qp_num = nextQpn++;
  q->qp.state = IBV_QPS_RESET;
  q->scq = reinterpret_cast<Cq*>(a->send_cq);
  q->rcq = reinterpret_cast<Cq*>(a->recv_cq);
  q->maxSend = a->cap.max_send_wr;
  q->maxRecv = a->cap.max_recv_wr;
  a->cap.max_inline_data = 64;
  qps[q->qp.qp_num] = q;
  return &q->qp;
}
int ibv_destroy_qp(ibv_qp* qp) {
  std::unique_ptr<gin::SoftNic> nic;
  {
    std::lock_guard<std::recursive_mutex> lk(mu);
    nic = std::move(reinterpret_cast<Qp*>(qp)->nic);
  }
  if (nic) nic->stop(), ctl.nicExecuted += nic->executed();
  nic.reset();  // drains what was rung, then stops (outside mu: its thread never takes mu, but be plain)
  std::lock_guard<std::recursive_mutex> lk(mu);
  qps.erase(qp->qp_num);
  delete reinterpret_cast<Qp*>(qp);
  return 0;
}
int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  Qp* q = reinterpret_cast<Qp*>(qp);
  const int need = a->qp_state == IBV_QPS_INIT  ? IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
                   : a->qp_state == IBV_QPS_RTR ? IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
                                                : IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  if ((mask & need) != need) badAttr("modify_qp mask for state " + std::to_string(a->qp_state));
  const int from = q->qp.state;
  if ((a->qp_state == IBV_QPS_INIT && from != IBV_QPS_RESET) || (a->qp_state == IBV_QPS_RTR && from != IBV_QPS_INIT) ||
      (a->qp_state == IBV_QPS_RTS && from != IBV_QPS_RTR))
    return badAttr("bad state transition"), EINVAL;
  if (a->qp_state == IBV_QPS_INIT && !(a->qp_access_flags & IBV_ACCESS_REMOTE_WRITE)) badAttr("no remote write");
  if (a->qp_state == IBV_QPS_RTR) {
    if (a->path_mtu != IBV_MTU_4096) badAttr("path mtu");
    const bool roce = ctl.linkLayer == IBV_LINK_LAYER_ETHERNET;
    if (roce && (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index != 3 || a->ah_attr.grh.dgid.raw[11] != 0xff))
      badAttr("RoCE address: GRH, sgid index 3 (the v2 IPv4 entry)");
    if (!roce && (a->ah_attr.is_global || a->ah_attr.dlid != 17)) badAttr("IB address: LID, no GRH");
    if (!qps.count(a->dest_qp_num)) badAttr("dest qpn");
    q->dest = a->dest_qp_num;
  }
  if (a->qp_state == IBV_QPS_RTS && (a->timeout != 14 || a->retry_cnt != 7 || a->rnr_retry != 7))
    badAttr("timeout/retry/rnr_retry");
  if (a->qp_state == IBV_QPS_INIT && q->sq &&
      (a->qp_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) !=
          (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC))
    badAttr("an mlx5 (ibgda) QP without remote write and remote atomic access");
  if (a->qp_state == IBV_QPS_RTR && q->sq && a->max_dest_rd_atomic < 1)
    badAttr("an mlx5 (ibgda) QP that takes no atomics (max_dest_rd_atomic 0)");
  q->qp.state = a->qp_state;
  if (a->qp_state == IBV_QPS_RTS && q->sq) startNic(q);
  return 0;
}
ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  auto* m = new Mr;
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = m->mr.rkey = nextKey++;
  m->access = access;
  mrs[m->mr.lkey] = m;
  for (auto& [n, q] : qps) addRegions(q, m);
  return &m->mr;
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t, unsigned int access) {
  return (ibv_reg_mr)(pd, addr, length, int(access));
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) { return errno = EOPNOTSUPP, nullptr; }
int ibv_dereg_mr(ibv_mr* m) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  for (auto& [n, q] : qps)
    if (q->nic) q->nic->removeLocalRegion(m->lkey), q->nic->removeRemoteRegion(0, m->rkey);
  mrs.erase(m->lkey);
  delete reinterpret_cast<Mr*>(m);
  return 0;
}
const char* ibv_wc_status_str(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    default: return "other error";
  }
}

// --- mlx5dv (the parts gin/host/ibgda_mlx5.hpp uses)
bool mlx5dv_is_supported(ibv_device*) { return ctl.mlx5; }
ibv_cq_ex* mlx5dv_create_cq(ibv_context* c, ibv_cq_init_attr_ex* a, mlx5dv_cq_init_attr* m) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (!a || a->cqe < 1) return errno = EINVAL, nullptr;
  auto* q = new Cq;
  q->cq.context = c;
  q->cqeCnt = roundUpPow2(a->cqe + 1);  // what libmlx5 does: room for cqe + 1, a power of two
  q->cq.cqe = int(q->cqeCnt - 1);
  q->capacity = int(q->cqeCnt);
  q->cqeSize = ctl.forceCqeSize                                          ? ctl.forceCqeSize
               : m && (m->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) ? m->cqe_size
                                                                         : 64;
  cqs.insert(q);
  return &q->cqx;
}
int mlx5dv_init_obj(mlx5dv_obj* obj, uint64_t type) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (type & MLX5DV_OBJ_PD) {
    if (!pdns.count(obj->pd.in)) return EINVAL;
    obj->pd.out->pdn = pdns[obj->pd.in];
  }
  if (type & MLX5DV_OBJ_AH) obj->ah.out->av = reinterpret_cast<mlx5_wqe_av*>(obj->ah.in + 1);  // see ibv_create_ah
  if (type & MLX5DV_OBJ_QP) {
    Qp* q = reinterpret_cast<Qp*>(obj->qp.in);
    if (!q->sq) {
      q->wqeCnt = roundUpPow2(q->maxSend) * ctl.extraSqFactor;
      q->sq.reset(new uint64_t[size_t(q->wqeCnt) * 8]());
      q->dbrec.reset(new uint64_t[8]());
      q->uar.reset(new uint64_t[512]());  // a 4 KiB "UAR page"
    }
    mlx5dv_qp& o = *obj->qp.out;
    o = mlx5dv_qp{};
    o.dbrec = reinterpret_cast<__be32*>(q->dbrec.get());
    o.sq.buf = q->sq.get();
    o.sq.wqe_cnt = q->wqeCnt;
    o.sq.stride = 64;
    o.bf.reg = q->uar.get();
    o.bf.size = 256;
  }
  if (type & MLX5DV_OBJ_CQ) {
    Cq* c = reinterpret_cast<Cq*>(obj->cq.in);
    if (!c->buf) {
      c->buf.reset(new uint64_t[size_t(c->cqeCnt) * c->cqeSize / 8]());
      c->dbrec.reset(new uint64_t[8]());
    }
    mlx5dv_cq& o = *obj->cq.out;
    o = mlx5dv_cq{};
    o.buf = c->buf.get();
    o.dbrec = reinterpret_cast<__be32*>(c->dbrec.get());
    o.cqe_cnt = c->cqeCnt;
    o.cqe_size = c->cqeSize;
  }
  return 0;
}

// An address handle, only to read the peer's MAC (mlx5dv_init_obj AH): the
// struct is followed by its mlx5_wqe_av.
ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* a) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (!a->is_global || a->grh.sgid_index != 3 || a->grh.dgid.raw[11] != 0xff || a->port_num != 1)
    return badAttr("ibv_create_ah: a RoCE address needs the GRH, sgid index 3 and port 1"), errno = EINVAL, nullptr;
  auto* mem = static_cast<char*>(::operator new(sizeof(ibv_ah) + sizeof(mlx5_wqe_av)));
  auto* ah = new (mem) ibv_ah{};
  ah->context = pd->context;
  ah->pd = pd;
  auto* av = new (mem + sizeof(ibv_ah)) mlx5_wqe_av{};
  std::memcpy(av->rmac, kPeerMac, 6);
  std::memcpy(av->rgid, a->grh.dgid.raw, 16);
  return ah;
}
int ibv_destroy_ah(ibv_ah* ah) {
  ::operator delete(ah);
  return 0;
}

// --- DEVX
}  // extern "C"
struct mlx5dv_devx_obj {
  ibv_context* ctx;
  fakeverbs::DevxCq* cq;  // one of the two
  fakeverbs::Qp* qp;
};
namespace fakeverbs {
// A field of a firmware command, read bit by bit (bit 0: the most
// significant bit of byte 0), independently of gin's DEVX_SET.
inline uint64_t fld(const void* in, uint32_t off, uint32_t bits) {
  const auto* b = static_cast<const uint8_t*>(in);
  uint64_t v = 0;
  for (uint32_t i = 0; i < bits; ++i) v = (v << 1) | ((b[(off + i) / 8] >> (7 - (off + i) % 8)) & 1u);
  return v;
}
inline void setFld(void* out, uint32_t off, uint32_t bits, uint64_t v) {
  auto* b = static_cast<uint8_t*>(out);
  for (uint32_t i = 0; i < bits; ++i) {
    const uint32_t at = off + i, bit = 7 - at % 8;
    const uint8_t x = uint8_t((v >> (bits - 1 - i)) & 1u);
    b[at / 8] = uint8_t((b[at / 8] & ~(1u << bit)) | (x << bit));
  }
}
// `want` or a bad attribute naming the command and the field.
inline bool expectFld(const void* in, const char* cmd, const char* name, uint32_t off, uint32_t bits, uint64_t want) {
  const uint64_t got = fld(in, off, bits);
  if (got == want) return true;
  badAttr(std::string(cmd) + ": " + name + " is " + std::to_string(got) + ", want " + std::to_string(want));
  return false;
}
// [umem at offset, + bytes) inside a umem of ctx: its address, or null (a bad attribute).
inline char* umemAt(ibv_context* ctx, const char* cmd, uint32_t id, uint64_t offset, uint64_t bytes, uint64_t align) {
  auto it = umems.find(id);
  if (it == umems.end() || it->second->ctx != ctx)
    return badAttr(std::string(cmd) + ": umem " + std::to_string(id) + " is not registered on this device"), nullptr;
  if (offset % align || offset > it->second->size || bytes > it->second->size - offset)
    return badAttr(std::string(cmd) + ": offset " + std::to_string(offset) + " (+" + std::to_string(bytes) +
                   " bytes) is misaligned or outside umem " + std::to_string(id)),
           nullptr;
  return it->second->addr + offset;
}
inline bool uarOf(ibv_context* ctx, const char* cmd, uint32_t page) {
  if (uars.count(page) && uars[page]->ctx == ctx) return true;
  return badAttr(std::string(cmd) + ": uar_page " + std::to_string(page) + " is no UAR of this device"), false;
}
inline uint32_t log2Floor(uint64_t v) {
  uint32_t l = 0;
  while ((uint64_t(1) << (l + 1)) <= v) ++l;
  return l;
}

inline mlx5dv_devx_obj* createCqCmd(ibv_context* ctx, const void* in, void* out) {
  const char* c = "CREATE_CQ";
  bool ok = expectFld(in, c, "cqe_sz (64-byte CQEs)", 0x88, 3, 0) && expectFld(in, c, "cc (a ring)", 0x8b, 1, 0) &&
            expectFld(in, c, "oi", 0x8e, 1, 0) && expectFld(in, c, "cq_timestamp_format", 0xde, 2, 1) &&
            expectFld(in, c, "c_eqn", 0x120, 32, kEqn) && expectFld(in, c, "log_page_size", 0x143, 5, 0) &&
            expectFld(in, c, "page_offset", 0xd4, 6, 0) && expectFld(in, c, "cq_umem_valid", 0x2e0, 1, 1) &&
            expectFld(in, c, "dbr_umem_valid", 0x86, 1, 1) && uarOf(ctx, c, uint32_t(fld(in, 0xe8, 24)));
  const uint32_t n = 1u << fld(in, 0xe3, 5);
  char* buf = ok ? umemAt(ctx, c, uint32_t(fld(in, 0x2c0, 32)), fld(in, 0x280, 64), uint64_t(n) * 64, 4096) : nullptr;
  char* dbr = buf ? umemAt(ctx, c, uint32_t(fld(in, 0xa0, 32)), fld(in, 0x240, 64), 8, 8) : nullptr;
  if (!dbr) return errno = EINVAL, nullptr;
  for (uint32_t i = 0; i < n; ++i)
    if (uint8_t(buf[i * 64 + 63]) != 0xf1)  // invalid opcode, owner 1: what software hands the NIC
      return badAttr("CREATE_CQ: CQE " + std::to_string(i) + " is not initialised (op_own " +
                     std::to_string(uint8_t(buf[i * 64 + 63])) + ", want 0xf1)"),
             errno = EINVAL, nullptr;
  if (fld(dbr, 0, 64) != 0) return badAttr("CREATE_CQ: the doorbell record is not zero"), errno = EINVAL, nullptr;
  auto* q = new DevxCq;
  q->ctx = ctx, q->cqn = nextCqn++, q->n = n, q->uarPage = uint32_t(fld(in, 0xe8, 24));
  q->umem = uint32_t(fld(in, 0x2c0, 32)), q->dbrUmem = uint32_t(fld(in, 0xa0, 32));
  q->buf = reinterpret_cast<gin::mlx5::Cqe64*>(buf);
  q->dbrec = reinterpret_cast<uint32_t*>(dbr);
  devxCqs[q->cqn] = q;
  setFld(out, 0x48, 24, q->cqn);
  return new mlx5dv_devx_obj{ctx, q, nullptr};
}

inline mlx5dv_devx_obj* createQpCmd(ibv_context* ctx, const void* in, void* out) {
  const char* c = "CREATE_QP";
  ibv_pd* pd = nullptr;
  for (auto& [p, n] : pdns)
    if (p->context == ctx && n == fld(in, 0xe8, 24)) pd = p;
  if (!pd) return badAttr("CREATE_QP: pd is no PD number of this device"), errno = EINVAL, nullptr;
  const uint32_t cqn = uint32_t(fld(in, 0x4a8, 24));
  bool ok = expectFld(in, c, "st (RC)", 0xc8, 8, 0) && expectFld(in, c, "pm_state (migrated)", 0xd3, 2, 3) &&
            expectFld(in, c, "rq_type (zero-length RQ)", 0x625, 3, 3) && expectFld(in, c, "log_rq_size", 0x109, 4, 0) &&
            expectFld(in, c, "no_sq", 0x110, 1, 0) && expectFld(in, c, "ts_format", 0x118, 2, 1) &&
            expectFld(in, c, "log_page_size", 0x163, 5, 0) && expectFld(in, c, "page_offset", 0x554, 6, 0) &&
            expectFld(in, c, "cqn_rcv (= cqn_snd)", 0x5a8, 24, cqn) && expectFld(in, c, "wq_umem_valid", 0x860, 1, 1) &&
            expectFld(in, c, "dbr_umem_valid", 0x743, 1, 1) && uarOf(ctx, c, uint32_t(fld(in, 0x128, 24)));
  if (ok && (!devxCqs.count(cqn) || devxCqs[cqn]->ctx != ctx))
    ok = false, badAttr("CREATE_QP: cqn_snd " + std::to_string(cqn) + " is no CQ of this device");
  const uint32_t nWqe = 1u << fld(in, 0x111, 4);
  char* sq = ok ? umemAt(ctx, c, uint32_t(fld(in, 0x840, 32)), fld(in, 0x800, 64), uint64_t(nWqe) * 64, 4096) : nullptr;
  char* dbr = sq ? umemAt(ctx, c, uint32_t(fld(in, 0x7e0, 32)), fld(in, 0x5c0, 64), 8, 8) : nullptr;
  if (!dbr) return errno = EINVAL, nullptr;
  DevxCq* cq = devxCqs[cqn];
  const char* cqb = reinterpret_cast<char*>(cq->buf);
  if (sq < cqb + size_t(cq->n) * 64 && cqb < sq + size_t(nWqe) * 64)
    return badAttr("CREATE_QP: the send queue overlaps its CQ"), errno = EINVAL, nullptr;
  auto* q = new Qp;
  q->qp.context = ctx;
  q->qp.pd = pd;
  q->qp.qp_num = nextQpn++;
  q->qp.state = IBV_QPS_RESET;
  q->maxSend = q->wqeCnt = nWqe;
  q->dcq = cq;
  q->dsq = reinterpret_cast<uint8_t*>(sq);
  q->ddbrec = reinterpret_cast<uint32_t*>(dbr);
  q->uarPage = uint32_t(fld(in, 0x128, 24));
  q->wqUmem = uint32_t(fld(in, 0x840, 32)), q->dbrUmem = uint32_t(fld(in, 0x7e0, 32));
  qps[q->qp.qp_num] = q;
  setFld(out, 0x48, 24, q->qp.qp_num);
  return new mlx5dv_devx_obj{ctx, nullptr, q};
}

// The address path of INIT2RTR: RoCE (the GRH to the fake v2 IPv4 GID, the
// MAC an address handle resolved) or InfiniBand (LID 17, no GRH).
inline void checkPath(const void* in) {
  const char* c = "INIT2RTR";
  expectFld(in, c, "vhca_port_num", 0x2a8, 8, 1);
  if (ctl.linkLayer == IBV_LINK_LAYER_ETHERNET) {
    expectFld(in, c, "grh", 0x1a8, 1, 1);
    expectFld(in, c, "src_addr_index (the v2 IPv4 GID)", 0x1c8, 8, 3);
    expectFld(in, c, "hop_limit", 0x1d8, 8, 64);
    const auto* b = static_cast<const uint8_t*>(in);
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 1, 2, 3};
    if (std::memcmp(b + 0x40, gid, 16)) badAttr("INIT2RTR: rgid_rip is not the peer's GID");
    if (std::memcmp(b + 0x56, kPeerMac, 6)) badAttr("INIT2RTR: rmac is not the MAC the address handle resolved");
    if (fld(in, 0x290, 16) < 0xc000) badAttr("INIT2RTR: udp_sport outside the RoCE v2 range 0xc000..0xffff");
  } else {
    expectFld(in, c, "grh", 0x1a8, 1, 0);
    expectFld(in, c, "rlid", 0x1b0, 16, 17);
  }
}

inline int modifyQpCmd(mlx5dv_devx_obj* o, const void* in) {
  Qp* q = o->qp;
  if (!q) return badAttr("a QP command on a DEVX object that is no QP"), EINVAL;
  const uint32_t op = uint32_t(fld(in, 0, 16));
  if (fld(in, 0x48, 24) != q->qp.qp_num) return badAttr("modify QP: qpn is not the object's"), EINVAL;
  const int from = q->qp.state;
  if (op == 0x502) {  // RST2INIT
    if (from != IBV_QPS_RESET) return badAttr("RST2INIT from a state other than RESET"), EINVAL;
    const char* c = "RST2INIT";
    expectFld(in, c, "pm_state", 0xd3, 2, 3);
    expectFld(in, c, "vhca_port_num", 0x2a8, 8, 1);
    expectFld(in, c, "pkey_index", 0x190, 16, 0);
    expectFld(in, c, "rre", 0x550, 1, 1);
    expectFld(in, c, "rwe", 0x551, 1, 1);
    expectFld(in, c, "rae", 0x552, 1, 1);
    expectFld(in, c, "atomic_mode (up to 8 bytes)", 0x54c, 4, 3);
    q->qp.state = IBV_QPS_INIT;
    return 0;
  }
  if (op == 0x503) {  // INIT2RTR
    if (from != IBV_QPS_INIT) return badAttr("INIT2RTR from a state other than INIT"), EINVAL;
    const char* c = "INIT2RTR";
    expectFld(in, c, "mtu (4096)", 0x100, 3, 5);
    expectFld(in, c, "log_msg_max", 0x103, 5, log2Floor(ctl.maxMsgBytes));
    expectFld(in, c, "log_rra_max", 0x548, 3, 4);
    expectFld(in, c, "min_rnr_nak", 0x563, 5, 12);
    checkPath(in);
    const uint32_t dest = uint32_t(fld(in, 0x168, 24));
    if (!qps.count(dest)) badAttr("INIT2RTR: remote_qpn " + std::to_string(dest) + " is no QP");
    q->dest = dest;
    q->rcvPsn = uint32_t(fld(in, 0x568, 24));
    if (qps.count(dest) && qps[dest]->qp.state == IBV_QPS_RTS && qps[dest]->sendPsn != q->rcvPsn)
      badAttr("INIT2RTR: next_rcv_psn is not the peer's next_send_psn");
    q->qp.state = IBV_QPS_RTR;
    return 0;
  }
  if (op == 0x504) {  // RTR2RTS
    if (from != IBV_QPS_RTR) return badAttr("RTR2RTS from a state other than RTR"), EINVAL;
    const char* c = "RTR2RTS";
    expectFld(in, c, "log_sra_max", 0x448, 3, 4);
    expectFld(in, c, "retry_count", 0x44d, 3, 7);
    expectFld(in, c, "rnr_retry", 0x450, 3, 7);
    expectFld(in, c, "ack_timeout", 0x1c0, 5, 14);
    q->sendPsn = uint32_t(fld(in, 0x488, 24));
    auto d = qps.find(q->dest);
    if (d != qps.end() && d->second->qp.state >= IBV_QPS_RTR && d->second->dest == q->qp.qp_num &&
        d->second->rcvPsn != q->sendPsn)
      badAttr("RTR2RTS: next_send_psn is not the peer's next_rcv_psn");
    q->qp.state = IBV_QPS_RTS;
    startNic(q);
    return 0;
  }
  return badAttr("modify QP: opcode " + std::to_string(op)), EINVAL;
}
}  // namespace fakeverbs
extern "C" {

mlx5dv_devx_obj* mlx5dv_devx_obj_create(ibv_context* ctx, const void* in, size_t inlen, void* out, size_t outlen) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  std::memset(out, 0, outlen);
  if (inlen < 0x880 / 8 || outlen < 16)
    return badAttr("DEVX create: command buffers too short"), errno = EINVAL, nullptr;
  const uint32_t op = uint32_t(fld(in, 0, 16));
  if (ctl.devxFailOpcode == op) {
    setFld(out, 0, 8, 0x3);
    setFld(out, 0x20, 32, 0x5eed);
    return errno = EREMOTEIO, nullptr;
  }
  if (op == 0x400) return createCqCmd(ctx, in, out);
  if (op == 0x500) return createQpCmd(ctx, in, out);
  return badAttr("DEVX create: opcode " + std::to_string(op)), errno = EINVAL, nullptr;
}
int mlx5dv_devx_obj_modify(mlx5dv_devx_obj* o, const void* in, size_t inlen, void* out, size_t outlen) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  std::memset(out, 0, outlen);
  if (inlen < 0x880 / 8 || outlen < 16) return badAttr("DEVX modify: command buffers too short"), EINVAL;
  if (ctl.devxFailOpcode == fld(in, 0, 16)) {
    setFld(out, 0, 8, 0x3);
    setFld(out, 0x20, 32, 0x5eed);
    return errno = EREMOTEIO, EREMOTEIO;
  }
  const int e = modifyQpCmd(o, in);
  return e ? (errno = e, e) : 0;
}
int mlx5dv_devx_obj_destroy(mlx5dv_devx_obj* o) {
  if (o->qp) {
    std::unique_ptr<gin::SoftNic> nic;
    {
      std::lock_guard<std::recursive_mutex> lk(mu);
      nic = std::move(o->qp->nic);
    }
    if (nic) nic->stop(), ctl.nicExecuted += nic->executed();
    nic.reset();
    std::lock_guard<std::recursive_mutex> lk(mu);
    qps.erase(o->qp->qp.qp_num);
    delete o->qp;
  } else {
    std::lock_guard<std::recursive_mutex> lk(mu);
    for (auto& [n, q] : qps)
      if (q->dcq == o->cq) return badAttr("DEVX CQ destroyed while a QP still uses it"), EBUSY;
    devxCqs.erase(o->cq->cqn);
    delete o->cq;
  }
  delete o;
  return 0;
}
mlx5dv_devx_umem* mlx5dv_devx_umem_reg(ibv_context* ctx, void* addr, size_t size, uint32_t access) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (!(access & IBV_ACCESS_LOCAL_WRITE)) badAttr("umem without local write: the NIC writes CQEs there");
  if (uintptr_t(addr) % 4096) badAttr("umem not on a 4 KiB boundary");
  auto* u = new Umem;
  u->u.umem_id = nextUmem++;
  u->ctx = ctx, u->addr = static_cast<char*>(addr), u->size = size;
  umems[u->u.umem_id] = u;
  return &u->u;
}
mlx5dv_devx_umem* mlx5dv_devx_umem_reg_ex(ibv_context* ctx, mlx5dv_devx_umem_in* in) {
  if (in->comp_mask & MLX5DV_UMEM_MASK_DMABUF) return errno = EOPNOTSUPP, nullptr;  // no dma-buf here
  return mlx5dv_devx_umem_reg(ctx, in->addr, in->size, in->access);
}
int mlx5dv_devx_umem_dereg(mlx5dv_devx_umem* um) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  const uint32_t id = um->umem_id;
  for (auto& [n, q] : qps)
    if (q->dsq && (q->wqUmem == id || q->dbrUmem == id)) return badAttr("umem deregistered under a live QP"), EBUSY;
  for (auto& [n, c] : devxCqs)
    if (c->umem == id || c->dbrUmem == id) return badAttr("umem deregistered under a live CQ"), EBUSY;
  delete umems[id];
  umems.erase(id);
  return 0;
}
mlx5dv_devx_uar* mlx5dv_devx_alloc_uar(ibv_context* ctx, uint32_t flags) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  if (flags != MLX5DV_UAR_ALLOC_TYPE_NC)
    badAttr("a UAR for GPU doorbells must be non-cached (MLX5DV_UAR_ALLOC_TYPE_NC)");
  auto* u = new Uar;
  u->ctx = ctx;
  u->page.reset(new uint64_t[512]());
  u->u.base_addr = u->page.get();
  u->u.reg_addr = reinterpret_cast<char*>(u->page.get()) + 0x800;  // the doorbell register
  u->u.page_id = nextUar++;
  uars[u->u.page_id] = u;
  return &u->u;
}
void mlx5dv_devx_free_uar(mlx5dv_devx_uar* u) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  const uint32_t page = u->page_id;  // u lives inside the Uar deleted below
  for (auto& [n, q] : qps)
    if (q->dsq && q->uarPage == page) return badAttr("UAR freed under a live QP");
  for (auto& [n, c] : devxCqs)
    if (c->uarPage == page) return badAttr("UAR freed under a live CQ");
  delete uars[page];
  uars.erase(page);
}
int mlx5dv_devx_query_eqn(ibv_context*, uint32_t vector, uint32_t* eqn) {
  if (vector != 0) return EINVAL;
  *eqn = kEqn;
  return 0;
}
}
