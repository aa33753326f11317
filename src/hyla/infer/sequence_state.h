#pragma once
// One sequence's inference state for a model, each layer's as its StateSpec (model/state_spec.h)
// says: per KDA layer the conv tails and the delta-rule state (f32, fixed size), per latent
// attention layer the latent cache of c and k_pe per token (bf16 by default, linear in tokens).
// Allocated once for a capacity; reused across requests.
#include <cstdint>
#include <string>

#include "hyla/core/tensor.h"
#include "hyla/model/model.h"

namespace hyla {

class SequenceState {
 public:
  SequenceState(const Model& model, int64_t capacity, DType latent_dtype = DType::BF16);
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;

  SequenceCache& cache() { return cache_; }
  int64_t length() const;  // tokens processed so far
  int64_t capacity() const { return capacity_; }
  DType latent_dtype() const { return latent_dtype_; }
  void reset();            // back to an empty sequence (zero states, empty caches)

  // Memory: the fixed part (KDA tails and states) and the part per cached token (latent caches).
  int64_t fixed_bytes() const { return fixed_bytes_; }
  int64_t bytes_per_token() const { return bytes_per_token_; }
  int64_t bytes_at(int64_t tokens) const { return fixed_bytes_ + bytes_per_token_ * tokens; }
  int64_t allocated_bytes() const { return int64_t(recurrent_.nbytes() + latent_.nbytes()); }  // bytes_at(capacity())
  // The arithmetic as one line: "0.89 MiB fixed (KDA states and conv tails) + 512 B per token
  // (latent cache, bf16) = 4.89 MiB at 8192 tokens".
  std::string describe_memory(int64_t tokens) const;

  // Becomes a copy of `other` (its first `other.length()` tokens): forking a sequence (sampling
  // several continuations of one prompt).
  void copy_from(const SequenceState& other);

  // The state in pieces, for prompt-state reuse (prefix_cache.h): the latent rows of tokens
  // [begin, end) of every latent layer (bytes_per_token() each, layer after layer), and the
  // recurrent part (fixed_bytes()). Restoring a prefix of n tokens loads rows [0, n) piece by
  // piece, then the recurrent part saved at n, which sets the length to n.
  void save_rows(int64_t begin, int64_t end, std::byte* out) const;
  void load_rows(int64_t begin, int64_t end, const std::byte* in);
  void save_recurrent(std::byte* out) const;
  void load_recurrent(const std::byte* in, int64_t length);

 private:
  int64_t capacity_;
  DType latent_dtype_;
  Tensor recurrent_;  // all recurrent layers' fixed state (conv tails, then state), back to back
  Tensor latent_;     // all latent layers' caches, back to back
  SequenceCache cache_;
  std::vector<int64_t> row_width_;  // values per cached token of each layer (0: a recurrent layer)
  int64_t fixed_bytes_ = 0, bytes_per_token_ = 0;
};

// Feeds `ids` to the state (chunks of `chunk` tokens); returns the logits [1, V] after the last.
Tensor feed(Model& model, const std::vector<int32_t>& ids, SequenceState& state, int64_t chunk, Precision precision);

}  // namespace hyla
