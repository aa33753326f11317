#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <map>

#include "hyla/data/model_tokenizer.h"
#include "hyla/data/tokenizer.h"
#include "hyla/io/safetensors.h"
#include "hyla/kernels/backend.h"
#include "hyla/model/model_files.h"
#include "hyla/model/model.h"
#include "model_test_util.h"
#include "test_util.h"
#include "text_fixtures.h"

namespace hyla {
namespace {

using test::run_hyla;

// small_tokenizer with added tokens up to more ids than a `vocab`-sized model has.
Tokenizer oversized_tokenizer(int64_t vocab) {
  TokenizerSpec spec = test::small_tokenizer().spec();
  for (int64_t id = test::small_tokenizer().vocab_size(); id <= vocab; ++id)
    spec.added_tokens.push_back({int32_t(id), fmt::format("<|extra_{}|>", id)});
  return Tokenizer(std::move(spec), "oversized");
}

TEST(Cli, HelpListsSubcommands) {
  const auto r = run_hyla("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd : {"version", "inspect", "init", "tokenizer", "data"}) EXPECT_NE(r.output.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(run_hyla("inspect --help").exit_code, 0);
  EXPECT_NE(run_hyla("no-such-command").exit_code, 0);
}

// The binary reports the kernel backend it was linked with, instruction set included.
TEST(Cli, VersionNamesTheKernelBackend) {
  const auto r = run_hyla("version");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find(std::string("\nkernels ") + kernel_backend_name() + "\n"), std::string::npos) << r.output;
}

TEST(Cli, InitThenInspectRoundTrips) {
  test::TempDir dir;
  const std::string config = (test::source_dir() / "configs/nano.json").string();
  const auto out = (dir / "nano").string();
  auto r = run_hyla("init --config " + config + " --out " + out + " --seed 3 --weight-dtype bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_hyla("inspect " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.layers.1.self_attn.kv_b_proj.weight"), std::string::npos);
  EXPECT_NE(r.output.find("ok: weights match config.json"), std::string::npos);
  EXPECT_NE(r.output.find("BF16"), std::string::npos);

  // The same seed writes the same weights; another seed does not.
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "2 --seed 3 --weight-dtype bf16").exit_code, 0);
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "3 --seed 4 --weight-dtype bf16").exit_code, 0);
  const std::string a = read_file(out + "/model.safetensors"), b = read_file(out + "2/model.safetensors"),
                    c = read_file(out + "3/model.safetensors");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // A tokenizer given to init lands as tokenizer.json, whatever its file was called.
  test::small_tokenizer().save(dir / "my-tok.json");
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + "4 --tokenizer " + (dir / "my-tok.json").string()).exit_code, 0);
  EXPECT_EQ(Tokenizer::load(out + "4/tokenizer.json").vocab_size(), test::small_tokenizer().vocab_size());
}

