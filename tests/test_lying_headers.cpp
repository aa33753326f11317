// Issue 65: files whose headers lie (counts, sizes, lengths, dimensions the file does not hold) are
// refused by every loader within a second of CPU and without more memory than the file's size
// beyond what a small valid model costs, whatever they claim. Each class is one file here, run
// through `hyla inspect` in a child process whose CPU time and peak resident set wait4 reports.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "hyla/io/file.h"
#include "hyla/io/json_fields.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

namespace fs = std::filesystem;

struct Measured {
  int exit_code = -1;
  double cpu_seconds = 0;
  int64_t peak_bytes = 0;
  std::string output;
};

// `hyla ARGS` in a child process, its own CPU time and peak resident set.
Measured measure(const std::string& args, const fs::path& log) {
  const std::string command = "exec " + std::string(HYLA_BINARY) + " " + args + " >" + log.string() + " 2>&1";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  Measured m;
  int status = 0;
  rusage usage{};
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid) return m;
  m.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  m.cpu_seconds = double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                  1e-6 * double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  m.peak_bytes = int64_t(usage.ru_maxrss) * 1024;
  m.output = read_file(log.string());
  return m;
}

template <typename T>
void poke(std::string& bytes, size_t at, T value) {
  ASSERT_LE(at + sizeof value, bytes.size());
  std::memcpy(bytes.data() + at, &value, sizeof value);
}

