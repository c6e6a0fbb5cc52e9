// gin/device/p2p.hpp — send/recv over a step FIFO (NCCL's P2P design), built
// only on the public Net API, so it runs over every transport Net reaches.
// Design (the connector, its data and credit signals): docs/design/p2p-ll.md.
//
//   gin::p2p::Endpoint ep(gin::Net(devComm, ctx), fifo);      // fifo: gin::p2p::create(comm) on the host
//   ep.send(gin::CoopBlock{}, peer, srcWin, srcOffset, bytes);  // one block
//   ep.recv(gin::CoopBlock{}, peer, dstPtr, bytes);             // another block (or another rank)
//
// Contract:
//  - Messages between one sender and one receiver on one channel arrive in the
//    order sent; send(bytes) must be matched by recv(bytes) of the same size.
//  - send returns once the source may be reused (it ends with net.flush); the
//    data may still be in the ring. recv returns once dst holds the message
//    (visible to every thread of the coop).
//  - Only one coop at a time may send on a given (channel, peer), and one may
//    receive on a given (channel, peer). Use channels for concurrency.
//  - The source must be in a registered window; the destination is any pointer
//    the calling agent can write.
//  - Messages of 1 to fifo.llMaxBytes to an lsa peer (no network transport
//    forced) go as one LL16 step: the sender stores flagged packets into the
//    receiver's LL slot, which the receiver polls (no fence, no signal to wait
//    for); larger ones, and every message over the proxy or ibgda, go through
//    the FIFO slots. Both sides decide from the size and the communicator
//    (not from Net's Backends), so they agree when the sizes match. LL steps
//    take slots in their own ring of nSlots, so up to nSlots messages may be
//    in flight either way.
//  - Waits are bounded: p2pSend (waiting for a free slot) or p2pRecv (waiting
//    for data), with the peer's world rank, in the error record. Every call
//    returns false on every thread of the coop if something failed.
#pragma once

#include "gin/device/ll.hpp"
#include "gin/device/net.hpp"

namespace gin::p2p {

// The FIFOs of one communicator as a kernel sees them. Trivially copyable:
// pass it to kernels by value. Built by gin::p2p::create (gin/host/p2p.hpp).
struct Fifo {
  Window window;        // per rank: [nChannels][nRanks senders][nSlots] slots of chunkBytes
  uint64_t chunkBytes;  // slot size, a multiple of 16
  uint32_t nSlots;      // ring depth per connector
  uint32_t nChannels;   // independent connector sets
  uint32_t signalBase;  // ids [signalBase, signalBase + 2 * nChannels * nRanks) are p2p's
  int32_t nRanks;
  uint64_t llMaxBytes;  // messages of 1 .. llMaxBytes to lsa peers take one LL16 step (0: none)
  uint64_t llOffset;    // where the LL slots start: [nChannels][llRanks lsa senders][nSlots] slots
  int32_t llRanks;      // lsa team size when LL steps are on (the LL area is per lsa sender)
};
static_assert(std::is_trivially_copyable_v<Fifo>);

// Signal ids: data from `from` on `channel` (here, at the receiver), and
// credit from `to` on `channel` (here, at the sender). The same formula on
// every rank, so each side knows the other's ids.
GIN_HD GIN_INLINE uint32_t dataSignal(const Fifo& f, int channel, int from) {
  return f.signalBase + 2u * (uint32_t(channel) * uint32_t(f.nRanks) + uint32_t(from));
}
GIN_HD GIN_INLINE uint32_t creditSignal(const Fifo& f, int channel, int to) {
  return f.signalBase + 2u * (uint32_t(channel) * uint32_t(f.nRanks) + uint32_t(to)) + 1u;
}
// Offset, in every rank's FIFO window, of the ring that holds `from`'s data on `channel`.
GIN_HD GIN_INLINE size_t ringOffset(const Fifo& f, int channel, int from) {
  return (size_t(channel) * size_t(f.nRanks) + size_t(from)) * size_t(f.nSlots) * f.chunkBytes;
}
// The LL area: bytes of one slot (llMaxBytes as LL16 packets), and where the
// LL ring of the lsa member with lsa index `fromLsa` starts on `channel`
// (step k in its slot k % nSlots).
GIN_HD GIN_INLINE size_t llSlotBytes(const Fifo& f) { return ll::bufferBytes<ll::Packet16>(f.llMaxBytes); }
GIN_HD GIN_INLINE size_t llRingOffset(const Fifo& f, int channel, int fromLsa) {
  return size_t(f.llOffset) +
         (size_t(channel) * size_t(f.llRanks) + size_t(fromLsa)) * size_t(f.nSlots) * llSlotBytes(f);
}
// The flag of LL step k: bit 31 set (never 0, the zeroed slots' value) and
// k's low 31 bits, so it repeats only every 2^31 steps, also across the
// 2^64 wrap of the step counts (2^31 divides 2^64).
GIN_HD GIN_INLINE uint32_t llStepFlag(uint64_t step) { return 0x80000000u | uint32_t(step & 0x7fffffffu); }

// Steps (slots) a message of `bytes` takes.
GIN_HD GIN_INLINE uint64_t stepCount(const Fifo& f, size_t bytes) { return (bytes + f.chunkBytes - 1) / f.chunkBytes; }

template <unsigned Backends = kBackendAll>
class Endpoint {
 public:
  // Peers are world ranks. `channel` selects one of the FIFO's connector sets.
  GIN_HD Endpoint(const Net<Backends>& net, const Fifo& fifo, int channel = 0)
      : net_(net), f_(fifo), channel_(channel) {}

