#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <random>

namespace hyla::test {

Workspace& test_workspace() {
  static Workspace workspace;
  return workspace;
}

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("hyla-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

CommandResult run_hyla(const std::string& args) { return run_command(std::string(HYLA_BINARY) + " " + args); }

CommandResult run_command(const std::string& shell_command) {
  const std::string command = shell_command + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::filesystem::path source_dir() { return HYLA_SOURCE_DIR; }

std::filesystem::path build_dir() { return std::filesystem::path(HYLA_BINARY).parent_path(); }

}  // namespace hyla::test
