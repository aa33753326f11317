#pragma once
// Helpers shared by tests: temporary directories, raw file writing, running the hyla binary.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hyla/core/error.h"
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

// Expects `body` to throw a hyla::Error whose one-line message contains `part`.
template <typename Body>
void expect_error(Body&& body, const std::string& part) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(part), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

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

// n draws of N(mean, stddev²) from a fixed seed.
std::vector<float> normal_floats(int64_t n, uint32_t seed, float stddev = 1.0f, float mean = 0.0f);

// Central differences of loss() in `x` (a double the loss reads), step h.
double central_difference(const std::function<double()>& loss, double& x, double h = 1e-5);
// Analytic gradients (f32, from a kernel or layer) against central differences of a double
// reference loss at the given entries of x (h = 1e-5 in double: truncation and cancellation
// ~1e-10). The f32 arithmetic is the floor (measured ≤ 6e-6 of the largest gradient in these
// tests); 5e-5 leaves margin for other rounding orders and still fails a dropped term or a 10%
// error. Returns the largest |finite difference| (0: the entries tested nothing).
double expect_gradients(const std::string& what, const std::function<double()>& loss, std::vector<double>& x,
                      const std::function<double(int64_t)>& analytic, const std::vector<int64_t>& entries);

// One scratch Workspace for the test binary (layers keep a pointer to it between forward and backward).
Workspace& test_workspace();

}  // namespace hyla::test