  // Send `bytes` from srcWin + srcOffset (this rank) to `peer`. Returns once
  // the source may be reused.
  template <class Coop>
  GIN_HD bool send(Coop coop, int peer, Window srcWin, size_t srcOffset, size_t bytes) const {
    if (!checkArgs(peer) || !checkSource(srcWin, srcOffset, bytes)) return coop.syncAll(false);
    Sender s = openSender(peer);
    bool ok = true;
    if (llTo(peer, bytes)) {
      ok = sendLL(coop, s, srcWin, srcOffset, bytes);
    } else {
      for (uint64_t k = 0, n = stepCount(f_, bytes); ok && k < n; ++k)
        ok = sendStep(coop, s, srcWin, srcOffset, bytes, k);
      ok = net_.flush(coop) && ok;
    }
    closeSender(coop, s);
    return coop.syncAll(ok);
  }
  template <class T, class Coop>
  GIN_HD bool send(Coop coop, int peer, SymPtr<T> src, size_t nElts) const {
    return send(coop, peer, src.window, size_t(src.offset), nElts * sizeof(T));
  }

  // Receive `bytes` from `peer` into dst.
  template <class Coop>
  GIN_HD bool recv(Coop coop, int peer, void* dst, size_t bytes) const {
    if (!checkArgs(peer)) return coop.syncAll(false);
    Receiver r = openReceiver(peer);
    bool ok = true;
    if (llTo(peer, bytes))
      ok = recvLL(coop, r, dst, bytes);
    else
      for (uint64_t k = 0, n = stepCount(f_, bytes); ok && k < n; ++k) ok = recvStep(coop, r, dst, bytes, k);
    closeReceiver(coop, r);
    return coop.syncAll(ok);
  }
  template <class T, class Coop>
  GIN_HD bool recv(Coop coop, int peer, T* dst, size_t nElts) const {
    return recv(coop, peer, static_cast<void*>(dst), nElts * sizeof(T));
  }

