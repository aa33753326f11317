#include "hyla/io/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "hyla/core/error.h"

namespace hyla {
namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  HYLA_CHECK(in, "{}: cannot open: {}", path.string(), std::strerror(errno));
  HYLA_CHECK(!fs::is_directory(path), "{}: is a directory, expected a file", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  HYLA_CHECK(!in.bad(), "{}: read failed", path.string());
  return buffer.str();
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

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: some filesystems refuse directory fds
  ::fsync(fd);
  ::close(fd);
}

std::shared_ptr<const MappedFile> MappedFile::open(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HYLA_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path.string());
  }
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

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace hyla
