#pragma once
// The model input of a batch of token windows: training steps and evaluation read their batches
// the same way (here, beside the evaluator, which the trainer uses too).
#include "hyla/data/loader.h"
#include "hyla/model/model.h"

namespace hyla {

// Each window of [B, T+1] as one sequence of the batch predicting its next token: ids are the
// window's first n tokens and targets the n after them, n = min(length, T+1) − 1; empty rows are
// skipped.
ModelInput next_token_input(const TokenWindows& w);

}  // namespace hyla
