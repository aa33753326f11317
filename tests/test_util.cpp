#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

namespace hyla::test {

std::vector<float> normal_floats(int64_t n, uint32_t seed, float stddev, float mean) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

double central_difference(const std::function<double()>& loss, double& x, double h) {
  const double x0 = x;
  x = x0 + h;
  const double plus = loss();
  x = x0 - h;
  const double minus = loss();
  x = x0;
  return (plus - minus) / (2.0 * h);
}

double expect_gradients(const std::string& what, const std::function<double()>& loss, std::vector<double>& x,
                      const std::function<double(int64_t)>& analytic, const std::vector<int64_t>& entries) {
  double worst = 0.0, scale = 0.0;
  for (int64_t i : entries) {
    const double fd = central_difference(loss, x[size_t(i)]);
    worst = std::max(worst, std::abs(fd - analytic(i)));
    scale = std::max(scale, std::abs(fd));
  }
  EXPECT_LE(worst, 5e-5 * scale + 1e-9) << what << ": worst error " << worst << " at gradient scale " << scale;
  return scale;
}

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
