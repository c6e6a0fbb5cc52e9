// tests/host/tsan_fence.cpp — built only under ThreadSanitizer: what
// gin/core/atomic.hpp tells TSan about fence() lets it accept the publications
// C++ orders through a fence, and still report those that lack one.
//
//   tsan_fence MODE     writer: data = 42, [fence], flag = 1 (relaxed store)
//                       reader: waits for flag, [fence], reads data
//   fenced              fence + relaxed store / acquire load: no report
//   reader_fence        fence + relaxed store / relaxed polls + fence: no report
//   no_writer_fence     relaxed store alone: TSan reports the race (exit 66)
//   no_reader_fence     fence + relaxed store / relaxed polls alone: reported
#include <cstdio>
#include <cstring>
#include <thread>

#include "gin/core/atomic.hpp"

static_assert(GIN_TSAN, "tsan_fence is built only with -fsanitize=thread");

namespace {
uint64_t flag = 0;
int data = 0;
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const char* mode = argv[1];
  const bool writerFence = std::strcmp(mode, "no_writer_fence") != 0;
  const bool readerAcquire = std::strcmp(mode, "fenced") == 0;
  const bool readerFence = std::strcmp(mode, "reader_fence") == 0;
  std::thread writer([&] {
    data = 42;
    if (writerFence) gin::fence<gin::Scope::System>();
    gin::atomicStore(&flag, uint64_t(1), gin::MemoryOrder::Relaxed);
  });
  std::thread reader([&] {
    const gin::MemoryOrder o = readerAcquire ? gin::MemoryOrder::Acquire : gin::MemoryOrder::Relaxed;
    while (gin::atomicLoad(&flag, o) == 0) std::this_thread::yield();
    if (readerFence) gin::fence<gin::Scope::System>();
    std::printf("%s: read %d\n", mode, data);
  });
  writer.join();
  reader.join();
  return 0;
}