// Decode rows of `bench --model` carry the roofline: the re-read and routed bytes with the rates
// and memory tiers a plain read of them measured, and the token
// mixers' FLOPs at the run's mean position, which grow with depth for latent attention (each cached
// row) but not past a sliding window. nano: KDA, MLA, KDA, SWA (window 8); 2 heads each, KDA head
// 16, latent rank 32 + rope 8.
TEST(Cli, BenchBoundsDecodeByBytesAndTheMixersFlops) {
  test::TempDir dir;
  const auto model = (dir / "nano").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + model).exit_code, 0);
  const auto r = run_hyla("bench -m " + model + " -p 4 -n 4 -d 0,64 -t 1 -r 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = nlohmann::json::parse(r.output.substr(r.output.find("[\n  {")));
  std::map<std::string, nlohmann::json> by_test;
  for (const auto& row : rows) by_test[row["test"].get<std::string>()] = row;
  ASSERT_TRUE(by_test.count("tg4") && by_test.count("tg4 @ d64")) << r.output;
  const double kda = 2 * 7.0 * 2 * 16 * 16, per_row = 2 * 2.0 * (2 * 32 + 8);
  // Mean positions 2 and 66: rows 3 and 67, the window's 3 and 8.
  EXPECT_DOUBLE_EQ(by_test["tg4"]["mixer_flops"].get<double>(), kda + (3 + 3) * per_row);
  EXPECT_DOUBLE_EQ(by_test["tg4 @ d64"]["mixer_flops"].get<double>(), kda + (67 + 8) * per_row);
  for (const auto& [test, row] : by_test) {
    if (test.rfind("tg", 0) != 0) continue;
    EXPECT_GT(row["gemm_peak_gflops"].get<double>(), 0.0);
    EXPECT_GT(row["roofline_tokens_per_s"].get<double>(), 0.0);
    EXPECT_TRUE(row.contains("mixers_flop_bound"));
    EXPECT_GT(row["reread_bytes"].get<double>(), 0.0);
    EXPECT_GT(row["routed_bytes"].get<double>(), 0.0);  // nano's layers after the first are MoE
    EXPECT_GT(row["reread_gbs"].get<double>(), 0.0);
    for (const char* tier : {"reread_tier", "routed_tier"})
      EXPECT_TRUE(row[tier] == "LLC" || row[tier] == "DRAM") << row.dump();
  }
  // A depth that leaves no room for the tests' tokens fails before any prefill, naming the limit.
  const int64_t max_positions = model_config_of(model + "/config.json").max_position_embeddings;
  const auto deep = run_hyla("bench -m " + model + " -p 1 -n 4 -d " + std::to_string(max_positions - 2) + " -r 1");
  EXPECT_EQ(deep.exit_code, 1) << deep.output;
  EXPECT_NE(deep.output.find("reach past the model's max_position_embeddings (" + std::to_string(max_positions) + ")"),
            std::string::npos) << deep.output;
}

// --dtype is the matmul input dtype wherever it is taken; the weight dtype of init and quantize is
// --weight-dtype, and their old --dtype fails naming it.
TEST(Cli, WeightDtypeIsNotDtype) {
  test::TempDir dir;
  const std::string config = (test::source_dir() / "configs/nano.json").string();
  for (const std::string& args : {"init --config " + config + " --out " + (dir / "a").string() + " --dtype bf16",
                                  "quantize --model " + (dir / "a").string() + " --out " + (dir / "b").string() +
                                      " --dtype int8"}) {
    const auto r = run_hyla(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.output.find("renamed --weight-dtype"), std::string::npos) << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "a"));
  EXPECT_EQ(run_hyla("init --help").output.find("--dtype"), std::string::npos);
}

TEST(Cli, InspectFailsWithOneLineErrors) {
  test::TempDir dir;
  const auto out = (dir / "m").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + out).exit_code, 0);
  // Truncate the weights: one line, naming the file.
  std::string bytes = read_file(out + "/model.safetensors");
  test::write_bytes(out + "/model.safetensors", bytes.substr(0, bytes.size() - 10));
  auto r = run_hyla("inspect " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.safetensors: truncated"), std::string::npos) << r.output;
  // A config that does not match the weights.
  test::write_bytes(out + "/model.safetensors", bytes);
  std::string config = read_file(out + "/config.json");
  config.replace(config.find("\"hidden_size\": 64"), 17, "\"hidden_size\": 32");
  test::write_bytes(out + "/config.json", config);
  r = run_hyla("inspect " + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("but config.json needs"), std::string::npos) << r.output;
  r = run_hyla("inspect " + (dir / "missing").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing: no such file or directory"), std::string::npos) << r.output;
}

TEST(Cli, InspectReadsTheTokenizerAndRefusesNonFiniteWeights) {
  test::TempDir dir;
  test::write_bytes(dir / "config.json", test::nano_config([](nlohmann::json& j) { j["vocab_size"] = 512; }).to_json().dump());
  const std::string config = (dir / "config.json").string();
  test::small_tokenizer().save(dir / "tok.json");
  const auto out = (dir / "m").string();
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + out + " --tokenizer " + (dir / "tok.json").string()).exit_code, 0);
  auto r = run_hyla("inspect " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer: "), std::string::npos) << r.output;
  test::write_bytes(out + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": 7}})");
  r = run_hyla("inspect " + out);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tokenizer.json"), std::string::npos) << r.output;
  // A tokenizer with more ids than the model's vocabulary: every command that tokenizes refuses it.
  oversized_tokenizer(512).save(out + "/tokenizer.json");
  for (const std::string& command : {"inspect " + out, "generate -p hi -n 2 -m " + out,
                                    "logits --text hi --out " + (dir / "t.st").string() + " -m " + out}) {
    r = run_hyla(command);
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.output.find("more than the model's vocab_size 512"), std::string::npos) << command << r.output;
  }

  Model model(test::nano_config());
  model.initialize(1);
  model.params().values()[5] = NAN;
  model.params().values()[6] = INFINITY;
  model.save(dir / "nan", DType::F32);
  r = run_hyla("inspect " + (dir / "nan").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("invalid weights (1 tensors)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds nan at index 5; weights must be finite"), std::string::npos) << r.output;
  // Every command that reads the weights refuses them alike; convert writes nothing.
  for (const std::string& command : {"logits --tokens [1,2,3] --out " + (dir / "l.st").string() + " -m ",
                                    "convert --to gguf --out " + (dir / "nan.gguf").string() + " -m "}) {
    r = run_hyla(command + (dir / "nan").string());
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.output.find("holds nan at index 5; weights must be finite"), std::string::npos) << command << r.output;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "nan.gguf"));
  EXPECT_FALSE(std::filesystem::exists(dir / "l.st"));
}

