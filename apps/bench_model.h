#pragma once
// `hyla bench --model DIR`: llama-bench-style inference speed of a model directory.
#include <cstdint>
#include <string>
#include <vector>

namespace hyla::cli {

struct ModelBenchArgs {
  std::string model_dir;
  std::vector<int64_t> prompts{512}, generations{128}, depths{0}, threads, batches{1};
  std::vector<std::string> dtypes{"bf16"};
  int reps = 5;
  int64_t prefill_chunk = 512;
  int64_t ttft_prefix = 0;  // > 0: time to first token with and without this many cached prompt tokens
  bool json = false;
};

void bench_model(const ModelBenchArgs& args);

}  // namespace hyla::cli
