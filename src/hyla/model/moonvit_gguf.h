#pragma once
// MoonViT (SPEC §7.2) and llama.cpp's vision files: a `clip` GGUF of type mmproj with projector
// type `kimik25`, as llama.cpp's converter writes one from a Kimi-K2.5 checkpoint, both ways. A
// user pairs it with a text GGUF (`--mmproj`), as llama.cpp's users do.
//
// What crosses: the tower's config from the clip.vision.* keys, and its tensors under llama.cpp's
// names (docs/kimi-llamacpp.md §6):
//   v.patch_embd, v.position_embd       ↔ vision_tower.patch_embed.proj, .pos_emb
//   v.blk.{l}.ln1, ln2                  ↔ vision_tower.encoder.blocks.{l}.norm0, norm1
//   v.blk.{l}.attn_qkv                  ↔ …wqkv, its q and k rows in "split" order: llama.cpp's
//                                         converter moves each head's rotary pairs so that the
//                                         column pairs come first, then the row pairs
//   v.blk.{l}.attn_out, ffn_up, ffn_down ↔ …wo, mlp.fc0, mlp.fc1
//   v.post_ln                           ↔ vision_tower.encoder.final_layernorm
//   mm.input_norm, mm.1, mm.2           ↔ mm_projector.pre_norm, proj.0, proj.2
// The format holds only K2.5's variant (LayerNorm with biases, a bicubic grid, `patchmerger`,
// attention as wide as the tower): K3's tower (RMSNorm, no biases, `patchmergerv2`), which llama.cpp
// does not run, is refused by name. Read, the projector's GELU is the official erf, which
// llama.cpp's graph computes in tanh form (scripts/check-llamacpp-vision.sh reports the difference).
#include <filesystem>
#include <memory>

#include "hyla/io/gguf.h"
#include "hyla/io/safetensors.h"
#include "hyla/model/config.h"

namespace hyla {

// Whether `gguf` is a clip mmproj file (general.architecture "clip").
bool is_mmproj(const GgufFile& gguf);

// The vision tower of a kimik25 mmproj, for a text model of width `text_hidden`.
VisionConfig vision_config_from_mmproj(const GgufFile& gguf, int64_t text_hidden);

// Adds the tower's tensors, under hyla's names and in its layout, to `weights`.
void add_mmproj_weights(std::shared_ptr<const GgufFile> gguf, const VisionConfig& vision, ModelWeights& weights);

// Writes `config`'s vision tower from `weights` as a kimik25 mmproj (F32), atomically.
void save_moonvit_mmproj(const std::filesystem::path& path, const ModelConfig& config, const ModelWeights& weights);

}  // namespace hyla
