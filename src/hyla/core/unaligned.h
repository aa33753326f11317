#pragma once
// A value read from bytes at any alignment: the packed fields of file formats, as stored
// (little-endian on every machine hyla builds for).
#include <cstring>

namespace hyla {

template <typename T>
T load_unaligned(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace hyla
