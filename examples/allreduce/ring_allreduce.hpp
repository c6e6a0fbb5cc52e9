// examples/allreduce/ring_allreduce.hpp — the baseline ring AllReduce: an
// in-place ReduceScatter + AllGather around the ring, built on gin::p2p
// send/recv, one piece at a time, so it runs on CPU ranks and GPUs and over
// every transport p2p runs over. The pipelined CTRING version (puts straight
// into the next rank's temporary slots, several blocks, bidirectional
// AllGather, auto-tuning) is gin/device/allreduce.hpp; this one stays as a
// simple reference (allreduce --baseline).
//
// Data: `count` elements of T at dataWin + dataOffset on every rank, split
// into nRanks shards (shard s is [shardBegin(s), shardBegin(s + 1)), sizes
// differ by at most one element). ReduceScatter: n - 1 steps; at step s each
// rank sends shard (me - s) to the next rank and receives shard (me - s - 1)
// from the previous one into `tmp`, piece by piece, and reduces it into its
// data; afterwards rank me holds the full reduction of shard (me + 1). AllGather:
// n - 1 steps passing the reduced shards around, received straight into the
// data. Every shard is reduced once, in one order, so all ranks end with
// bitwise identical results.
#pragma once

#include "gin/device.hpp"

namespace ginex {

struct Sum {
  template <class T>
  GIN_HD T operator()(T a, T b) const {
    return a + b;
  }
};
struct Prod {
  template <class T>
  GIN_HD T operator()(T a, T b) const {
    return a * b;
  }
};
struct Min {
  template <class T>
  GIN_HD T operator()(T a, T b) const {
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  GIN_HD T operator()(T a, T b) const {
    return a < b ? b : a;
  }
};

// First element of shard s (0 <= s <= n) of `count` elements over n ranks.
GIN_HD inline size_t shardBegin(size_t count, int n, int s) {
  const size_t base = count / size_t(n), extra = count % size_t(n);
  return base * size_t(s) + (size_t(s) < extra ? size_t(s) : extra);
}

// In-place AllReduce of `count` elements of T at dataWin + dataOffset (this
// rank's data, a registered window) with `op`. `tmp` is local scratch of
// tmpElts >= 1 elements (the piece size of the ReduceScatter). Every rank
// calls it with the same count, and one coop per rank drives it. Returns false
// on every thread of the coop if a send or recv gave up (the error record says
// which).
template <class T, class Op, class Coop, unsigned Backends>
GIN_HD bool ringAllReduce(Coop coop, const gin::p2p::Endpoint<Backends>& ep, gin::Window dataWin, size_t dataOffset,
                          size_t count, T* tmp, size_t tmpElts, Op op) {
  const gin::DevComm& dc = ep.net().comm();
  const int n = dc.nRanks, me = dc.rank, next = (me + 1) % n, prev = (me + n - 1) % n;
  T* data = static_cast<T*>(gin::localPointer(dataWin, dataOffset));
  auto begin = [&](int s) { return shardBegin(count, n, ((s % n) + n) % n); };
  auto size = [&](int s) { return shardBegin(count, n, ((s % n) + n) % n + 1) - begin(s); };
  // Piece j of a shard of `len` elements: [off, off + cnt).
  auto piece = [&](size_t len, size_t j, size_t* off, size_t* cnt) {
    *off = j * tmpElts < len ? j * tmpElts : len;
    *cnt = len - *off < tmpElts ? len - *off : tmpElts;
  };
  bool ok = tmpElts >= 1;
  // ReduceScatter. The shard sent at step s > 0 is the one reduced at step
  // s - 1: the coop sync after the reduction orders it before the send.
  for (int s = 0; ok && s < n - 1; ++s) {
    const int sendShard = me - s, recvShard = me - s - 1;
    const size_t sLen = size(sendShard), rLen = size(recvShard);
    const size_t nPieces = ((sLen > rLen ? sLen : rLen) + tmpElts - 1) / tmpElts;
    for (size_t j = 0; ok && j < nPieces; ++j) {
      size_t sOff, sCnt, rOff, rCnt;
      piece(sLen, j, &sOff, &sCnt);
      piece(rLen, j, &rOff, &rCnt);
      ok = ep.sendRecv(coop, next, dataWin, dataOffset + (begin(sendShard) + sOff) * sizeof(T), sCnt * sizeof(T), prev,
                       tmp, rCnt * sizeof(T));
      T* dst = data + begin(recvShard) + rOff;
      for (size_t i = size_t(coop.rank()); ok && i < rCnt; i += size_t(coop.size())) dst[i] = op(dst[i], tmp[i]);
      coop.sync();  // tmp is free again and the reduced piece is complete
    }
  }
  // AllGather: rank me starts with shard me + 1 fully reduced.
  for (int s = 0; ok && s < n - 1; ++s) {
    const int sendShard = me + 1 - s, recvShard = me - s;
    ok = ep.sendRecv(coop, next, dataWin, dataOffset + begin(sendShard) * sizeof(T), size(sendShard) * sizeof(T), prev,
                     data + begin(recvShard), size(recvShard) * sizeof(T));
  }
  return coop.syncAll(ok);
}

}  // namespace ginex
