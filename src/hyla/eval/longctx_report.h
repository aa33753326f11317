#pragma once
// What `hyla eval longctx` reports (docs/longctx.md): the result as JSON (every cell with a Wilson
// 95% interval and RULER's score; each tier pooled per length, with its retention from a length L
// to 8L; what each length cost; the controls) and a self-contained report.html (the retrieval-vs-
// synthesis table, a depth × length heat map per task, the costs, the controls, example answers).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "hyla/eval/longctx_eval.h"

namespace hyla {

// A length in tokens as the report writes it: multiples of 1048576 as "M", of 1024 as "K", others
// as the number (1024 → "1K", 32768 → "32K", 1048576 → "1M", 1500 → "1500", 0 → "0").
std::string format_length(int64_t tokens);

// The whole result: "generator", "seed", "model", "haystack", "seconds"; "cells" (one object per
// cell: task, tier, length, depth (null when spread), samples, correct, accuracy, interval
// [low, high] (Wilson 95%), ruler_score, mean_prompt_tokens, examples); "tiers" (per tier present,
// in enum order: "lengths", the cells of each length pooled, ascending, and "retention", for each
// length L whose 8L was also measured, {length, long_length, ratio = score(8L) / score(L)}, null
// when score(L) is 0); "lengths" (each LongCtxLength, with prompt_tokens_per_s); "controls"
// ("no_context" per task, "contamination").
nlohmann::ordered_json longctx_json(const LongCtxResult& result);

// A self-contained HTML page (inline CSS; no scripts, no external resources): the header, the
// tiers by length with their retention, per task a depth × length heat map (red 0% → yellow →
// green 100%), the cost of each length, the controls, and each task's first examples.
std::string longctx_html(const LongCtxResult& result);

}  // namespace hyla
