// The server under idle connections: TCP connections that are opened and never send a byte (no
// credentials or CPU needed) used to hold every HTTP thread for the read timeout. This opens
// --idle of them against an in-process server and times /health and a burst of --clients
// concurrent completions, against the same measurements with no idle connection in the same run.
//
//   build/bench_idle_connections [--model DIR] [--idle 1000] [--clients 16] [--tokens 16] [--max-connections N]
//                                [--endpoint completions|chat|messages|responses]
//
// --max-connections caps the server's threads (default: enough for every connection); a cap of 12,
// the old fixed pool for 4 slots, shows the starvation this guards against.
// Without --model it serves configs/nano.json, freshly initialised, with a BPE trained on
// docs/SPEC.md (the load is on the HTTP side; the model's quality does not matter).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "hyla/core/error.h"
#include "hyla/data/bpe_trainer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "hyla/model/model.h"
#include "hyla/serve/server.h"

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

fs::path make_model(const fs::path& dir) {
  const std::string spec = hyla::read_file(fs::path(HYLA_SOURCE_DIR) / "docs/SPEC.md");
  const std::string_view texts[] = {spec};
  hyla::BpeTrainOptions options;
  options.vocab_size = 512;
  const hyla::Tokenizer tokenizer(hyla::train_bpe(texts, options), "SPEC.md");
  tokenizer.save(dir / "tokenizer.json");
  nlohmann::json config = hyla::parse_json_file((fs::path(HYLA_SOURCE_DIR) / "configs/nano.json").string());
  config["vocab_size"] = 512;
  hyla::Model model(hyla::ModelConfig::from_json(config));
  model.initialize(1);
  model.save(dir / "model", hyla::DType::F32, dir / "tokenizer.json");
  return dir / "model";
}

int connect_idle(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  HYLA_CHECK(fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0,
             "cannot open an idle connection to port {}", port);
  return fd;
}

struct Figures {
  double first_health = 0, median_health = 0, burst = 0;
  int completed = 0;
};

// A generation request of `tokens` tokens on the API `endpoint` names: its path and body.
std::pair<std::string, nlohmann::json> generation_request(const std::string& endpoint, int tokens) {
  const nlohmann::json user = {{{"role", "user"}, {"content", "The model contract"}}};
  if (endpoint == "completions")
    return {"/v1/completions",
            {{"prompt", "The model contract"}, {"max_tokens", tokens}, {"temperature", 0}, {"ignore_eos", true}}};
  if (endpoint == "chat")
    return {"/v1/chat/completions", {{"messages", user}, {"max_tokens", tokens}, {"temperature", 0}, {"ignore_eos", true}}};
  if (endpoint == "messages") return {"/v1/messages", {{"messages", user}, {"max_tokens", tokens}, {"temperature", 0}}};
  if (endpoint == "responses")
    return {"/v1/responses", {{"input", "The model contract"}, {"max_output_tokens", tokens}, {"temperature", 0}}};
  hyla::fail("--endpoint {}: completions, chat, messages or responses", endpoint);
}

Figures measure(int port, int clients, int tokens, const std::string& endpoint) {
  Figures f;
  std::vector<double> health;
  for (int i = 0; i < 7; ++i) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(300, 0);
    const auto t0 = clock_type::now();
    auto res = c.Get("/health");
    HYLA_CHECK(res && res->status == 200, "/health failed: {}", res ? std::to_string(res->status) : httplib::to_string(res.error()));
    health.push_back(seconds_since(t0));
  }
  f.first_health = health.front();
  std::sort(health.begin(), health.end());
  f.median_health = health[health.size() / 2];
  std::vector<std::thread> threads;
  std::vector<int> ok(size_t(clients), 0);
  const auto t0 = clock_type::now();
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(300, 0);
      const auto [path, body] = generation_request(endpoint, tokens);
      auto res = c.Post(path, body.dump(), "application/json");
      ok[size_t(i)] = res && res->status == 200;
      if (!ok[size_t(i)] && i == 0)
        fmt::print(stderr, "{} failed: {}\n", path, res ? fmt::format("{} {}", res->status, res->body) : httplib::to_string(res.error()));
    });
  for (auto& t : threads) t.join();
  f.burst = seconds_since(t0);
  for (int v : ok) f.completed += v;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, endpoint = "completions";
  int idle = 1000, clients = 16, tokens = 16, max_connections = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") model_dir = value;
    else if (flag == "--idle") idle = std::stoi(value);
    else if (flag == "--clients") clients = std::stoi(value);
    else if (flag == "--tokens") tokens = std::stoi(value);
    else if (flag == "--max-connections") max_connections = std::stoi(value);
    else if (flag == "--endpoint") endpoint = value;
    else return fmt::print(stderr, "unknown flag {}\n", flag), 2;
  }
  try {
    hyla::raise_open_file_limit(2 * int64_t(idle) + 4 * clients + 256);  // both ends of each connection live here
    const fs::path scratch = fs::temp_directory_path() / fmt::format("hyla-bench-idle-{}", getpid());
    fs::create_directories(scratch);
    hyla::ServeOptions options;
    options.model_dir = model_dir.empty() ? make_model(scratch) : fs::path(model_dir);
    options.port = 0;
    options.max_connections = max_connections > 0 ? max_connections : idle + 4 * clients + 64;
    hyla::Server server(options);
    const int port = server.bind();
    std::thread http([&] { server.listen(); });
    struct StopOnExit {
      hyla::Server& server;
      std::thread& http;
      ~StopOnExit() {
        server.stop();
        http.join();
      }
    } stop_on_exit{server, http};
    server.load();

    generation_request(endpoint, tokens);  // a bad --endpoint fails before the measurement
    const Figures base = measure(port, clients, tokens, endpoint);
    std::vector<int> sockets;
    const auto t0 = clock_type::now();
    for (int i = 0; i < idle; ++i) sockets.push_back(connect_idle(port));
    const double opening = seconds_since(t0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server has accepted them all
    const Figures loaded = measure(port, clients, tokens, endpoint);
    for (int fd : sockets) close(fd);

    fmt::print("{} idle connections opened in {:.3f} s; {} clients × {} tokens per burst on {}\n\n", idle, opening,
               clients, tokens, generation_request(endpoint, tokens).first);
    fmt::print("| measurement | no idle connection | {} idle connections | ratio |\n|---|---:|---:|---:|\n", idle);
    const auto row = [](const char* name, double a, double b) {
      fmt::print("| {} | {:.4f} s | {:.4f} s | {:.2f}× |\n", name, a, b, b / a);
    };
    row("first /health", base.first_health, loaded.first_health);
    row("median /health (7)", base.median_health, loaded.median_health);
    row("burst wall time", base.burst, loaded.burst);
    fmt::print("| burst completed | {}/{} | {}/{} | |\n", base.completed, clients, loaded.completed, clients);
    fs::remove_all(scratch);
    return loaded.completed == clients && loaded.first_health < 1.0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
}
