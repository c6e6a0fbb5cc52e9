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
// QP `q` reached RTS and has mlx5dv buffers: a soft NIC consumes its send queue.
inline void startNic(Qp* q) {
  Cq* c = q->scq;
  if (!q->sq || !c->buf) return badAttr("an mlx5 QP at RTS without mlx5dv_init_obj of its CQ");
  q->nic = std::make_unique<gin::SoftNic>();
  gin::SoftNic::Qp v;
  v.sq = reinterpret_cast<uint8_t*>(q->sq.get());
  v.nWqe = q->wqeCnt;
  v.dbrec = reinterpret_cast<const uint32_t*>(q->dbrec.get());
  v.uar = q->uar.get();
  v.cq = reinterpret_cast<gin::mlx5::Cqe64*>(c->buf.get());
  v.nCqe = c->cqeCnt;
  v.cqDbrec = reinterpret_cast<const uint32_t*>(c->dbrec.get());
  v.qpn = q->qp.qp_num;
  v.peer = 0;
  q->nic->addQp(v);
  for (auto& [k, m] : mrs) addRegions(q, m);
  q->nic->start();
  ctl.mlx5Qps++;
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
  return p;
}
int ibv_dealloc_pd(ibv_pd* p) {
  std::lock_guard<std::recursive_mutex> lk(mu);
  for (auto& [n, q] : qps)
    if (q->qp.pd == p) return badAttr("ibv_dealloc_pd with a QP still on it"), EBUSY;
  for (auto& [k, m] : mrs)
    if (m->mr.pd == p) return badAttr("ibv_dealloc_pd with an MR still on it"), EBUSY;
  pds.erase(p);
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
}