TEST(Cli, LoadersRefuseFifosDeepNestingAndDuplicateKeysWithoutHanging) {
  test::TempDir dir;
  const auto out = (dir / "m").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/nano.json").string() + " --out " + out).exit_code, 0);
  const std::string config = read_file(out + "/config.json");
  // A FIFO would block open() until a writer came: `timeout` turns a hang into exit 124.
  std::filesystem::remove(out + "/config.json");
  ASSERT_EQ(mkfifo((out + "/config.json").c_str(), 0644), 0);
  auto r = test::run_command("timeout 20 " + std::string(HYLA_BINARY) + " inspect " + out);
  EXPECT_NE(r.exit_code, 124) << "inspect hung on a FIFO";
  EXPECT_NE(r.output.find("config.json: not a regular file"), std::string::npos) << r.output;
  std::filesystem::remove(out + "/config.json");
  test::write_bytes(out + "/config.json", "{\"x\": " + std::string(200000, '[') + std::string(200000, ']') + "}");
  r = run_hyla("inspect " + out);
  EXPECT_NE(r.output.find("nested deeper than"), std::string::npos) << r.output.substr(0, 500);
  test::write_bytes(out + "/config.json", "{\"hidden_size\": 64, " + config.substr(config.find('{') + 1));
  r = run_hyla("inspect " + out);
  EXPECT_NE(r.output.find("duplicate key 'hidden_size'"), std::string::npos) << r.output;
}

TEST(Cli, OutputDirectoriesAreReplacedOnlyWhenTheyAreTheCommandsOwn) {
  test::TempDir dir;
  const std::string config = (test::source_dir() / "configs/nano.json").string();
  const auto foreign = dir / "notes";
  std::filesystem::create_directories(foreign);
  test::write_bytes(foreign / "thesis.tex", "years of work");
  auto r = run_hyla("init --config " + config + " --out " + foreign.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is not an earlier output of this command (it has no config.json)"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(foreign / "thesis.tex"));
  // A model directory is init's own output: replaced; --force replaces anything.
  const auto model = (dir / "model").string();
  ASSERT_EQ(run_hyla("init --config " + config + " --out " + model).exit_code, 0);
  EXPECT_EQ(run_hyla("init --config " + config + " --out " + model + " --seed 2").exit_code, 0);
  // quantize into its own input, and data prepare into the directory of its input, would delete them.
  r = run_hyla("quantize --model " + model + " --out " + model);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds the input"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(model + "/model.safetensors"));
  std::filesystem::create_directories(dir / "data");
  test::small_tokenizer().save(dir / "data/tok.json");
  test::write_bytes(dir / "data/text.txt", test::sample_text(20, 1));
  r = run_hyla("data prepare --tokenizer " + (dir / "data/tok.json").string() + " --input " +
               (dir / "data/text.txt").string() + " --out " + (dir / "data").string() + "/");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("holds the input"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir / "data/text.txt"));
  EXPECT_EQ(run_hyla("init --config " + config + " --out " + foreign.string() + " --force").exit_code, 0);
  EXPECT_FALSE(std::filesystem::exists(foreign / "thesis.tex"));
}

