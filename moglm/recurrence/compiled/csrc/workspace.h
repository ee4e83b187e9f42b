// The windows' workspace cache: large buffers kept for the next window instead of handed back to the OS.
//
// A training window allocates the same large buffers at every call (the gates, the mogrifier chains and
// their gradients: about 400 MB for the Mogrifier at H = 1024, B = 64, T = 70). glibc serves blocks over
// 32 MB by mmap and returns them with munmap, so every call pays a page fault and a zeroed page for each
// 4 KB of them again: 12% of the Mogrifier's training time at H = 1024 by perf on an Intel Xeon
// (docs/fused-recurrence.md, "The workspace cache"). The cache keeps freed blocks by size, as torch's CUDA
// caching allocator does, and hands one back when a window asks for that size or up to a quarter less (the
// best fit: a shorter last window or batch reuses the full ones' blocks instead of stranding them).
//
// * Only the windows' internal buffers come from it: the saved tensors autograd holds between forward and
//   backward, and the backward's scratch. What the user gets (outputs, gradients) comes from at::empty, so
//   their storage stays resizable.
// * A block is returned to the cache by its tensor's deleter, on whichever thread frees it.
// * The cache holds at most ``MOGLM_WORKSPACE_CACHE_MB`` MiB (default 2048; 0 turns it off), dropping its
//   oldest blocks first. Blocks under ``MOGLM_WORKSPACE_CACHE_MIN_KB`` KiB (default 1024) are left to
//   malloc, whose free lists serve them without the OS. ``workspace_cache_clear`` (Python:
//   ``moglm.recurrence.compiled.empty_cache()``) hands every cached block back to the OS. Both settings are
//   whole numbers of at most 2^40 (``compiled/build.py`` checks them first, with the same rule).
// * ``MOGLM_WORKSPACE_POISON=1`` (for tests) fills every block it hands out, kept or new, with 0xFF bytes:
//   NaN in float32 and float64, so that a window reading a buffer before writing it shows.

#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace moglm {

class WorkspaceCache {
 public:
  // a block of at least ``bytes`` (at most a quarter more) and its true size, which ``give`` takes back
  std::pair<void*, size_t> take(size_t bytes) {
    std::pair<void*, size_t> block = take_block(bytes);
    if (poison_) std::memset(block.first, 0xFF, block.second);
    return block;
  }

  void give(void* p, size_t bytes) noexcept {
    std::lock_guard<std::mutex> guard(mutex_);
    while (cached_ + bytes > limit_ && !free_.empty()) {  // oldest first
      std::free(free_.front().second);
      cached_ -= free_.front().first;
      free_.pop_front();
    }
    try {
      free_.emplace_back(bytes, p);
      cached_ += bytes;
    } catch (...) {  // no memory for the list node: a deleter must not throw, so the block goes back to the OS
      std::free(p);
    }
  }

  void clear() {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& block : free_) std::free(block.second);
    free_.clear();
    cached_ = 0;
  }

  // [bytes cached, blocks cached, hits, misses, limit in bytes]
  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> guard(mutex_);
    return {int64_t(cached_), int64_t(free_.size()), int64_t(hits_), int64_t(misses_), int64_t(limit_)};
  }

  // whether a block of ``bytes`` is kept by the cache
  bool keeps(size_t bytes) const { return limit_ > 0 && bytes >= min_bytes_ && bytes <= limit_; }

  // never destroyed: tensors freed at interpreter exit still return their blocks to it
  static WorkspaceCache& get() {
    static WorkspaceCache* cache =
        new WorkspaceCache(size_from_env("MOGLM_WORKSPACE_CACHE_MB", 2048) << 20,
                           size_from_env("MOGLM_WORKSPACE_CACHE_MIN_KB", 1024) << 10,
                           size_from_env("MOGLM_WORKSPACE_POISON", 0) != 0);
    return *cache;
  }

 private:
  std::pair<void*, size_t> take_block(size_t bytes) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      auto best = free_.rend();  // the smallest fitting block; of equal ones the newest, warmest in cache
      for (auto it = free_.rbegin(); it != free_.rend(); ++it)
        if (it->first >= bytes && it->first <= bytes + bytes / 4 && (best == free_.rend() || it->first < best->first))
          best = it;
      if (best != free_.rend()) {
        std::pair<void*, size_t> block{best->second, best->first};
        free_.erase(std::next(best).base());
        cached_ -= block.second;
        ++hits_;
        return block;
      }
      ++misses_;
    }
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) == 0) return {p, bytes};
    clear();  // out of memory: hand the cached blocks back and try once more, as torch's CUDA allocator does
    if (posix_memalign(&p, 64, bytes) == 0) return {p, bytes};
    throw std::bad_alloc();
  }

  WorkspaceCache(size_t limit, size_t min_bytes, bool poison) : limit_(limit), min_bytes_(min_bytes), poison_(poison) {
    // glibc raises its mmap threshold (from 128 KB, up to 32 MB) each time it frees an mmap-ed block, so the
    // windows' big buffers used to lift it, and the mid-sized tensors around them (a window's outputs, the
    // weight gradients) then came from the heap. The cache frees no block, so it lifts the threshold once
    // itself, where the uncached windows left it; elsewhere this is one malloc and free.
    if (limit_ > 0) {
      void* volatile block = std::malloc((size_t(32) << 20) - (size_t(64) << 10));  // volatile: not elided
      std::free(block);
    }
  }

  static constexpr size_t MAX_SETTING = size_t(1) << 40;

  // a whole number (ASCII digits only) of at most MAX_SETTING, the rule compiled/build.py checks first
  static size_t size_from_env(const char* name, size_t fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    size_t value = 0;
    for (const char* c = text; *c != '\0'; ++c) {
      TORCH_CHECK(*c >= '0' && *c <= '9' && value <= MAX_SETTING, name,
                  " must be a whole number from 0 to 2^40, got '", text, "'");
      value = value * 10 + size_t(*c - '0');
    }
    TORCH_CHECK(value <= MAX_SETTING, name, " must be a whole number from 0 to 2^40, got '", text, "'");
    return value;
  }

  std::mutex mutex_;
  std::list<std::pair<size_t, void*>> free_;  // oldest first
  size_t cached_ = 0;
  const size_t limit_, min_bytes_;
  const bool poison_;
  int64_t hits_ = 0, misses_ = 0;
};

// An uninitialised tensor for a window's internal use (see above): from the cache when it is on and the
// block is large enough to be worth keeping, else at::empty.
inline at::Tensor workspace(at::IntArrayRef sizes, const at::TensorOptions& opts) {
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = size_t(numel) * opts.dtype().itemsize();
  WorkspaceCache& cache = WorkspaceCache::get();
  if (bytes == 0 || !cache.keeps(bytes) || opts.device().type() != at::kCPU) return at::empty(sizes, opts);
  const std::pair<void*, size_t> block = cache.take(bytes);
  const size_t kept = block.second;
  return at::from_blob(block.first, sizes, [kept](void* p) { WorkspaceCache::get().give(p, kept); }, opts);
}

}  // namespace moglm
