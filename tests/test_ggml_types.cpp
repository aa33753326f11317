// ggml's block types: hyla's decoders against vectors ggml's own code produced
// (tests/data/ggml_quant_vectors.txt, from scripts/ggml-quant-vectors.sh), bit for bit; the block
// geometry against the sizes ggml's structs have. Two of the three blocks of each vector are random
// bytes (with finite values), so every field of a block takes many values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "hyla/io/ggml_types.h"
#include "test_util.h"

namespace hyla {
namespace {

struct Vector {
  int64_t values = 0;
  std::vector<uint8_t> blocks;
  std::vector<uint32_t> bits;
  uint64_t stress_seed = 0, stress_hash = 0;
  int64_t stress_blocks = 0;
};

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The committed vectors, by ggml type name (upper case).
const std::map<std::string, Vector>& vectors() {
  static const std::map<std::string, Vector> all = [] {
    std::ifstream in(test::source_dir() / "tests/data/ggml_quant_vectors.txt");
    EXPECT_TRUE(in.good());
    std::map<std::string, Vector> out;
    std::string line, word, name;
    while (std::getline(in, line)) {
      std::istringstream s(line);
      s >> word;
      if (word == "type") {
        s >> name;
        name = upper(name);
        s >> out[name].values;
      } else if (word == "blocks") {
        std::string hex;
        s >> hex;
        for (size_t i = 0; i + 1 < hex.size(); i += 2) out[name].blocks.push_back(uint8_t(std::stoul(hex.substr(i, 2), nullptr, 16)));
      } else if (word == "values") {
        while (s >> word) out[name].bits.push_back(uint32_t(std::stoul(word, nullptr, 16)));
      } else if (word == "stress") {
        s >> out[name].stress_seed >> out[name].stress_blocks >> word;
        out[name].stress_hash = std::stoull(word, nullptr, 16);
      }
    }
    return out;
  }();
  return all;
}

std::vector<uint32_t> decode_bits(GgmlType type, const std::vector<uint8_t>& blocks, int64_t n) {
  std::vector<float> y(size_t(n), -1.0f);
  ggml_to_f32(type, blocks.data(), y.data(), n);
  std::vector<uint32_t> bits(y.size());
  std::memcpy(bits.data(), y.data(), y.size() * 4);
  return bits;
}

TEST(GgmlTypes, EveryQuantisedTypeDecodesAsGgmlDoesBitForBit) {
  int checked = 0;
  for (GgmlType type : ggml_readable_types()) {
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) continue;
    const std::string name = ggml_type_name(uint32_t(type));
    SCOPED_TRACE(name);
    auto it = vectors().find(name);
    ASSERT_NE(it, vectors().end()) << "no committed vector for " << name;
    const Vector& v = it->second;
    ASSERT_EQ(v.blocks.size(), ggml_bytes(type, v.values));
    ASSERT_EQ(int64_t(v.bits.size()), v.values);
    const std::vector<uint32_t> got = decode_bits(type, v.blocks, v.values);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < v.values; ++i)
      if (got[size_t(i)] != v.bits[size_t(i)]) differ += 1, first = first < 0 ? i : first;
    EXPECT_EQ(differ, 0) << "first at value " << first;
    checked += 1;
  }
  EXPECT_EQ(checked, 22);
}

// scripts/ggml-quant-vectors.c's generator and hash, to draw the same random blocks.
struct XorShift {
  uint64_t state;
  uint64_t next() {
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return state * 0x2545f4914f6cdd1dull;
  }
};

TEST(GgmlTypes, ThousandsOfRandomBlocksDecodeAsGgmlDoes) {
  // Enough blocks that every grid point of the IQ types is drawn: a wrong row of a table, or a
  // wrong bit of an index, changes the hash.
  for (GgmlType type : ggml_readable_types()) {
    if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) continue;
    SCOPED_TRACE(ggml_type_name(uint32_t(type)));
    const Vector& v = vectors().at(ggml_type_name(uint32_t(type)));
    ASSERT_GT(v.stress_blocks, 0);
    const int64_t bv = ggml_block_values(type), bb = ggml_block_bytes(type);
    XorShift random{v.stress_seed};
    std::vector<uint8_t> block(static_cast<size_t>(bb));
    std::vector<float> y(static_cast<size_t>(bv));
    uint64_t hash = 0xcbf29ce484222325ull;
    for (int64_t b = 0; b < v.stress_blocks; ++b) {
      do {
        for (uint8_t& x : block) x = uint8_t(random.next());
        ggml_to_f32(type, block.data(), y.data(), bv);
      } while (!std::all_of(y.begin(), y.end(), [](float x) { return std::isfinite(x); }));
      const auto* bytes = reinterpret_cast<const uint8_t*>(y.data());
      for (size_t i = 0; i < y.size() * 4; ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
    }
    EXPECT_EQ(hash, v.stress_hash);
  }
}

TEST(GgmlTypes, BlockGeometryIsGgmls) {
  // sizeof(block_*) in ggml-common.h, and the values per block.
  const std::map<GgmlType, std::pair<int64_t, int64_t>> expected = {
      {GgmlType::Q4_0, {32, 18}},      {GgmlType::Q4_1, {32, 20}},     {GgmlType::Q5_0, {32, 22}},
      {GgmlType::Q5_1, {32, 24}},      {GgmlType::Q8_0, {32, 34}},     {GgmlType::MXFP4, {32, 17}},
      {GgmlType::IQ4_NL, {32, 18}},    {GgmlType::Q2_K, {256, 84}},    {GgmlType::Q3_K, {256, 110}},
      {GgmlType::Q4_K, {256, 144}},    {GgmlType::Q5_K, {256, 176}},   {GgmlType::Q6_K, {256, 210}},
      {GgmlType::IQ2_XXS, {256, 66}},  {GgmlType::IQ2_XS, {256, 74}},  {GgmlType::IQ2_S, {256, 82}},
      {GgmlType::IQ3_XXS, {256, 98}},  {GgmlType::IQ3_S, {256, 110}},  {GgmlType::IQ1_S, {256, 50}},
      {GgmlType::IQ1_M, {256, 56}},    {GgmlType::IQ4_XS, {256, 136}}, {GgmlType::TQ1_0, {256, 54}},
      {GgmlType::TQ2_0, {256, 66}},    {GgmlType::F32, {1, 4}},        {GgmlType::F16, {1, 2}},
      {GgmlType::BF16, {1, 2}}};
  EXPECT_EQ(expected.size(), ggml_readable_types().size());
  for (const auto& [type, geometry] : expected) {
    EXPECT_EQ(ggml_block_values(type), geometry.first) << ggml_type_name(uint32_t(type));
    EXPECT_EQ(ggml_block_bytes(type), geometry.second) << ggml_type_name(uint32_t(type));
  }
  EXPECT_FALSE(ggml_type_readable(15));  // Q8_K: an activation type, never in a file
  EXPECT_FALSE(ggml_type_readable(40));  // NVFP4
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(99), "type 99");
  test::expect_error([] { ggml_type_from_name("q4_k"); }, "'q4_k'");
}

}  // namespace
}  // namespace hyla