TEST(Cli, BadThreadCountIsAnError) {
  const auto r = run_hyla("--threads 0 version");
  EXPECT_EQ(r.exit_code, 0);  // 0 = default
  EXPECT_NE(run_hyla("--threads abc version").exit_code, 0);
}

// The flags llama.cpp users type: -m, -p, -f (prompt from a file), the prompt on stdin, -c, and
// -t after the subcommand; all give the same text as hyla's own names.
TEST(Cli, GenerateTakesTheEcosystemsFlagsAndPromptSources) {
  test::TempDir dir;
  const std::string model = (dir / "nano").string();
  Model nano(test::nano_config([](nlohmann::json& j) { j["vocab_size"] = 512; }));  // small_tokenizer's vocabulary
  nano.initialize(3);
  test::small_tokenizer().save(dir / "tok.json");
  nano.save(model, DType::F32, dir / "tok.json");
  test::write_bytes(dir / "prompt.txt", "In the beginning");
  const std::string common = " -n 6 --temperature 0 --dtype f32";
  auto stdout_of = [&](const std::string& command, const std::string& name) {
    const auto r = test::run_command("(" + command + " 2>/dev/null) > " + (dir / name).string());  // stdout only
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    return read_file(dir / name);
  };
  const std::string own = stdout_of(std::string(HYLA_BINARY) + " --threads 1 generate --model " + model +
                                        " --prompt 'In the beginning' --context 64" + common, "own.txt");
  ASSERT_EQ(own.rfind("In the beginning", 0), 0u) << own;
  EXPECT_EQ(stdout_of(std::string(HYLA_BINARY) + " generate -t 1 -m " + model + " -p 'In the beginning' -c 64" + common,
                      "short.txt"), own);
  EXPECT_EQ(stdout_of(std::string(HYLA_BINARY) + " generate -m " + model + " -f " + (dir / "prompt.txt").string() +
                          " --ctx-size 64 --threads 1" + common, "file.txt"), own);
  EXPECT_EQ(stdout_of("printf 'In the beginning' | " + std::string(HYLA_BINARY) + " generate -m " + model +
                          " -t 1 -c 64" + common, "stdin.txt"), own);
  // llama.cpp's -j: the continuation is an instance of the schema, ending where the schema does.
  const std::string constrained = stdout_of(std::string(HYLA_BINARY) + " generate -t 1 -m " + model +
                                                " -p 'In the beginning' -n 100 --temperature 1 -j " +
                                                "'{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}}, "
                                                "\"required\": [\"ok\"]}'",
                                            "json.txt");
  ASSERT_EQ(constrained.rfind("In the beginning", 0), 0u) << constrained;
  const nlohmann::json reply = nlohmann::json::parse(constrained.substr(16), nullptr, false);
  EXPECT_TRUE(reply.is_object() && reply["ok"].is_boolean()) << constrained;
  EXPECT_NE(run_hyla("generate -m " + model + " -p x -j '{\"type\": \"bool\"}'").output.find("--json-schema.type must be"),
            std::string::npos);
  const auto both = run_hyla("generate -m " + model + " -p x -f " + (dir / "prompt.txt").string());
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
}