// The offset of the value after GGUF key or tensor name `name` (its u64 length and bytes).
size_t after_name(const std::string& bytes, const std::string& name) {
  std::string field(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(field.data(), &n, 8);
  field += name;
  const size_t at = bytes.find(field);
  EXPECT_NE(at, std::string::npos) << name;
  return at == std::string::npos ? 0 : at + field.size();
}

// A safetensors file of the header `header` (JSON) and `data`.
std::string safetensors_file(const nlohmann::json& header, const std::string& data) {
  const std::string text = header.dump();
  std::string f(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(f.data(), &n, 8);
  return f + text + data;
}

struct Lie {
  std::string name, path, rule;
};

TEST(LyingHeaders, AreRefusedWithinASecondAndTheFilesSize) {
  test::TempDir dir;
  const std::string tiny = (test::source_dir() / "configs/kimi-linear-tiny.json").string();
  const fs::path gguf = dir / "valid.gguf", model = dir / "valid";
  ASSERT_EQ(test::run_hyla("init --config " + tiny + " --out " + gguf.string()).exit_code, 0);
  ASSERT_EQ(test::run_hyla("init --config " + tiny + " --out " + model.string()).exit_code, 0);
  const std::string good = read_file(gguf.string());
  std::vector<Lie> lies;
  const auto gguf_lie = [&](const std::string& name, const std::string& rule, const auto& edit) {
    std::string bytes = good;
    edit(bytes);
    const fs::path path = dir / (std::to_string(lies.size()) + ".gguf");
    test::write_bytes(path, bytes);
    lies.push_back({name, path.string(), rule});
  };
  gguf_lie("GGUF tensor count 2^60", "more than the file can hold", [](std::string& b) { poke(b, 8, uint64_t(1) << 60); });
  gguf_lie("GGUF metadata count 2^60", "more than the file can hold", [](std::string& b) { poke(b, 16, uint64_t(1) << 60); });
  gguf_lie("GGUF key length 2^60", "truncated", [](std::string& b) { poke(b, 24, uint64_t(1) << 60); });
  gguf_lie("GGUF tensor of 2^64 bytes (the size wraps)", "token_embd.weight",
           [](std::string& b) { poke(b, after_name(b, "token_embd.weight") + 4 + 8, uint64_t(1) << 62); });
  gguf_lie("GGUF tensor with 2^31 dimensions", "token_embd.weight",
           [](std::string& b) { poke(b, after_name(b, "token_embd.weight"), uint32_t(1) << 31); });
  gguf_lie("GGUF tensor's offset past the file", "token_embd.weight", [](std::string& b) {
    const size_t at = after_name(b, "token_embd.weight");
    uint32_t dims = 0;
    std::memcpy(&dims, b.data() + at, 4);
    poke(b, at + 4 + 8 * dims + 4, uint64_t(1) << 62);
  });
  for (const auto& [key, rule] : {std::pair{"kimi-linear.block_count", "block_count"},
                                  {"kimi-linear.expert_count", "expert_count is 1073741824 but blk.1.ffn_gate_inp.weight"},
                                  {"kimi-linear.attention.head_count", "blk.0.attn_q.weight"},
                                  {"kimi-linear.embedding_length", "token_embd.weight"}})
    gguf_lie(std::string("GGUF ") + key + " 2^30", rule,
             [key = std::string(key)](std::string& b) { poke(b, after_name(b, key) + 4, uint32_t(1) << 30); });
  // A string array (the GGUF vocabulary's shape) claiming 2^60 strings.
  gguf_lie("GGUF array of 2^60 strings", "truncated", [](std::string& b) {
    const std::string key = "general.name";
    const size_t at = after_name(b, key);
    poke(b, at, uint32_t(9));      // array
    poke(b, at + 4, uint32_t(8));  // of strings
    poke(b, at + 8, uint64_t(1) << 60);
  });

  const auto dir_lie = [&](const std::string& name, const std::string& rule, const auto& edit) {
    const fs::path path = dir / std::to_string(lies.size());
    fs::copy(model, path, fs::copy_options::recursive);
    edit(path);
    lies.push_back({name, path.string(), rule});
  };
  const auto edit_config = [](const fs::path& path, const auto& edit) {
    nlohmann::json config = parse_json_file((path / "config.json").string());
    edit(config);
    test::write_bytes(path / "config.json", config.dump());
  };
  dir_lie("config num_hidden_layers 100000", "100000", [&](const fs::path& p) {
    edit_config(p, [](nlohmann::json& c) {
      c["num_hidden_layers"] = 100000;
      nlohmann::json types = nlohmann::json::array();
      for (int i = 0; i < 100000; ++i) types.push_back(c["layer_types"][i % c["layer_types"].size()]);
      c["layer_types"] = types;
    });
  });
  for (const auto& [key, value] : {std::pair{"hidden_size", int64_t(1) << 30}, {"vocab_size", int64_t(1) << 30}})
    dir_lie(std::string("config ") + key + " 2^30", "but config.json needs", [&](const fs::path& p) {
      edit_config(p, [&](nlohmann::json& c) { c[key] = value; });
    });
  dir_lie("config num_experts 2^30", "moe.num_experts is 1073741824 but layer 1 holds no expert", [&](const fs::path& p) {
    // As hyla's own architecture: kimi_linear's rules would refuse 2^30 experts before the tensors do.
    edit_config(p, [](nlohmann::json& c) { c["moe"]["num_experts"] = int64_t(1) << 30, c["architecture"] = "hyla"; });
  });
  // The released Kimi Linear 48B config beside a file of a few bytes.
  dir_lie("Kimi Linear 48B config.json over one tiny tensor", "num_hidden_layers is 27", [&](const fs::path& p) {
    fs::copy_file(test::source_dir() / "tests/data/kimi-linear-48b-a3b-hf-config.json", p / "config.json",
                  fs::copy_options::overwrite_existing);
    test::write_bytes(p / "model.safetensors",
                      safetensors_file({{"lm_head.weight", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}},
                                       std::string(4, '\0')));
  });
  // Tokenizers naming one id in the millions: its tables, not the file, would set the cost.
  dir_lie("tokenizer.json with an added token id of 2^24 - 1", "ids below it unassigned", [](const fs::path& p) {
    nlohmann::json t = test::small_tokenizer().to_json();
    t["added_tokens"][0]["id"] = (1 << 24) - 1;
    test::write_bytes(p / "tokenizer.json", t.dump());
  });
  dir_lie("Kimi tokenizer_config.json naming id 2^24 - 1", "ids below it unassigned", [](const fs::path& p) {
    fs::copy_file(test::source_dir() / "tests/data/kimi-pretokenizer/tiktoken.model", p / "tiktoken.model");
    test::write_bytes(p / "tokenizer_config.json",
                      nlohmann::json{{"added_tokens_decoder",
                                      {{std::to_string((1 << 24) - 1), {{"content", "<|x|>"}, {"special", true}}}}}}
                          .dump());
  });
  dir_lie("safetensors header length 2^60", "model.safetensors", [](const fs::path& p) {
    std::string b = read_file((p / "model.safetensors").string());
    poke(b, 0, uint64_t(1) << 60);
    test::write_bytes(p / "model.safetensors", b);
  });
  dir_lie("safetensors shape of 2^64 bytes (the size wraps)", "model.embed_tokens.weight", [](const fs::path& p) {
    const std::string b = read_file((p / "model.safetensors").string());
    uint64_t n = 0;
    std::memcpy(&n, b.data(), 8);
    nlohmann::json header = nlohmann::json::parse(b.substr(8, n));
    header["model.embed_tokens.weight"]["shape"] = {uint64_t(1) << 62, 4};
    test::write_bytes(p / "model.safetensors", safetensors_file(header, b.substr(8 + n)));
  });

  // What inspecting a small valid model costs: the lies may add their file's size, no more.
  const Measured base = measure("inspect " + model.string(), dir / "base.log");
  ASSERT_EQ(base.exit_code, 0) << base.output;
  for (const Lie& lie : lies) {
    const Measured m = measure("inspect " + lie.path, dir / "lie.log");
    int64_t file_bytes = fs::is_directory(lie.path) ? 0 : int64_t(fs::file_size(lie.path));
    if (fs::is_directory(lie.path))
      for (const auto& entry : fs::directory_iterator(lie.path)) file_bytes += int64_t(entry.file_size());
    EXPECT_NE(m.exit_code, 0) << lie.name << ": " << m.output;
    EXPECT_NE(m.output.find("error: "), std::string::npos) << lie.name << ": " << m.output;
    EXPECT_NE(m.output.find(lie.rule), std::string::npos) << lie.name << ": " << m.output;
    for (const char* leak : {"std::", "bad_alloc", "map::at", "_M_range_check", "basic_string"})
      EXPECT_EQ(m.output.find(leak), std::string::npos) << lie.name << ": " << m.output;
    EXPECT_LT(m.cpu_seconds, 1.0) << lie.name;
    EXPECT_LE(m.peak_bytes, base.peak_bytes + file_bytes + (int64_t(4) << 20))
        << lie.name << ": peak " << m.peak_bytes << " bytes, valid model " << base.peak_bytes << ", file " << file_bytes;
  }
}

}  // namespace
}  // namespace hyla
