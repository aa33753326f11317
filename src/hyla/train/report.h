#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace hyla {

// A chart axis: the range it draws and its ticks, at multiples of a round step (1, 2 or 5 × 10^k).
struct Axis {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> ticks;
};

// The value axis for data in [lo, hi]: from the step's multiple at or below lo to the one at or above
// hi, every multiple between ticked. It never goes below 0 when lo is not below 0, so a learning
// rate warming up from 0 gets no negative tick.
Axis value_axis(double lo, double hi);

// The step axis for steps lo..hi: exactly that range, ticked at the round multiples inside it.
Axis step_axis(double lo, double hi);

// A tick's text with as many decimals as the step needs ("0.0015" for a step of 5e-4, "1200" for 200).
std::string tick_label(double value, double step);

// Writes RUN_DIR/report.html from metrics.jsonl and run.json: a self-contained page (inline SVG, no
// scripts, no network) with train and validation loss, learning rate, throughput and MFU, the
// expert-load heat map per MoE layer over steps, and the curriculum's stage boundaries.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace hyla
