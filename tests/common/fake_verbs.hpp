// tests/common/fake_verbs.hpp — an in-process stand-in for libibverbs, so the
// verbs wire's own logic (connection setup, send-queue accounting, unsignaled
// WRs and fences, completions, errors, the receiver thread) runs on CPU ranks
// as threads. It is a model of RC semantics, not of a NIC: WRs execute when
// posted, in order per QP; a SEND that finds no posted receive waits (RNR)
// and blocks the WRs behind it on its QP until the receiver posts one; a WR
// to a destroyed QP fails with "retry exceeded" and moves the QP to error.
// It says nothing about real hardware (PCIe ordering, MTU, timing).
//
// Include in exactly ONE translation unit of a test executable that does NOT
// link libibverbs: it defines the library's functions itself.
#pragma once

#include <infiniband/verbs.h>

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
};
inline Control ctl;

struct Cqe {
  ibv_wc wc;
  struct Qp* sender;  // send CQEs: the QP whose WRs this retires
  uint32_t retires;
};
struct Cq {
  ibv_cq cq{};
  std::deque<Cqe> q;
  int capacity = 0;
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
};
struct Mr {
  ibv_mr mr{};
  int access = 0;
};

inline std::recursive_mutex mu;
inline std::map<uint32_t, Qp*> qps;  // by qp_num
inline std::map<uint32_t, Mr*> mrs;  // by key
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
  auto* p = new ibv_pd{};
  p->context = c;
  return p;
}
int ibv_dealloc_pd(ibv_pd* p) { return delete p, 0; }
ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void*, ibv_comp_channel*, int) {
  auto* q = new Cq;
  q->cq.context = c;
  q->cq.cqe = cqe;
  q->capacity = cqe;
  return &q->cq;
}
int ibv_destroy_cq(ibv_cq* c) { return delete reinterpret_cast<Cq*>(c), 0; }
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
  q->qp.state = a->qp_state;
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
  return &m->mr;
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t, unsigned int access) {
  return (ibv_reg_mr)(pd, addr, length, int(access));
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) { return errno = EOPNOTSUPP, nullptr; }
int ibv_dereg_mr(ibv_mr* m) {
  std::lock_guard<std::recursive_mutex> lk(mu);
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
}
