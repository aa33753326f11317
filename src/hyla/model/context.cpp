#include "hyla/model/context.h"

#include "hyla/core/error.h"

namespace hyla {

TokenBatch TokenBatch::uniform(int64_t B, int64_t T) { return packed(std::vector<int64_t>(size_t(B), T)); }

TokenBatch TokenBatch::packed(const std::vector<int64_t>& lengths, const std::vector<int64_t>& offsets) {
  HYLA_CHECK(offsets.empty() || offsets.size() == lengths.size(), "token batch: {} offsets for {} sequences",
             offsets.size(), lengths.size());
  TokenBatch t;
  for (size_t b = 0; b < lengths.size(); ++b) {
    HYLA_CHECK(lengths[b] >= 0, "token batch: sequence {} has negative length {}", b, lengths[b]);
    const int64_t offset = offsets.empty() ? 0 : offsets[b];
    for (int64_t i = 0; i < lengths[b]; ++i) t.positions.push_back(offset + i);
    t.rows += lengths[b];
    t.starts.push_back(t.rows);
  }
  return t;
}

}  // namespace hyla
