// gin/host/shm_segment.hpp — ShmSegment: a POSIX shared memory segment that
// one process creates under a fresh name and others map by that name. The lsa
// memory of CPU ranks in several processes (memory.hpp) and the bootstrap's
// shared-memory path (bootstrap_shm.hpp) live in one.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "gin/core/error.hpp"

namespace gin {

// A POSIX shared memory segment, mapped read/write. The creator may unlink the
// name once every peer has mapped it; the memory lives until the last unmap.
class ShmSegment {
 public:
  ShmSegment() = default;
  // Named "/gin.<kind><pid>.<random>" (kind: "" or e.g. "bootstrap."). With
  // `reserve`, every page is allocated now: a full /dev/shm is this Error, not
  // a SIGBUS at the first store that needs a page.
  static ShmSegment create(size_t bytes, const std::string& kind = "", bool reserve = false) {
    std::random_device rd;
    const uint64_t tag = (uint64_t(rd()) << 32) ^ rd();
    ShmSegment s;
    s.name_ = "/gin." + kind + std::to_string(::getpid()) + "." + std::to_string(tag);
    const int fd = ::shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      throw Error("shm_open(" + s.name_ + ") failed: " + std::strerror(errno) + "; is /dev/shm mounted and writable?");
    s.owner_ = true;
    const int e = ::ftruncate(fd, off_t(bytes)) != 0 ? errno : reserve ? ::posix_fallocate(fd, 0, off_t(bytes)) : 0;
    if (e != 0) {
      ::close(fd);
      ::shm_unlink(s.name_.c_str());
      throw Error("cannot size shared memory segment to " + std::to_string(bytes) + " bytes: " + std::strerror(e) +
                  " (is /dev/shm large enough?)");
    }
    s.map(fd, bytes);
    return s;
  }
  static ShmSegment open(const std::string& name, size_t bytes) {
    ShmSegment s;
    s.name_ = name;
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) throw Error("cannot open peer's shared memory segment " + name + ": " + std::strerror(errno));
    // Mapping past its end would turn the first access into a SIGBUS.
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size < off_t(bytes)) {
      ::close(fd);
      throw Error("shared memory segment " + name + " is smaller than the " + std::to_string(bytes) +
                  " bytes expected; it is not the one this peer made");
    }
    s.map(fd, bytes);
    return s;
  }
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      name_ = std::move(o.name_);
      owner_ = std::exchange(o.owner_, false);
    }
    return *this;
  }
  ~ShmSegment() { release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Remove the name (peers that mapped it keep their mapping).
  void unlink() {
    if (owner_) ::shm_unlink(name_.c_str());
    owner_ = false;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;

  void map(int fd, size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw Error("mmap of shared memory segment " + name_ + " failed: " + std::strerror(errno));
    data_ = p;
    bytes_ = bytes;
  }
  void release() {
    if (data_) ::munmap(data_, bytes_);
    data_ = nullptr;
    unlink();
  }
};

}  // namespace gin