  // Send to sendPeer and receive from recvPeer in one call, interleaving the
  // steps (send step k, then receive step k). A coop (or a single-threaded CPU
  // rank) can then exchange messages of any size around a ring, pairwise, or
  // with itself without deadlock: step k's send only needs the receiver to
  // have finished step k - nSlots, which it did in an earlier iteration.
  template <class Coop>
  GIN_HD bool sendRecv(Coop coop, int sendPeer, Window srcWin, size_t srcOffset, size_t sendBytes, int recvPeer,
                       void* dst, size_t recvBytes) const {
    if (!checkArgs(sendPeer) || !checkArgs(recvPeer) || !checkSource(srcWin, srcOffset, sendBytes))
      return coop.syncAll(false);
    Sender s = openSender(sendPeer);
    Receiver r = openReceiver(recvPeer);
    // An LL message is one step (the packets first, so a ring of ranks all
    // sending before they receive cannot wait on itself).
    const bool llS = llTo(sendPeer, sendBytes), llR = llTo(recvPeer, recvBytes);
    const uint64_t nS = llS ? 0 : stepCount(f_, sendBytes), nR = llR ? 0 : stepCount(f_, recvBytes);
    bool ok = true;
    if (llS) ok = sendLL(coop, s, srcWin, srcOffset, sendBytes);
    if (ok && llR) ok = recvLL(coop, r, dst, recvBytes);
    for (uint64_t k = 0; ok && (k < nS || k < nR); ++k) {
      if (k < nS) ok = sendStep(coop, s, srcWin, srcOffset, sendBytes, k);
      if (ok && k < nR) ok = recvStep(coop, r, dst, recvBytes, k);
    }
    if (nS > 0) ok = net_.flush(coop) && ok;
    closeSender(coop, s);
    closeReceiver(coop, r);
    return coop.syncAll(ok);
  }

  GIN_HD const Net<Backends>& net() const { return net_; }
  GIN_HD const Fifo& fifo() const { return f_; }
  GIN_HD int channel() const { return channel_; }

 private:
  Net<Backends> net_;
  Fifo f_;
  int channel_;

  struct Sender {
    int peer;
    uint32_t credit;      // here: steps `peer` has released
    uint32_t dataAtPeer;  // at peer: steps we have put
    size_t ring;          // our ring in peer's window
    uint64_t step;        // next step to put (from the credit signal's shadow)
    uint64_t creditSeen;  // rank 0 of the coop: last credit value acquired
  };
  struct Receiver {
    int peer;
    uint32_t data;          // here: steps `peer` has put
    uint32_t creditAtPeer;  // at peer: steps we have released
    size_t ring;            // peer's ring in our window
    uint64_t step;          // next step to read (from the data signal's shadow)
    uint64_t dataSeen;      // rank 0 of the coop: last data value acquired
  };

  GIN_HD bool checkArgs(int peer) const {
    const DevComm& c = net_.comm();
    if (peer >= 0 && peer < c.nRanks && f_.nRanks == c.nRanks && channel_ >= 0 && uint32_t(channel_) < f_.nChannels &&
        f_.window)
      return true;
    recordError(c, Op::BadArgument, peer, net_.context(), uint64_t(channel_), uint64_t(peer), uint64_t(c.nRanks));
    return false;
  }
  GIN_HD bool checkSource(Window w, size_t offset, size_t bytes) const {
    const uint64_t size = w.dev ? loadConst(&w.dev->bytes) : 0;
    if (bytes == 0 || (w.dev && offset <= size && bytes <= size - offset)) return true;
    recordError(net_.comm(), Op::BadArgument, -1, net_.context(), w.dev ? loadConst(&w.dev->id) : ~uint64_t(0),
                uint64_t(offset + bytes), size);
    return false;
  }

  // Every thread reads the step count; closeX stores it back.
  GIN_HD Sender openSender(int peer) const {
    const int me = net_.comm().rank;
    const uint32_t credit = creditSignal(f_, channel_, peer);
    const uint64_t step = volatileLoad(net_.getSignalShadowPtr(credit));
    return Sender{peer, credit, dataSignal(f_, channel_, me), ringOffset(f_, channel_, me), step, step - f_.nSlots};
  }
  GIN_HD Receiver openReceiver(int peer) const {
    const int me = net_.comm().rank;
    const uint32_t data = dataSignal(f_, channel_, peer);
    const uint64_t step = volatileLoad(net_.getSignalShadowPtr(data));
    return Receiver{peer, data, creditSignal(f_, channel_, me), ringOffset(f_, channel_, peer), step, step};
  }
  // Every thread has read the old count (at open, before the first sync);
  // one thread stores the new one; the sync makes it the coop's next start.
  template <class Coop>
  GIN_HD void closeSender(Coop coop, const Sender& s) const {
    coop.sync();
    if (coop.rank() == 0) volatileStore(net_.getSignalShadowPtr(s.credit), s.step);
    coop.sync();
  }
  template <class Coop>
  GIN_HD void closeReceiver(Coop coop, const Receiver& r) const {
    coop.sync();
    if (coop.rank() == 0) volatileStore(net_.getSignalShadowPtr(r.data), r.step);
    coop.sync();
  }

