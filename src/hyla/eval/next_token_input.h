#pragma once
// The model input of a batch of token windows: training steps and evaluation read their batches
// the same way (here, beside the evaluator, which the trainer uses too).
#include "hyla/data/image_batches.h"
#include "hyla/data/loader.h"
#include "hyla/model/model.h"

namespace hyla {

// Each window of [B, T+1] as one sequence of the batch predicting its next token: ids are the
// window's first n tokens and targets the n after them, n = min(length, T+1) − 1; empty rows are
// skipped.
ModelInput next_token_input(const TokenWindows& w);

// Appends image-text sequences (data/image_batches.h) after the input's own: training mixes them
// into each micro-batch. The images move into the input.
void append_image_sequences(ModelInput& in, ImageSequences& sequences, int32_t image_pad_id);

}  // namespace hyla