// From a pipe every reply ends with the delimiter line (a message too long to send gets one too, so
// replies stay countable), and dropping old turns or a context too small is said on stderr.
TEST(Cli, ChatFromAPipeDelimitsRepliesAndSaysWhenTheContextIsFull) {
  test::TempDir dir;
  const std::string model = (dir / "nano").string();
  Model nano(test::nano_config([](nlohmann::json& j) { j["vocab_size"] = 512; }));
  nano.initialize(3);
  test::small_tokenizer().save(dir / "tok.json");
  nano.save(model, DType::F32, dir / "tok.json");
  const std::string turn = "tell me about the weather in the north and the south of the land";
  test::write_bytes(dir / "in.txt", turn + "\n" + turn + "\n\n" + turn + "\n" + std::string(400, 'z') + "\n/exit\nnever read\n");
  const auto r = test::run_command(fmt::format("({} chat -t 1 -m {} -n 8 -c 64 --temperature 0 --dtype f32 < {} > {} 2> {})",
                                               HYLA_BINARY, model, (dir / "in.txt").string(), (dir / "out.txt").string(),
                                               (dir / "err.txt").string()));
  ASSERT_EQ(r.exit_code, 0) << read_file(dir / "err.txt");
  const std::string out = read_file(dir / "out.txt"), err = read_file(dir / "err.txt");
  size_t delimiters = 0;
  for (size_t at = out.find("\n<|im_end|>\n"); at != std::string::npos; at = out.find("\n<|im_end|>\n", at + 1)) ++delimiters;
  EXPECT_EQ(delimiters, 4u) << out;  // three replies and the refused message; the empty line is skipped
  EXPECT_NE(err.find("[context full (64 tokens): dropped the"), std::string::npos) << err;
  EXPECT_NE(err.find("not sent]"), std::string::npos) << err;
  const auto custom = test::run_command("printf 'hi\\n' | " + std::string(HYLA_BINARY) + " chat -t 1 -m " + model +
                                        " -n 2 --dtype f32 --delimiter '=== end ===' 2>/dev/null");
  EXPECT_NE(custom.output.find("\n=== end ===\n"), std::string::npos) << custom.output;
}

// Bad values are named readably (CLI11's own checks printed DBL_MAX as 309 digits), and a value
// the sampler cannot use is an error before the engine sees it, never a crash of its thread.
TEST(Cli, BadNumbersGiveShortErrors) {
  for (const char* flag : {"--temperature inf", "--temperature nan", "--temperature -1", "-n 0", "-n x"}) {
    const auto r = run_hyla(fmt::format("generate -m /nonexistent -p hi {}", flag));
    EXPECT_EQ(r.exit_code, 1) << flag << ": " << r.output;
    EXPECT_LT(r.output.size(), 120u) << flag << ": " << r.output;
    EXPECT_EQ(r.output.find("terminate"), std::string::npos) << r.output;
  }
}

TEST(Cli, HelpShowsDefaults) {
  const auto serve = run_hyla("serve --help");
  EXPECT_NE(serve.output.find("=8080"), std::string::npos) << serve.output;  // the port
  EXPECT_NE(serve.output.find("--served-model-name"), std::string::npos);
  EXPECT_NE(serve.output.find("--parallel"), std::string::npos);
  EXPECT_NE(run_hyla("generate --help").output.find("-n,--max-tokens INT:POSITIVE=128"), std::string::npos);
  EXPECT_NE(run_hyla("eval --help").output.find("-t,--threads"), std::string::npos);
  // llama.cpp's -np (not declarable in CLI11) reaches serve's --parallel, range check included.
  const auto np = run_hyla("serve -m /nonexistent -np 0");
  EXPECT_NE(np.output.find("--max-sequences: must be a finite number > 0, got 0"), std::string::npos) << np.output;
  const auto memory = run_hyla("serve -m /nonexistent --memory lots");
  EXPECT_EQ(memory.exit_code, 1) << memory.output;
  EXPECT_NE(memory.output.find("--memory lots: give bytes with a unit (e.g. 8GiB)"), std::string::npos) << memory.output;
}

namespace {

// Sets byte `index` of tensor `name`'s data in a safetensors file to `value`.
void poke_safetensors(const std::filesystem::path& file, const std::string& name, size_t index, uint8_t value) {
  std::string bytes = read_file(file.string());
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  bytes[8 + n + header.at(name).at("data_offsets").at(0).get<size_t>() + index] = char(value);
  test::write_bytes(file, bytes);
}

// Sets the u32 value of GGUF metadata `key` (it must be a u32) to `value`.
// Overwrites a GGUF metadata value in place: a u32 (GGUF type 4) or an f32 (type 6).
template <typename T>
void poke_gguf(const std::filesystem::path& file, const std::string& key, T value) {
  static_assert(std::is_same_v<T, uint32_t> || std::is_same_v<T, float>);
  std::string bytes = read_file(file.string());
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos) << key;
  uint32_t type = 0;
  std::memcpy(&type, bytes.data() + at + key.size(), 4);
  ASSERT_EQ(type, (std::is_same_v<T, float> ? 6u : 4u)) << key;
  std::memcpy(bytes.data() + at + key.size() + 4, &value, 4);
  test::write_bytes(file, bytes);
}

}  // namespace

