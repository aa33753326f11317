#pragma once
// Whole-file reads, atomic writes and read-only memory maps, with errors that name the file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyla {

std::string read_file(const std::filesystem::path& path);

// Writes `path` atomically: bytes go to a temporary file beside it, which commit() fsyncs and
// renames over `path`. Destroyed without commit() (an error on the way), the temporary file is
// removed and `path` is untouched, so readers never see a half-written file.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Overwrites bytes already written at `offset` (a header patched once its counts are known).
  void write_at(uint64_t offset, const void* data, size_t bytes);
  void commit();

 private:
  std::filesystem::path path_, temp_;
  int fd_ = -1;
};

void write_file_atomic(const std::filesystem::path& path, std::string_view contents);

// Builds a directory next to `path` and swaps it in on commit(), replacing any directory already
// there; destroyed without commit(), the half-built directory is removed and `path` is untouched.
class AtomicDirectory {
 public:
  explicit AtomicDirectory(std::filesystem::path path);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;
  const std::filesystem::path& temp() const { return temp_; }  // write the contents here
  void commit();

 private:
  std::filesystem::path path_, temp_;
  bool committed_ = false;
};

// Checks, before a command starts, that its output directory may be replaced whole: it must be
// absent, empty, or an earlier output of the same command (it holds `marker`, e.g. "meta.json"), and
// must not hold any of `inputs` (files or directories the command reads). `force` (the command's
// --force) skips the check. Errors name the directory, the reason and the flag.
void check_replaceable_output(const std::filesystem::path& dir, std::string_view marker,
                              const std::vector<std::filesystem::path>& inputs, bool force);

// Fsyncs a directory so that a rename inside it survives a crash.
void sync_directory(const std::filesystem::path& dir);

// How a range of a mapping will be read (madvise).
enum class MapAdvice : uint8_t {
  WillNeed,  // soon: start reading it into the page cache now, many ranges at once (MADV_WILLNEED)
  Random,    // in pieces the reader asks for itself: a fault reads its page, not the kernel's read-around
             // window (MADV_RANDOM; a window of read_ahead_kb, often MBs, would read other tensors)
  Populate,  // used now: its pages mapped into this process in one call, read where the page cache
             // lacks them (MADV_POPULATE_READ; a page fault each otherwise, which on a kernel before
             // Linux 5.14, where the call fails, is what happens)
  Release,   // no longer used here: the whole pages inside the range leave this process's resident set
             // (MADV_DONTNEED; the page cache keeps them, and a later read faults them back)
};

// A read-only memory map of a whole file.
class MappedFile {
 public:
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }
  // Unmaps this process's pages of the file (they leave its resident set and stay in the page
  // cache; the next read maps them again): what a reader that copies out of the mapping does so
  // that the file does not count as its memory.
  void release_pages() const;
  // Tells the kernel how [begin, begin + bytes) of the mapping will be read.
  void advise(const uint8_t* begin, size_t bytes, MapAdvice advice) const;
  // release_pages(), and asks the kernel to drop the file from the page cache, so that the next
  // read comes from the disk (a cold-cache benchmark). Best effort: pages another process maps or
  // that are dirty stay.
  void drop_cached_pages() const;

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hyla
