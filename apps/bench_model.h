#pragma once
// `hyla bench --model DIR`: llama-bench-style inference speed of a model directory.
#include <cstdint>
#include <string>
#include <vector>

#include "hyla/model/model.h"

namespace hyla::cli {

struct ModelBenchArgs {
  std::string model_dir;
  std::vector<int64_t> prompts{512}, generations{128}, depths{0}, threads, batches{1};
  std::vector<std::string> dtypes{"bf16"};
  int reps = 5;
  int64_t prefill_chunk = 512;
  int64_t ttft_prefix = 0;  // > 0: time to first token with and without this many cached prompt tokens
  int64_t snapshot_every = 512;  // the prompt-state snapshot interval of the cached case
  bool json = false;
  // The token ids of the tests: from this text (tokenized with the model's tokenizer) instead of
  // random ids, so that routing sees real text (expert offload measures its cache on it).
  std::string text_file;
  ModelLoadOptions load;   // --expert-memory and its flags
  bool cold_page_cache = false;  // with offload: every repetition starts with no expert resident or cached
  // An image (PNG or JPEG) whose prefill is timed too: its patches through the vision tower, and
  // its tokens through the whole model (tower and layers).
  std::string image_file;
};

void bench_model(const ModelBenchArgs& args);

}  // namespace hyla::cli