// Issue 67: a model whose window is smaller than a command's default context runs at its window and
// says so; a context asked for past the window stays an error naming both.
TEST(Cli, DefaultContextsFitTheModelsWindow) {
  test::TempDir dir;
  test::write_bytes(dir / "config.json", test::nano_config([](nlohmann::json& j) {
                                           j["vocab_size"] = 512;
                                           j["max_position_embeddings"] = 256;
                                         }).to_json().dump());
  test::small_tokenizer().save(dir / "tok.json");
  const std::string m = (dir / "m").string();
  ASSERT_EQ(run_hyla("init --config " + (dir / "config.json").string() + " --out " + m + " --tokenizer " +
                     (dir / "tok.json").string()).exit_code, 0);
  const std::string note = "the model's window is 256 tokens (max_position_embeddings): using a context of 256";
  auto r = test::run_command("echo hello | " + std::string(HYLA_BINARY) + " chat -m " + m + " -n 4");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("chat: " + note + " rather than 4096"), std::string::npos) << r.output;
  r = run_hyla("generate -m " + m + " -p hello -n 400 --temperature 0");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("generate: " + note), std::string::npos) << r.output;
  r = run_hyla("generate -m " + m + " -p hello -n 400 --context 4096");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("exceeds the model's window (256 tokens"), std::string::npos) << r.output;
  const std::string log = (dir / "serve.log").string();
  r = test::run_command(std::string(HYLA_BINARY) + " serve -m " + m + " --port 0 > " + log + " 2>&1 & pid=$!; " +
                        "for i in $(seq 200); do grep -q 'ready (' " + log + " && break; sleep 0.05; done; " +
                        "kill $pid; wait $pid; cat " + log);
  EXPECT_NE(r.output.find("hyla serve: " + note + " rather than 8192"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ready (16 slots × 256 tokens)"), std::string::npos) << r.output;
}

// `--tokenizer` takes a model whose tokenizer to use as well as a tokenizer.json: a Kimi checkpoint's
// tiktoken.model encodes, and travels into a new model directory and a GGUF's vocabulary.
TEST(Cli, TokenizerArgumentsTakeAModelsTokenizer) {
  test::TempDir dir;
  const std::string kimi = (test::source_dir() / "tests/data/kimi-pretokenizer").string();
  test::write_bytes(dir / "text.txt", "ACGTACGT  hello мир 12345\n\n");
  const auto encode = [&](const std::string& tokenizer) {
    const auto r = run_hyla("tokenizer encode --tokenizer " + tokenizer + " --input " + (dir / "text.txt").string() +
                            " --out " + (dir / "ids.json").string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return read_file((dir / "ids.json").string());
  };
  const std::string ids = encode(kimi);
  EXPECT_EQ(ids, nlohmann::json(load_model_tokenizer(kimi).encode("ACGTACGT  hello мир 12345\n\n", false)).dump() + "\n");
  nlohmann::json config = parse_json_file((test::source_dir() / "configs/kimi-linear-tiny.json").string());
  config["vocab_size"] = load_model_tokenizer(kimi).vocab_size();
  test::write_bytes(dir / "config.json", config.dump());
  for (const std::string out : {"m", "m.gguf"}) {
    const auto r = run_hyla("init --config " + (dir / "config.json").string() + " --tokenizer " + kimi + " --out " +
                            (dir / out).string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(encode((dir / out).string()), ids) << out;
  }
  const auto r = run_hyla("tokenizer encode --tokenizer " + (dir / "missing").string() + " --input " +
                          (dir / "text.txt").string() + " --out " + (dir / "ids.json").string());
  EXPECT_NE(r.exit_code, 0);
}

// Issue 65: damaged or lying files through every command that loads a model give one verdict
// (a non-zero exit naming the same rule), and convert writes nothing (docs/threat-model.md).
TEST(Cli, EveryCommandRefusesWhatInspectRefuses) {
  test::TempDir dir;
  const std::string tokenizer = (dir / "tok.json").string();
  test::small_tokenizer().save(tokenizer);
  const std::string nano = (dir / "config.json").string();  // nano with small_tokenizer's vocabulary
  test::write_bytes(nano, test::nano_config([](nlohmann::json& j) { j["vocab_size"] = 512; }).to_json().dump());
  const auto init = [&](const std::string& out, const std::string& options) {
    const auto r = run_hyla("init --config " + nano + " --out " + out + " --tokenizer " + tokenizer + " " + options);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  };
  struct Input {
    std::string name, path, rule;
  };
  std::vector<Input> inputs;
  const std::string nan = (dir / "nan").string();
  init(nan, "");
  poke_safetensors(nan + "/model.safetensors", "model.embed_tokens.weight", 4 * 7 + 3, 0x7f);  // exponent all ones
  poke_safetensors(nan + "/model.safetensors", "model.embed_tokens.weight", 4 * 7 + 2, 0xc0);
  inputs.push_back({"NaN weight", nan, "tensor 'model.embed_tokens.weight' (F32) holds nan at index 7"});
  const std::string mxfp4 = (dir / "mxfp4").string();
  init(mxfp4, "--experts mxfp4");
  const std::string scale = "model.layers.1.mlp.experts.0.gate_proj.weight.scale";
  poke_safetensors(mxfp4 + "/model.safetensors", scale, 5, 0xFF);
  inputs.push_back({"MXFP4 scale 0xFF", mxfp4, "holds 0xFF (NaN in E8M0) at index 5"});
  const std::string vocab = (dir / "vocab").string();
  init(vocab, "");
  oversized_tokenizer(512).save(vocab + "/tokenizer.json");
  inputs.push_back({"tokenizer larger than the vocabulary", vocab, "more than the model's vocab_size"});
  const std::string layers = (dir / "layers.gguf").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/kimi-linear-tiny.json").string() + " --out " + layers +
                     " --tokenizer " + tokenizer).exit_code, 0);
  poke_gguf(layers, "kimi-linear.block_count", uint32_t(100000));
  inputs.push_back({"GGUF block_count the tensors do not back", layers, "block_count is 100000 but the file holds"});
  const std::string scale_inf = (dir / "scale-inf.gguf").string();
  ASSERT_EQ(run_hyla("init --config " + (test::source_dir() / "configs/kimi-linear-tiny.json").string() + " --out " +
                     scale_inf + " --tokenizer " + tokenizer).exit_code, 0);
  poke_gguf(scale_inf, "kimi-linear.expert_weights_scale", std::numeric_limits<float>::infinity());
  inputs.push_back({"GGUF expert_weights_scale inf", scale_inf, "moe.routed_scaling_factor (inf) must be finite"});
  const std::string huge = (dir / "huge").string();  // 1e308: a finite double, inf as the f32 it is used as
  init(huge, "");
  nlohmann::json config = parse_json_file(huge + "/config.json");
  config["moe"]["situ_linear_beta"] = 1e308;
  test::write_bytes(huge + "/config.json", config.dump());
  inputs.push_back({"config value 1e308", huge, "moe.situ_linear_beta (1e+308) must be finite as the f32"});
  const std::string magic = (dir / "magic.gguf").string();
  test::write_bytes(magic, "GGUX" + std::string(100, '\0'));
  inputs.push_back({"not a GGUF file", magic, "does not start with the GGUF magic"});

  const std::string out = (dir / "out").string();
  for (const Input& input : inputs) {
    for (const std::string& command :
         {"inspect " + input.path, "logits --tokens [1,2,3] --out " + out + ".st -m " + input.path,
          "generate -p hi -n 2 -m " + input.path, "convert --out " + out + " -m " + input.path,
          "serve --port 0 -m " + input.path}) {
      const auto r = test::run_command("timeout -k 5 60 " + std::string(HYLA_BINARY) + " " + command + " 2>&1");
      EXPECT_NE(r.exit_code, 0) << input.name << ": " << command;
      EXPECT_NE(r.exit_code, 124) << input.name << ": " << command << " did not stop";
      EXPECT_NE(r.output.find(input.rule), std::string::npos) << input.name << ": " << command << "\n" << r.output;
      EXPECT_FALSE(std::filesystem::exists(out)) << input.name << ": convert wrote " << out;
      EXPECT_FALSE(std::filesystem::exists(out + ".st")) << input.name << ": logits wrote";
      std::filesystem::remove_all(out), std::filesystem::remove(out + ".st");
    }
  }
}

}  // namespace
}  // namespace hyla
