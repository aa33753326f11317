#include "hyla/io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "hyla/core/error.h"

namespace hyla {
namespace fs = std::filesystem;

namespace {

// Opens `path` for reading only if it is a regular file. O_NONBLOCK keeps a FIFO (or a device)
// from blocking the open until a writer appears; it has no effect on regular files.
int open_regular_file(const fs::path& path, struct stat& st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  HYLA_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const bool directory = S_ISDIR(st.st_mode);
    ::close(fd);
    fail("{}: {}, expected a regular file", path.string(), directory ? "is a directory" : "not a regular file");
  }
  return fd;
}

}  // namespace

std::string read_file(const fs::path& path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  std::string contents(size_t(st.st_size), '\0');
  size_t done = 0;
  for (;;) {
    if (done == contents.size()) contents.resize(done + 65536);  // the file grew since fstat
    const ssize_t n = ::read(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      HYLA_CHECK(n == 0, "{}: read failed: {}", path.string(), std::strerror(err));
      break;
    }
    done += size_t(n);
  }
  contents.resize(done);
  return contents;
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
  std::random_device rd;
  temp_ = path_;
  temp_ += ".tmp-" + std::to_string(rd()) + std::to_string(::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  HYLA_CHECK(fd_ >= 0, "{}: cannot create: {}", temp_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  HYLA_ASSERT(fd_ >= 0);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min(bytes, size_t(1) << 30));
    if (n < 0 && errno == EINTR) continue;
    HYLA_CHECK(n > 0, "{}: write failed: {}", temp_.string(), std::strerror(errno));
    p += n;
    bytes -= size_t(n);
  }
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  HYLA_ASSERT(fd_ >= 0);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    HYLA_CHECK(n > 0, "{}: write failed: {}", temp_.string(), std::strerror(errno));
    p += n;
    offset += uint64_t(n);
    bytes -= size_t(n);
  }
}

void AtomicFile::commit() {
  HYLA_ASSERT(fd_ >= 0);
  HYLA_CHECK(::fsync(fd_) == 0, "{}: fsync failed: {}", temp_.string(), std::strerror(errno));
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0 || ::rename(temp_.c_str(), path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temp_.c_str());
    fail("{}: cannot write: {}", path_.string(), reason);
  }
  sync_directory(path_.has_parent_path() ? path_.parent_path() : fs::path("."));
}

void write_file_atomic(const fs::path& path, std::string_view contents) {
  AtomicFile file(path);
  file.write(contents);
  file.commit();
}

namespace {
fs::path sibling(const fs::path& path, const std::string& tag) {
  std::random_device rd;
  fs::path p = path;
  if (!p.has_filename()) p = p.parent_path();
  p += "." + tag + "-" + std::to_string(rd()) + std::to_string(::getpid());
  return p;
}
}  // namespace

AtomicDirectory::AtomicDirectory(fs::path path) : path_(std::move(path)), temp_(sibling(path_, "tmp")) {
  if (!path_.has_filename()) path_ = path_.parent_path();
  std::error_code ec;
  fs::create_directories(temp_, ec);
  HYLA_CHECK(!ec, "{}: cannot create directory: {}", temp_.string(), ec.message());
}

AtomicDirectory::~AtomicDirectory() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
}

void AtomicDirectory::commit() {
  std::error_code ec;
  const fs::path old = sibling(path_, "old");
  const bool replacing = fs::exists(path_);
  if (replacing) {
    fs::rename(path_, old, ec);
    HYLA_CHECK(!ec, "{}: cannot move the old directory aside: {}", path_.string(), ec.message());
  }
  fs::rename(temp_, path_, ec);
  if (ec) {
    if (replacing) fs::rename(old, path_);
    fail("{}: cannot rename {} into place: {}", path_.string(), temp_.string(), ec.message());
  }
  committed_ = true;
  sync_directory(path_.has_parent_path() ? path_.parent_path() : fs::path("."));
  if (replacing) fs::remove_all(old, ec);
}

void check_replaceable_output(const fs::path& dir, std::string_view marker, const std::vector<fs::path>& inputs,
                              bool force) {
  std::error_code ec;
  if (force || !fs::exists(dir, ec)) return;
  HYLA_CHECK(fs::is_directory(dir, ec), "{}: exists and is not a directory", dir.string());
  fs::path out = fs::weakly_canonical(dir, ec);
  if (!out.has_filename()) out = out.parent_path();  // "data/" names the directory "data"
  for (const fs::path& input : inputs) {
    const fs::path in = fs::weakly_canonical(input, ec);
    const auto [o, i] = std::mismatch(out.begin(), out.end(), in.begin(), in.end());
    HYLA_CHECK(o != out.end(), "{}: holds the input {}, which replacing the directory would delete; choose another "
               "--out (or pass --force)", dir.string(), input.string());
  }
  if (fs::is_empty(dir, ec) || fs::exists(dir / marker, ec)) return;
  fail("{}: exists and is not an earlier output of this command (it has no {}); choose another --out, or pass "
       "--force to replace it with everything in it", dir.string(), marker);
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

std::shared_ptr<const MappedFile> MappedFile::open(const fs::path& path) {
  struct stat st {};
  const int fd = open_regular_file(path, st);
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size_t(st.st_size);
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    HYLA_CHECK(p != MAP_FAILED, "{}: mmap failed: {}", path.string(), std::strerror(err));
    file->data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return file;
}

void MappedFile::release_pages() const {
  if (data_) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED);
}

void MappedFile::advise(const uint8_t* begin, size_t bytes, MapAdvice advice) const {
  HYLA_ASSERT(begin >= data_ && begin + bytes <= data_ + size_);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  if (advice == MapAdvice::Release) {  // whole pages only: a neighbour's bytes may share the edge pages
    const uintptr_t first = (uintptr_t(begin) + page - 1) / page * page, end = (uintptr_t(begin) + bytes) / page * page;
    if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
    return;
  }
  const uintptr_t first = uintptr_t(begin) / page * page;
  const int native = advice == MapAdvice::WillNeed ? MADV_WILLNEED : advice == MapAdvice::Random ? MADV_RANDOM : MADV_POPULATE_READ;
  ::madvise(reinterpret_cast<void*>(first), uintptr_t(begin) + bytes - first, native);
}

void MappedFile::drop_cached_pages() const {
  if (!data_) return;
  release_pages();
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace hyla
