#pragma once
#include <filesystem>

namespace hyla {

// Writes RUN_DIR/report.html from metrics.jsonl and run.json: a self-contained page (inline SVG, no
// scripts, no network) with train and validation loss, learning rate, throughput and MFU, the
// expert-load heat map per MoE layer over steps, and the curriculum's stage boundaries.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace hyla
