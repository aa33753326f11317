#pragma once
// Where a layer's forward puts its activations. When a backward will read them they go into the
// layer's own arena, emptied by its next saving forward (a training step allocates nothing once
// the shapes repeat); otherwise into the shared Workspace, given back when the forward returns,
// so inference keeps one set of scratch for the whole model instead of one per layer. Either way
// the layer body takes its buffers the same way and never asks which.
#include <cstdint>

#include "hyla/core/workspace.h"

namespace hyla {

class LayerActivations {
 public:
  LayerActivations(Arena& kept, Workspace& workspace, bool keep)
      : arena_(keep ? kept : workspace.serial()), mark_(arena_.mark()), keep_(keep) {
    if (keep_) arena_.rewind(kEmpty);
  }
  ~LayerActivations() {
    if (!keep_) arena_.rewind(mark_);
  }
  LayerActivations(const LayerActivations&) = delete;
  LayerActivations& operator=(const LayerActivations&) = delete;

  template <typename T>
  T* take(int64_t count) {
    return arena_.take<T>(count);
  }

 private:
  static constexpr Arena::Mark kEmpty{0, 0, 0};
  Arena& arena_;
  Arena::Mark mark_;
  bool keep_;
};

}  // namespace hyla
