#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "hyla/core/error.h"
#include "hyla/core/threads.h"
#include "hyla/dist/processes.h"

namespace {

constexpr const char* kThreadsHelp =
    "Threads (default: $HYLA_THREADS, else the physical cores this process may use, fewer while other processes keep cores busy)";

void set_thread_count(int n) { hyla::set_thread_config(hyla::thread_config_for(n)); }

constexpr const char* kExchangeTimeoutHelp =
    "Under mpirun, inference: a process that answers nothing for this many seconds ends the job, named (0: wait "
    "forever)";

// `-t/--threads` and `--exchange-timeout` on every subcommand too (`hyla generate -t 1 …`, as
// llama.cpp users type it), unless a subcommand gives a flag its own meaning (`bench` takes a
// list of thread counts).
void add_global_options_everywhere(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const bool has_t = sub->get_option_no_throw("-t") != nullptr;
    if (sub->get_option_no_throw("--threads") == nullptr)
      sub->add_option_function<int>(has_t ? "--threads" : "-t,--threads", set_thread_count,
                                    kThreadsHelp);
    sub->add_option_function<double>("--exchange-timeout", hyla::set_exchange_timeout, kExchangeTimeoutHelp);
    add_global_options_everywhere(*sub);
  }
}

// llama.cpp's multi-letter short flags, which CLI11 cannot declare, as hyla's long names. Only
// a whole argument is rewritten, and only after the subcommand that has the flag.
std::vector<std::string> with_llama_cpp_spellings(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  const auto serve = std::find(args.begin(), args.end(), "serve");
  for (auto it = serve; it != args.end(); ++it)
    if (*it == "-np") *it = "--parallel";
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered stdout: long runs (training logs, streamed text) show each line as it is
  // printed even when the output goes to a file or a pipe.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"hyla: train, serve and evaluate hybrid linear-attention MoE language models"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // --help shows every option's default
  app.add_option_function<int>("-t,--threads", set_thread_count, kThreadsHelp);
  app.add_option_function<double>("--exchange-timeout", hyla::set_exchange_timeout, kExchangeTimeoutHelp);
  hyla::cli::add_version(app);
  hyla::cli::add_inspect(app);
  hyla::cli::add_init(app);
  hyla::cli::add_plan(app);
  hyla::cli::add_bench(app);
  hyla::cli::add_logits(app);
  hyla::cli::add_train(app);
  hyla::cli::add_report(app);
  hyla::cli::add_generate(app);
  hyla::cli::add_chat(app);
  hyla::cli::add_agent(app);
  hyla::cli::add_rl(app);
  hyla::cli::add_serve(app);
  hyla::cli::add_tokenizer(app);
  hyla::cli::add_data(app);
  hyla::cli::add_quantize(app);
  hyla::cli::add_convert(app);
  hyla::cli::add_eval(app);
  add_global_options_everywhere(app);
  // Under mpirun an error on one process ends every process of the job (none waits forever for
  // it in a collective), and says which process failed.
  auto fail_with = [](int code, const std::string& message) {
    const hyla::Collective& world = hyla::processes();
    const std::string who = world.size() > 1 ? fmt::format(" (process {} of {})", world.rank(), world.size()) : "";
    fmt::print(stderr, "error{}: {}\n", who, message);
    std::fflush(stderr);
    hyla::abort_processes(code);
    return code;
  };
  try {
    hyla::set_thread_config(hyla::thread_config_for(0));
    hyla::start_processes();
    std::vector<std::string> args = with_llama_cpp_spellings(argc, argv);
    std::vector<char*> pointers;
    for (std::string& arg : args) pointers.push_back(arg.data());
    app.parse(int(pointers.size()), pointers.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      hyla::stop_processes();
      return app.exit(e);
    }
    // Bad flags follow the CLI's convention for every user error: one line, exit status 1.
    return fail_with(1, e.what());
  } catch (const hyla::Error& e) {
    return fail_with(1, e.what());
  } catch (const std::exception& e) {  // a bug, or the system's own (bad_alloc, filesystem_error): said in words
    return fail_with(dynamic_cast<const std::logic_error*>(&e) ? 2 : 1, hyla::describe_exception(e));
  }
  hyla::stop_processes();
  return 0;
}
