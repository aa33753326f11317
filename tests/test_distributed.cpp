// Data parallelism under mpirun on this one machine (2 and 4 processes, --oversubscribe): the MPI
// collective and the data-parallel steps against one process (tests/mpi/mpi_check.cpp), then
// `hyla train` end to end: loss curves across process counts, bitwise repeats, a checkpoint
// written by 4 processes resumed by 2, and a killed process ending the job.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "hyla/io/file.h"
#include "tiny_run.h"

extern char** environ;

namespace hyla {
namespace {

namespace fs = std::filesystem;
using test::metrics;
using test::tiny;

// mpirun as root needs its two allow-root variables; single-copy shared memory needs ptrace
// rights that containers often withhold, so the tests use plain copies.
std::string mpirun(int processes) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none "
         "mpirun --oversubscribe --bind-to none -np " +
         std::to_string(processes) + " ";
}

test::CommandResult train_on(int processes, const std::string& out, const std::string& extra) {
  const std::string command = std::string(HYLA_BINARY) + " " + tiny().args(out) + " --quiet " + extra;
  return test::run_command(processes > 1 ? mpirun(processes) + command : command);
}

// tiny()'s TRAIN.json with ZeRO-1.
std::string zero_train_config() {
  nlohmann::json t = parse_json_file(tiny().train);
  t["distributed"] = {{"zero_stage", 1}, {"bucket_mb", 0.01}};
  const std::string path = (tiny().dir / "train-zero.json").string();
  test::write_bytes(path, t.dump());
  return path;
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& row : metrics(run_dir)) out.push_back(row["loss"].get<double>());
  return out;
}

TEST(Distributed, CollectiveAndStepsEqualOneProcessOn2And4Processes) {
  for (int n : {2, 4}) {
    const auto r = test::run_command(mpirun(n) + HYLA_MPI_CHECK);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("PASSED"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("FAIL "), std::string::npos) << r.output;
  }
}

