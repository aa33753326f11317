#pragma once
// Small deterministic text corpora and a tokenizer trained on them, shared by the data tests.
#include <string>

#include "hyla/data/tokenizer.h"

namespace hyla::test {

// About `paragraphs` blank-line separated paragraphs of English-like text with numbers,
// punctuation, contractions and some non-ASCII words; the same for the same arguments.
std::string sample_text(int paragraphs = 60, uint64_t seed = 1);

// A tokenizer trained on sample_text() to 512 tokens (trained once per test run).
const Tokenizer& small_tokenizer();

// small_tokenizer with the marker tokens of Kimi K2's chat format added, and with `k3` Kimi K3's
// too (K3's tokenizer carries both; its own markers decide its format).
Tokenizer kimi_tokenizer(bool k3);

}  // namespace hyla::test