  // Rank 0 of the coop waits until signal `id` reaches `least` (rolling),
  // polling relaxed and acquiring once when it does (the acquire covers every
  // release up to the value seen, so later steps that need no more than *seen
  // skip the poll). Bounded like Net's waits, with `op` and the peer named.
  GIN_HD bool waitAtLeast(uint32_t id, uint64_t least, uint64_t* seen, Op op, int peer) const {
    if (rollingLessEqual(least, *seen)) return true;
    const bool ok = gin::detail::boundedPoll(
        net_.comm(), [&] { return net_.readSignal(id, 64, MemoryOrder::Relaxed); },
        [&](uint64_t v) { return rollingLessEqual(least, v); },
        gin::detail::WaitWhat{op, peer, net_.context(), id, least});
    if (ok) *seen = net_.readSignal(id, 64, MemoryOrder::Acquire);
    return ok;
  }

  // Whether a message of `bytes` to or from `peer` goes as one LL step: the
  // same answer on both sides (the size is the same, lsa reach is mutual and
  // create() leaves llMaxBytes 0 where a network transport is forced). The
  // packets go by load/store whatever Backends this Net compiled in.
  GIN_HD bool llTo(int peer, size_t bytes) const {
    return bytes > 0 && bytes <= f_.llMaxBytes && lsaIndexOf(net_.comm(), peer) >= 0;
  }

  // An LL message: one step, in LL slot s.step % nSlots, flagged with the
  // step (the slot last held step s.step - nSlots or earlier). The slot is
  // free once the receiver released step s.step - nSlots, the FIFO's rule
  // (its release after reading pairs with this acquire). The data signal
  // still counts the step (relaxed: the packets carry their own flags), so
  // both sides' step counts stay those of the FIFO.
  template <class Coop>
  GIN_HD bool sendLL(Coop coop, Sender& s, Window srcWin, size_t srcOffset, size_t bytes) const {
    bool ok = true;
    if (coop.rank() == 0) ok = waitAtLeast(s.credit, s.step + 1 - f_.nSlots, &s.creditSeen, Op::P2pSend, s.peer);
    if (!coop.syncAll(ok)) return false;
    const DevComm& c = net_.comm();
    const Team world = teamWorld(c);
    const size_t off = llRingOffset(f_, channel_, c.lsaRank) + size_t(s.step % f_.nSlots) * llSlotBytes(f_);
    if (!ll::putPacketsToPeer<ll::Packet16>(coop, c, world, s.peer, f_.window, off, localPointer(srcWin, srcOffset),
                                            bytes, llStepFlag(s.step)))
      return coop.syncAll(false);
    net_.signal(world, s.peer, SignalAdd{s.dataAtPeer, 1}, coop, Scope::System);
    ++s.step;
    return true;
  }

