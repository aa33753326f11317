#pragma once
// `hyla eval longctx`: the long-context suite (docs/longctx.md). For each task, length and depth it
// generates samples (eval/longctx_tasks.h), has the model answer each greedily — through the
// scheduler in this process, or through a running `hyla serve` (/v1/completions with the same token
// ids) — and scores a sample right when every expected string is in the answer (case ignored).
// Controls: the same questions with no context at all (must score at chance), and a check that no
// inserted sentence occurs in the model's training text.
#include <cstdint>
#include <string>
#include <vector>

#include "hyla/core/dtype.h"
#include "hyla/eval/longctx_tasks.h"
#include "hyla/model/model.h"

namespace hyla {

struct LongCtxOptions {
  std::vector<std::string> tasks;  // longctx_task names
  std::vector<int64_t> lengths;    // prompt + answer budget, tokens
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};  // for tasks that place one needle
  int64_t samples = 0;     // per cell; 0: 100 up to 8K, 25 up to 128K, 5 beyond
  uint64_t seed = 1;
  LongCtxWording wording = LongCtxWording::Ruler;
  int64_t max_sequences = 8;                  // decoded together, fewer where memory_budget says
  int64_t memory_budget = int64_t(8) << 30;   // state bytes all sequences of a length may take
  int64_t prefill_chunk = 2048;
  Precision precision = Precision::BF16;
  std::string server;  // "http://host:port": ask a running `hyla serve` instead of the local model
  std::string api_key;
  bool no_context_control = true;
  std::string train_text;  // the model's training text, for the contamination check ("": skipped)
  bool progress = true;
};

// The default samples per cell for a length: 100 up to 8K, 25 up to 128K, 5 beyond.
int64_t default_longctx_samples(int64_t length);

struct LongCtxExample {
  std::vector<std::string> expected;
  std::string output;
  bool correct = false;
};

// One task at one length and depth (depth −1: the task spreads its needles over the context; for
// the no-context control, length is 0).
struct LongCtxCell {
  std::string task;
  size_t task_index = 0;  // into LongCtxOptions::tasks
  LongCtxTier tier = LongCtxTier::Retrieval;
  int64_t length = 0;
  double depth = -1;
  int64_t samples = 0, correct = 0;  // correct: every expected string present
  double found = 0;                  // the sum over samples of the share of expected strings present (RULER's score)
  int64_t prompt_tokens = 0;         // summed over samples
  std::vector<LongCtxExample> examples;  // the first two samples
  double accuracy() const { return samples ? double(correct) / double(samples) : 0.0; }
};

// What one length cost: all of its cells together.
struct LongCtxLength {
  int64_t length = 0;
  int64_t samples = 0, prompt_tokens = 0, generated_tokens = 0;
  double seconds = 0;
  int64_t sequences = 0;                 // decoded together (local runs)
  int64_t state_bytes_per_sequence = 0;  // KDA states + latent cache at this length (local runs)
  int64_t peak_rss_bytes = 0;            // the process's peak resident memory after this length
};

struct LongCtxResult {
  std::string generator = kLongCtxGenerator;
  uint64_t seed = 1;
  LongCtxWording wording = LongCtxWording::Ruler;
  std::string model;     // the server's URL; the caller names a local model
  std::string haystack;  // the haystack text's source
  std::vector<LongCtxCell> cells;       // by task, then length, then depth
  std::vector<LongCtxLength> lengths;   // in the order run
  std::vector<LongCtxCell> no_context;  // one per task (length 0), when the control ran
  // Tasks left out at a length they do not fit (a one-shot example or a chain longer than it),
  // with the generator's reason; a grid of lengths may start below some tasks' size.
  struct Skipped {
    std::string task;
    int64_t length = 0;
    std::string reason;
  };
  std::vector<Skipped> skipped;
  // The contamination check: samples whose inserted sentences were searched in the training text,
  // and those found (with the first few sentences found).
  bool contamination_checked = false;
  int64_t contamination_samples = 0, contamination_found = 0;
  std::vector<std::string> contamination_examples;
  double seconds = 0;
};

// Runs the suite. `model` is null when options.server is set. `haystack_text` is the text the
// haystacks are cut from (one sentence a line), named `haystack_source`.
LongCtxResult evaluate_longctx(Model* model, const Tokenizer& tokenizer, const std::string& haystack_text,
                               const std::string& haystack_source, const LongCtxOptions& options);

}  // namespace hyla
