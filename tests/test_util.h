#pragma once
// Helpers shared by tests: temporary directories, raw file writing, running the hyla binary.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "hyla/core/workspace.h"

namespace hyla::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_bytes(const std::filesystem::path& path, const std::string& bytes);

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};
// Runs a shell command, capturing stdout and stderr together.
CommandResult run_command(const std::string& command);
// Runs `hyla <args>` (the binary built with the tests) through the shell.
CommandResult run_hyla(const std::string& args);

// The repository root (for configs/).
std::filesystem::path source_dir();
// The build directory (where the hyla binary is).
std::filesystem::path build_dir();

// One scratch Workspace for the test binary (layers keep a pointer to it between forward and backward).
Workspace& test_workspace();

}  // namespace hyla::test
