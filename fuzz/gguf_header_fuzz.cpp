// libFuzzer target for the GGUF reader (io/gguf.h): any file must either open into tensors that lie
// inside it, with metadata whose every element can be read, or throw hyla::Error; never crash,
// hang, trip a sanitizer, or take more memory than the file's size. The input is written to a
// file because GGUF is read through a memory map.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "hyla/core/error.h"
#include "hyla/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/hyla-gguf-fuzz-" + std::to_string(getpid()) + ".gguf";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  } else {
    __builtin_trap();
  }
  try {
    const hyla::GgufFile g(path);
    for (const auto& [key, value] : g.metadata())
      if (value.type == hyla::GgufValueType::Array)
        for (uint64_t i = 0; i < value.array.size() && i < 64; ++i) (void)value.array.at(i);
    uint64_t touched = 0;
    for (const hyla::GgufTensor& t : g.tensors()) {
      if (t.bytes == 0) continue;
      const uint8_t* p = g.data(t);  // a tensor outside the mapping faults here
      touched += p[0] + p[t.bytes - 1];
    }
    if (touched == uint64_t(-1)) __builtin_trap();  // keeps the reads
  } catch (const hyla::Error&) {
  }
  return 0;
}