  // Poll the packets of step r.step (bounded, a timeout named p2pRecv with
  // the sender), copy them to dst, then release the slot as recvStep does.
  // (Releasing before writing dst, with the packets held in registers, was
  // 0.3-0.6 us slower on H200s.)
  template <class Coop>
  GIN_HD bool recvLL(Coop coop, Receiver& r, void* dst, size_t bytes) const {
    using P = ll::Packet16;
    const DevComm& c = net_.comm();
    const uint32_t flag = llStepFlag(r.step);
    const P* src = static_cast<const P*>(localPointer(
        f_.window, llRingOffset(f_, channel_, lsaIndexOf(c, r.peer)) + size_t(r.step % f_.nSlots) * llSlotBytes(f_)));
    auto* d = static_cast<unsigned char*>(dst);
    const size_t n = ll::packetCount<P>(bytes);
    bool ok = true;
    for (size_t i = size_t(coop.rank()); i < n; i += size_t(coop.size())) {
      ll::Seen<P> seen{};
      // A timeout reports steps, as a FIFO step's does: expected r.step + 1,
      // observed the step whose packet the slot holds + 1 (0: none yet).
      ok = gin::detail::boundedPoll(
          c,
          [&] {
            seen = ll::load(src + i);
            const uint64_t low = seen.flag & 0x7fffffffu;
            return seen.valid && (seen.flag & 0x80000000u) != 0 ? ((r.step & ~uint64_t(0x7fffffffu)) | low) + 1 : 0;
          },
          [&](uint64_t) { return seen.valid && seen.flag == flag; },
          gin::detail::WaitWhat{Op::P2pRecv, r.peer, net_.context(), r.data, r.step + 1});
      if (!ok) break;
      const size_t off = i * 8, len = bytes - off < 8 ? bytes - off : 8;
      ll::detail::storeBytes(d + off, seen.payload, len);
    }
    if (!coop.syncAll(ok)) return false;
    net_.signal(teamWorld(c), r.peer, SignalAdd{r.creditAtPeer, 1}, coop);
    ++r.step;
    return true;
  }

  // Step k of a message: slot s.step % nSlots of our ring at the peer.
  template <class Coop>
  GIN_HD bool sendStep(Coop coop, Sender& s, Window srcWin, size_t srcOffset, size_t bytes, uint64_t k) const {
    bool ok = true;
    // The slot is free once the receiver released step s.step - nSlots. Its
    // release (after its copy out) pairs with this acquire, so our put cannot
    // overwrite bytes it is still reading.
    if (coop.rank() == 0) ok = waitAtLeast(s.credit, s.step + 1 - f_.nSlots, &s.creditSeen, Op::P2pSend, s.peer);
    if (!coop.syncAll(ok)) return false;
    const size_t off = size_t(k) * f_.chunkBytes, n = bytes - off < f_.chunkBytes ? bytes - off : f_.chunkBytes;
    const size_t slot = size_t(s.step % f_.nSlots);
    // The put's SignalAdd reaches the receiver after the payload (Net contract).
    net_.put(teamWorld(net_.comm()), s.peer, f_.window, s.ring + slot * f_.chunkBytes, srcWin, srcOffset + off, n,
             SignalAdd{s.dataAtPeer, 1}, None{}, coop);
    ++s.step;
    return true;
  }

  template <class Coop>
  GIN_HD bool recvStep(Coop coop, Receiver& r, void* dst, size_t bytes, uint64_t k) const {
    bool ok = true;
    // Acquire pairs with the sender's put+SignalAdd: the slot's bytes are here.
    // The coop sync in syncAll extends it to every thread that copies.
    if (coop.rank() == 0) ok = waitAtLeast(r.data, r.step + 1, &r.dataSeen, Op::P2pRecv, r.peer);
    if (!coop.syncAll(ok)) return false;
    const size_t off = size_t(k) * f_.chunkBytes, n = bytes - off < f_.chunkBytes ? bytes - off : f_.chunkBytes;
    const size_t slot = size_t(r.step % f_.nSlots);
    lsa::coopCopy(coop, static_cast<char*>(dst) + off, localPointer(f_.window, r.ring + slot * f_.chunkBytes), n);
    // Release the slot: signal() syncs the coop and releases at system scope,
    // so every thread's reads of the slot are done before the sender sees the
    // credit and reuses it.
    net_.signal(teamWorld(net_.comm()), r.peer, SignalAdd{r.creditAtPeer, 1}, coop);
    ++r.step;
    return true;
  }
};

}  // namespace gin::p2p
