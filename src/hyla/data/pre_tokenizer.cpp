#include "hyla/data/pre_tokenizer.h"

#include <fmt/format.h>

namespace hyla {

PreTokenizer::PreTokenizer(const PreTokenizerConfig& config, const std::string& source)
    : prefix_step_(config.splits.size()), add_prefix_space_(config.add_prefix_space) {
  for (size_t i = 0; i < config.splits.size(); ++i)
    regexes_.emplace_back(config.splits[i].pattern, config.splits[i].literal,
                          fmt::format("{}: pre_tokenizer split {}", source, i));
  if (config.use_regex) regexes_.emplace_back(std::string(kGpt2Pattern), false, source + ": ByteLevel regex");
}

}  // namespace hyla
