#pragma once
// The point tables of ggml's IQ1/IQ2/IQ3 formats (ggml_iq_grids.cpp, generated from ggml-common.h
// by scripts/ggml-iq-grids.py). Entry i packs the 8 (uint64_t) or 4 (uint32_t) values of point i,
// one a byte, lowest byte first: unsigned magnitudes for IQ2/IQ3, int8 in {-1, 0, 1} for IQ1.
#include <cstdint>

namespace hyla::ggml_grids {

extern const uint64_t iq2xxs[256];
extern const uint64_t iq2xs[512];
extern const uint64_t iq2s[1024];
extern const uint32_t iq3xxs[256];
extern const uint32_t iq3s[512];
extern const uint64_t iq1s[2048];

}  // namespace hyla::ggml_grids
