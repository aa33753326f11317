#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "commands.h"
#include "hyla/core/threads.h"
#include "hyla/kernels/backend.h"

namespace hyla::cli {

void add_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the hyla version and build details");
  cmd->callback([] {
    const dnnl_version_t* v = dnnl_version();
    fmt::print("hyla {}\nkernels {}\noneDNN {}.{}.{}\nthreads {} (physical cores {})\n", HYLA_VERSION,
               kernel_backend_name(), v->major, v->minor, v->patch, num_threads(), physical_cores());
  });
}

}  // namespace hyla::cli
