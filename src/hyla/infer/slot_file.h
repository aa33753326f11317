#pragma once
// A slot's state as a file (llama-server's slot save and restore): the tokens a sequence state
// holds, the images among them, and the state itself, so that a conversation saved today continues
// tomorrow, on a restarted server, without reading its prompt again.
//
// Layout (little-endian): a 64-byte header — "HYLASLOT", version (u32), the latent cache's dtype
// (u32: 0 f32, 1 bf16), the model's fingerprint (u64), the state's fixed bytes and bytes per token
// (i64 each), the number of tokens and of images (i64 each), a CRC-32 of everything after the
// header (u32) and 4 zero bytes — then the tokens (i32 each), the images (row i64, content digest
// u64), the latent rows of tokens [0, n) layer after layer (SequenceState::save_rows), and the
// recurrent state (SequenceState::save_recurrent).
//
// A restore checks the header, then that the file is exactly the size the header says, then the
// checksum, then every token and image, before it touches the state: a truncated, corrupt or
// foreign file is refused with an error naming the file and the rule, and the state is unchanged.
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "hyla/infer/prefix_cache.h"
#include "hyla/infer/sequence_state.h"

namespace hyla {

// Identifies the model a state belongs to: its configuration, every parameter's name, shape and
// storage, and the values of its vectors (norm weights, biases, gates), which a fine-tune changes.
// Two models that differ only in matrix values share a fingerprint; the state's geometry (fixed
// bytes, bytes per token, latent dtype) is checked beside it.
uint64_t model_fingerprint(const Model& model);

// The tokens and images a state holds, as a restore found them.
struct SlotContents {
  std::vector<int32_t> tokens;
  std::vector<PromptInput> inputs;
};

// Writes `state` (holding exactly `tokens`, with `inputs` among them) to `path` atomically; returns
// the bytes written.
int64_t save_slot_file(const std::filesystem::path& path, uint64_t fingerprint, std::span<const int32_t> tokens,
                       std::span<const PromptInput> inputs, const SequenceState& state);

// Loads `path` into `state` after checking it against `fingerprint`, the state's geometry and
// capacity and `vocab_size`; `bytes` (if given) receives the file's size. Throws hyla::Error naming
// the file and the problem, with `state` untouched.
SlotContents load_slot_file(const std::filesystem::path& path, uint64_t fingerprint, int64_t vocab_size,
                            SequenceState& state, int64_t* bytes = nullptr);

}  // namespace hyla
