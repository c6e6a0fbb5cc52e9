// gin/device/window.hpp — registered memory windows as kernels see them.
//
// A Window is one pointer to a WindowDev table the communicator keeps in
// memory the executing agent can read. The same offset names the same place in
// every rank's copy of a window; SymPtr<T> is (window, offset) typed.
#pragma once

#include <type_traits>

#include "gin/device/team.hpp"

namespace gin {

struct WindowDev {
  char* localBase;  // this rank's buffer
  uint64_t bytes;   // same on every rank
  uint32_t id;      // communicator-wide window id
  int32_t lsaSize;
  char* const* lsaBases;  // [lsaSize] each lsa member's buffer, mapped here
};

struct Window {
  const WindowDev* dev = nullptr;
  GIN_HD explicit operator bool() const { return dev != nullptr; }
  GIN_HD bool operator==(const Window& o) const { return dev == o.dev; }
};
static_assert(std::is_trivially_copyable_v<Window>);

// Address of `offsetBytes` in this rank's part of `w` (ncclGetLocalPointer).
GIN_HD GIN_INLINE void* localPointer(Window w, size_t offsetBytes) {
  return loadConst(&w.dev->localBase) + offsetBytes;
}
// Address of `offsetBytes` in lsa member `lsaPeer`'s part of `w`, usable for
// loads and stores from here (ncclGetLsaPointer).
GIN_HD GIN_INLINE void* lsaPointer(Window w, size_t offsetBytes, int lsaPeer) {
  return loadConst(loadConst(&w.dev->lsaBases) + lsaPeer) + offsetBytes;
}
// Same, with the peer named in any team; nullptr when it is not lsa-reachable.
GIN_HD GIN_INLINE void* peerPointer(const DevComm& c, Team t, int peer, Window w, size_t offsetBytes) {
  const int i = teamToLsa(c, t, peer);
  return i < 0 ? nullptr : lsaPointer(w, offsetBytes, i);
}

template <class T>
struct SymPtr {
  Window window;
  uint64_t offset = 0;  // bytes

  SymPtr() = default;
  GIN_HD SymPtr(Window w, uint64_t offsetBytes) : window(w), offset(offsetBytes) {}
  GIN_HD SymPtr operator+(int64_t nElts) const { return SymPtr(window, offset + nElts * int64_t(sizeof(T))); }
  GIN_HD SymPtr& operator+=(int64_t nElts) {
    offset += nElts * int64_t(sizeof(T));
    return *this;
  }
  GIN_HD T* local() const { return static_cast<T*>(localPointer(window, offset)); }
  GIN_HD T* lsa(int lsaPeer) const { return static_cast<T*>(lsaPointer(window, offset, lsaPeer)); }
  template <class U>
  GIN_HD SymPtr<U> cast() const {
    return SymPtr<U>(window, offset);
  }
};

}  // namespace gin
