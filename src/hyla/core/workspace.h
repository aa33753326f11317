#pragma once
// Scratch memory: the one place layers and kernels get memory that lives only for a call.
//
// A Workspace holds one bump arena per thread of a forward. Code takes buffers from an arena inside a
// Frame and the Frame's end gives them all back; the first passes grow the arenas to their
// high-water mark and from then on nothing allocates. One Workspace serves a whole model, every
// layer in turn, so scratch does not grow with depth. A Model owns one and hands it to its layers
// through ForwardContext; kernels that need scratch (KDA's chunked tasks) take it as an argument.
//
// What crosses it: pointers valid until the Frame that took them ends. What never does: anything
// that must outlive the call — activations a layer saves for its backward stay with the layer,
// cache state with the SequenceCache, results with the caller.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace hyla {

class Arena {
 public:
  // `count` uninitialised T, 64-byte aligned, valid until the enclosing Frame ends.
  template <typename T>
  T* take(int64_t count) {
    return static_cast<T*>(take_bytes(size_t(count) * sizeof(T)));
  }
  void* take_bytes(size_t bytes);

  struct Mark {
    size_t block, used, in_use;
  };
  Mark mark() const { return {blocks_.size() - 1, blocks_.back().used, in_use_}; }
  // Frees everything taken since `m`. Back at the empty mark, an arena that overflowed its first
  // block replaces it by one of the high-water size, so only the first passes allocate.
  void rewind(Mark m);

  Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;
  size_t capacity() const;  // bytes in the first block (tests, diagnostics)

 private:
  struct Block {
    std::shared_ptr<void> memory;
    size_t capacity = 0, used = 0;
  };
  std::vector<Block> blocks_;  // never empty; later blocks exist only while the first overflows
  size_t in_use_ = 0, high_water_ = 0;  // bytes taken over all blocks, now and at most
};

// Takes from an arena for a scope: everything taken through it is freed at its end.
class Frame {
 public:
  explicit Frame(Arena& arena) : arena_(arena), mark_(arena.mark()) {}
  ~Frame() { arena_.rewind(mark_); }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  template <typename T>
  T* take(int64_t count) {
    return arena_.take<T>(count);
  }

 private:
  Arena& arena_;
  Arena::Mark mark_;
};

class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // The arena of thread `index` of the forward's threads (omp_get_thread_num() inside an OpenMP
  // region, the thread argument of a parallel_for piece; the serial caller is thread 0).
  // reserve() must have run for the current thread count.
  Arena& thread(int index) { return *arenas_[size_t(index)]; }
  // The calling thread's arena outside parallel regions.
  Arena& serial() { return thread(0); }
  // One arena per thread of num_threads() (call before a parallel region).
  void reserve();
  // Bytes the arenas hold between passes: it stops growing once the shapes repeat.
  size_t bytes() const;

 private:
  std::vector<std::unique_ptr<Arena>> arenas_;
};

}  // namespace hyla
