#include "hyla/plan/gpus.h"

#include <cmath>
#include <cstdlib>

#include "hyla/core/error.h"

namespace hyla {

const std::vector<GpuSpec>& known_gpus() {
  // B200 boards carry 192 GB of HBM3e but expose about 180 GB (HGX/DGX B200: 1,440 GB for 8 GPUs).
  static const std::vector<GpuSpec> kGpus = {
      {"a100-80g", 80e9, 2.039e12, 312e12},
      {"h100-80g", 80e9, 3.35e12, 989e12},
      {"h200-141g", 141e9, 4.8e12, 989e12},
      {"b200-192g", 180e9, 8.0e12, 2250e12},
  };
  return kGpus;
}

namespace {

std::string known_names() {
  std::string names;
  for (const GpuSpec& g : known_gpus()) names += g.name + ", ";
  return names + "custom:MEM_GB,BW_TBps,TFLOPS";
}

GpuSpec parse_custom(const std::string& text, const std::string& spec) {
  double values[3];
  size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t end = i < 2 ? spec.find(',', start) : spec.size();
    HYLA_CHECK(end != std::string::npos, "--gpu {}: expected custom:MEM_GB,BW_TBps,TFLOPS", text);
    const std::string field = spec.substr(start, end - start);
    char* parsed_end = nullptr;
    values[i] = std::strtod(field.c_str(), &parsed_end);
    HYLA_CHECK(
        !field.empty() && parsed_end == field.c_str() + field.size() && std::isfinite(values[i]) && values[i] > 0,
        "--gpu {}: '{}' is not a positive number (expected custom:MEM_GB,BW_TBps,TFLOPS)", text, field);
    start = end + 1;
  }
  return {text, values[0] * 1e9, values[1] * 1e12, values[2] * 1e12};
}

}  // namespace

GpuSpec parse_gpu(const std::string& text) {
  const std::string custom = "custom:";
  if (text.rfind(custom, 0) == 0) return parse_custom(text, text.substr(custom.size()));
  for (const GpuSpec& g : known_gpus())
    if (g.name == text) return g;
  fail("--gpu: unknown GPU '{}' (known: {})", text, known_names());
}

}  // namespace hyla
