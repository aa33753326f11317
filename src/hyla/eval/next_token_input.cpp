#include "hyla/eval/next_token_input.h"

#include <algorithm>
#include <vector>

namespace hyla {

ModelInput next_token_input(const TokenWindows& w) {
  ModelInput in;
  std::vector<int64_t> lengths;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(w.lengths[size_t(r)], w.width) - 1);
    if (n == 0) continue;
    lengths.push_back(n);
    for (int64_t t = 0; t < n; ++t) {
      in.ids.push_back(w.tokens[size_t(r * w.width + t)]);
      in.targets.push_back(w.tokens[size_t(r * w.width + t + 1)]);
    }
  }
  in.tokens = TokenBatch::packed(lengths);
  return in;
}

void append_image_sequences(ModelInput& in, ImageSequences& sequences, int32_t image_pad_id) {
  if (sequences.lengths.empty()) return;
  std::vector<int64_t> lengths;
  for (int64_t b = 0; b < in.tokens.batch(); ++b) lengths.push_back(in.tokens.length(b));
  lengths.insert(lengths.end(), sequences.lengths.begin(), sequences.lengths.end());
  in.ids.insert(in.ids.end(), sequences.ids.begin(), sequences.ids.end());
  in.targets.insert(in.targets.end(), sequences.targets.begin(), sequences.targets.end());
  for (Image& image : sequences.images) in.images.push_back(std::move(image));
  in.image_pad_id = image_pad_id;
  in.tokens = TokenBatch::packed(lengths);
}

}  // namespace hyla