// One process, 2 processes and 4 with ZeRO-1 train the same 12 steps on the same batches: the
// same loss curve up to float summation order (and, under the quantile rule, the threshold that
// 2 and 4 processes read off one summed histogram instead of one process's exact selection).
// A repeat on 2 processes is bitwise identical.
TEST(Distributed, TrainLossCurvesMatchAcrossProcessCountsAndRepeatBitwise) {
  const std::string one = (tiny().dir / "dp1").string(), two = (tiny().dir / "dp2").string(),
                    again = (tiny().dir / "dp2-again").string(), four = (tiny().dir / "dp4").string();
  auto r = train_on(1, one, "--deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train_on(2, two, "--deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data parallel over 2 processes"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("unigram entropy"), r.output.rfind("unigram entropy")) << "only rank 0 prints";
  r = train_on(2, again, "--deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string zero = zero_train_config();
  r = test::run_command(mpirun(4) + HYLA_BINARY + " train --config " + tiny().config + " --train " + zero + " --data " +
                        tiny().data + " --out " + four + " --quiet --deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("optimiser state sharded (ZeRO-1)"), std::string::npos) << r.output;

  const auto a = losses(one), b = losses(two), c = losses(again), d = losses(four);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  ASSERT_EQ(d.size(), 12u);
  EXPECT_EQ(b, c) << "a repeat on 2 processes";
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 2e-3 * a[i]) << "step " << i + 1 << ", 2 processes";
    EXPECT_NEAR(d[i], a[i], 2e-3 * a[i]) << "step " << i + 1 << ", 4 processes";
  }
  const auto rows = metrics(two);
  ASSERT_TRUE(rows[0].contains("comm")) << rows[0].dump();
  EXPECT_GT(rows[0]["comm"]["all_reduce_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(rows[0]["tokens"], 256);  // every process's rows
  const auto zero_rows = metrics(four);
  EXPECT_EQ(zero_rows[0]["comm"]["all_reduce_bytes"], 0);
  EXPECT_GT(zero_rows[0]["comm"]["reduce_scatter_bytes"].get<int64_t>(), 0);
  EXPECT_TRUE(fs::exists(four + "/checkpoints/step-00000012/optimizer-00003-of-00004.safetensors"));
  EXPECT_TRUE(fs::exists(four + "/model/model.safetensors"));
}

// A checkpoint that 4 ZeRO-1 processes wrote (4 optimiser shards) resumes on 2, and the resumed
// steps continue the 4-process run's curve.
TEST(Distributed, CheckpointFrom4ProcessesResumesOn2) {
  const std::string four = (tiny().dir / "ckpt4").string(), resumed = (tiny().dir / "ckpt4-on-2").string();
  const std::string zero = zero_train_config();
  const std::string args = " train --config " + tiny().config + " --train " + zero + " --data " + tiny().data;
  auto r = test::run_command(mpirun(4) + HYLA_BINARY + args + " --out " + four + " --quiet --deterministic");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::copy(four, resumed, fs::copy_options::recursive);
  fs::remove_all(resumed + "/checkpoints/step-00000012");  // continue from step 9
  r = test::run_command(mpirun(2) + HYLA_BINARY + args + " --out " + resumed + " --quiet --deterministic --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  const auto a = losses(four), b = losses(resumed);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < 9; ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1 << " (kept from the 4-process run)";
  for (size_t i = 9; i < 12; ++i) EXPECT_NEAR(b[i], a[i], 1e-3 * a[i]) << "step " << i + 1;
  EXPECT_TRUE(fs::exists(resumed + "/checkpoints/step-00000012/optimizer-00001-of-00002.safetensors"));
}

// Expert parallelism in `hyla train`: groups of 2 on 2 and on 4 processes (each holding half of
// every layer's routed experts) follow one process's curve; the 4-process checkpoint (model in
// parts, optimiser moments by parameter) resumes on one process, and the model loads anywhere.
TEST(Distributed, ExpertParallelTrainsLikeOneProcessAndResumesOnOne) {
  nlohmann::json t = parse_json_file(tiny().train);
  t["distributed"] = {{"expert_parallel", 2}};
  const std::string ep_train = (tiny().dir / "train-ep.json").string();
  test::write_bytes(ep_train, t.dump());
  const std::string args = std::string(HYLA_BINARY) + " train --config " + tiny().config + " --data " + tiny().data +
                           " --quiet --deterministic";
  const std::string one = (tiny().dir / "ep1").string(), two = (tiny().dir / "ep2").string(),
                    four = (tiny().dir / "ep4").string(), resumed = (tiny().dir / "ep4-on-1").string();
  auto r = test::run_command(args + " --train " + tiny().train + " --out " + one);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = test::run_command(mpirun(2) + args + " --train " + ep_train + " --out " + two);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("expert parallel in groups of 2"), std::string::npos) << r.output;
  r = test::run_command(mpirun(4) + args + " --train " + ep_train + " --out " + four);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto a = losses(one), b = losses(two), c = losses(four);
  ASSERT_EQ(b.size(), 12u);
  ASSERT_EQ(c.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i], a[i], 2e-3 * a[i]) << "step " << i + 1 << ", 2 processes";
    EXPECT_NEAR(c[i], a[i], 2e-3 * a[i]) << "step " << i + 1 << ", 4 processes";
  }
  const auto rows = metrics(four);
  EXPECT_GT(rows[0]["comm"]["all_to_all_bytes"].get<int64_t>(), 0);
  EXPECT_GT(rows[0]["comm"]["expert_all_reduce_bytes"].get<int64_t>(), 0);  // 2 replicas of each expert
  EXPECT_TRUE(fs::exists(four + "/checkpoints/step-00000012/model/model-00002-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(four + "/model/model.safetensors.index.json"));
  EXPECT_EQ(test::run_hyla("inspect " + four + "/model").exit_code, 0);

  fs::copy(four, resumed, fs::copy_options::recursive);
  fs::remove_all(resumed + "/checkpoints/step-00000012");  // continue from step 9 on one process
  r = test::run_command(args + " --train " + tiny().train + " --out " + resumed + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto d = losses(resumed);
  ASSERT_EQ(d.size(), 12u);
  for (size_t i = 9; i < 12; ++i) EXPECT_NEAR(d[i], c[i], 1e-3 * c[i]) << "step " << i + 1;
}

// Inference across processes: the routed experts split over 2 and 4 processes, rank 0 running
// the command. The logits of a sequence are one process's bit for bit (f32 and bf16), greedy
// generation gives the same text, and `hyla bench` runs. Every process runs one thread: oneDNN's
// f32 products before AVX-512 (AMD Zen 2/3) split their sums by thread count, so one process at
// two threads and four processes at one thread each differ in the last bits there.
TEST(Distributed, ServingAcrossProcessesGivesOneProcessOutputsBitForBit) {
  const std::string one_thread = "HYLA_THREADS=1 ";
  const std::string model = (tiny().dir / "served").string();
  ASSERT_EQ(test::run_hyla("init --config " + tiny().config + " --out " + model + " --seed 3 --tokenizer " +
                           (tiny().dir / "tok.json").string()).exit_code, 0);
  const std::string text = " --text 'In the beginning God created the heaven and the earth.'";
  for (const char* dtype : {"f32", "bf16"}) {
    const std::string one = (tiny().dir / fmt::format("logits-1-{}.safetensors", dtype)).string();
    auto r = test::run_command(one_thread + HYLA_BINARY +
                               fmt::format(" logits --model {} --out {} --dtype {}{}", model, one, dtype, text));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (int n : {2, 4}) {
      const std::string many = (tiny().dir / fmt::format("logits-{}-{}.safetensors", n, dtype)).string();
      r = test::run_command(one_thread + mpirun(n) + fmt::format("{} logits --model {} --out {} --dtype {}{}", HYLA_BINARY, model,
                                                    many, dtype, text));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_EQ(read_file(many), read_file(one)) << n << " processes, " << dtype;
    }
  }
  const std::string generate = " generate --model " + model + " --prompt 'And God said' -n 24 --temperature 0 2>/dev/null";
  const auto alone = test::run_command(one_thread + HYLA_BINARY + generate);
  const auto split = test::run_command(one_thread + mpirun(2) + HYLA_BINARY + generate);
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  ASSERT_EQ(split.exit_code, 0) << split.output;
  EXPECT_EQ(split.output.substr(0, split.output.find('\n')), alone.output.substr(0, alone.output.find('\n')));
  const auto bench = test::run_command(mpirun(2) + HYLA_BINARY + " bench --model " + model + " -p 16 -n 4 -r 1");
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  EXPECT_NE(bench.output.find("tg4"), std::string::npos) << bench.output;

  // Rank 0 answers HTTP: a greedy completion through `mpirun -np 2 hyla serve` is one process's,
  // and SIGTERM to mpirun ends every process.
  std::vector<std::string> texts;
  for (int n : {1, 2}) {
    const std::string log = (tiny().dir / fmt::format("serve-{}.log", n)).string();
    const std::string command = (n > 1 ? mpirun(n) : std::string()) + HYLA_BINARY + " serve --model " + model +
                                " --port 0 > " + log + " 2>&1";
    pid_t shell = 0;
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    ASSERT_EQ(posix_spawn(&shell, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline &&
           (!fs::exists(log) || read_file(log).find("ready (") == std::string::npos))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string started = read_file(log), marker = "listening on http://127.0.0.1:";
    ASSERT_NE(started.find("ready ("), std::string::npos) << started;
    httplib::Client client("127.0.0.1", std::stoi(started.substr(started.find(marker) + marker.size())));
    client.set_read_timeout(60, 0);
    const auto res = client.Post("/v1/completions",
                                 nlohmann::json({{"prompt", "And God said"}, {"max_tokens", 16}, {"temperature", 0}}).dump(),
                                 "application/json");
    ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    texts.push_back(nlohmann::json::parse(res->body)["choices"][0]["text"].get<std::string>());
    test::run_command("pkill -TERM -f 'serve --model " + model + " --port 0$'");
    int status = 0;
    const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::waitpid(shell, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < stop_deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LT(std::chrono::steady_clock::now(), stop_deadline) << n << " processes did not stop";
  }
  EXPECT_EQ(texts[1], texts[0]);
  EXPECT_FALSE(texts[0].empty());
}

// Issue 68: a process of a serving job stopped (SIGSTOP) mid-run. The request in flight gets a
// 503 naming it within the exchange timeout (never a hang, never wrong text), and the job ends.
TEST(Distributed, AStoppedProcessEndsServingWithA503NamingIt) {
  const std::string model = (tiny().dir / "stopped-served").string();
  ASSERT_EQ(test::run_hyla("init --config " + tiny().config + " --out " + model + " --seed 3 --tokenizer " +
                           (tiny().dir / "tok.json").string()).exit_code, 0);
  const std::string log = (tiny().dir / "stopped-served.log").string();
  const std::string command =
      mpirun(2) + HYLA_BINARY + " --exchange-timeout 3 serve --model " + model + " --port 0 > " + log + " 2>&1";
  pid_t shell = 0;
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&shell, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline && (!fs::exists(log) || read_file(log).find("ready (") == std::string::npos))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string started = read_file(log), marker = "listening on http://127.0.0.1:";
  ASSERT_NE(started.find("ready ("), std::string::npos) << started;
  httplib::Client client("127.0.0.1", std::stoi(started.substr(started.find(marker) + marker.size())));
  client.set_read_timeout(60, 0);
  const std::string body = nlohmann::json({{"prompt", "And God said"}, {"max_tokens", 8}, {"temperature", 0}}).dump();
  auto res = client.Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");

  const auto stopped = test::run_command(
      "for p in $(pgrep -f 'serve --model " + model + " --port 0$'); do grep -qz '^OMPI_COMM_WORLD_RANK=1$' "
      "/proc/$p/environ 2>/dev/null && kill -STOP $p && echo $p; done");
  ASSERT_FALSE(stopped.output.empty()) << "no rank 1 found";
  const auto stopped_at = std::chrono::steady_clock::now();
  res = client.Post("/v1/completions", body, "application/json");
  const double answered = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  ASSERT_TRUE(res) << "no answer: " << read_file(log);
  EXPECT_EQ(res->status, 503) << res->body;
  EXPECT_NE(res->body.find("process 1 of the job answered nothing for 3 s"), std::string::npos) << res->body;
  EXPECT_LT(answered, 20.0);
  int status = 0;
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (::waitpid(shell, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const bool ended = std::chrono::steady_clock::now() < deadline;
  test::run_command("pkill -CONT -f 'serve --model " + model + " --port 0$'; pkill -KILL -f 'serve --model " + model +
                    " --port 0$'");
  EXPECT_TRUE(ended) << "the job did not end: " << read_file(log);
  EXPECT_NE(read_file(log).find("hyla serve: process 1 of the job answered nothing"), std::string::npos) << read_file(log);
}

// A user error under mpirun is one clear line naming the process, and ends the job at once.
TEST(Distributed, AnErrorEndsEveryProcessWithAClearLine) {
  const auto start = std::chrono::steady_clock::now();
  const auto r = train_on(3, (tiny().dir / "three").string(), "");  // 8 sequences do not split over 3
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("of 3): "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("does not split over 3 processes"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

// SIGKILL to one process mid-run: mpirun ends the job within seconds with an error naming the
// process, and the run resumes from its last complete checkpoint.
TEST(Distributed, AKilledProcessEndsTheJobCleanly) {
  const std::string out = (tiny().dir / "killed").string();
  nlohmann::json t = parse_json_file(tiny().train);
  t["curriculum"] = nlohmann::json::array({{{"seq_len", 32}, {"tokens", 400 * 256}, {"batch_tokens", 256}}});
  t["checkpoint"] = {{"every", 2}, {"keep", 2}};
  t["eval"] = {{"every", 0}};
  const std::string long_train = (tiny().dir / "train-long.json").string();
  test::write_bytes(long_train, t.dump());
  const std::string args = std::string(HYLA_BINARY) + " train --config " + tiny().config + " --train " + long_train +
                           " --data " + tiny().data + " --quiet -t 1 --out " + out;
  const std::string log = (tiny().dir / "killed.log").string();
  const std::string command = mpirun(2) + args + " > " + log + " 2>&1";
  pid_t shell = 0;
  const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&shell, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && metrics(out).size() < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(metrics(out).size(), 5u) << read_file(log);
  // Rank 1: the hyla process whose environment says so.
  const auto killed = test::run_command(
      "for p in $(pgrep -f 'out " + out + "$'); do grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/$p/environ 2>/dev/null && "
      "kill -KILL $p && echo $p; done");
  ASSERT_FALSE(killed.output.empty()) << "no rank 1 found";
  const auto killed_at = std::chrono::steady_clock::now();
  int status = 0;
  deadline = killed_at + std::chrono::seconds(30);
  while (::waitpid(shell, &status, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  ASSERT_LT(seconds, 15.0) << "the job did not end after a process died";
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string output = read_file(log);
  EXPECT_NE(output.find("rank 1"), std::string::npos) << output;
  test::run_command("pkill -KILL -f 'out " + out + "$'");  // nothing may be left; a leftover would be a failure above

  const size_t logged = metrics(out).size();
  const auto r = test::run_command(mpirun(2) + args + " --resume --steps " + std::to_string(logged + 2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_EQ(metrics(out).size(), logged + 2) << r.output;  // kept up to the checkpoint, then the rest
}

}  // namespace
}  // namespace hyla
