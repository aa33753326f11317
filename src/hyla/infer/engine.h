#pragma once
// The inference engine: a Scheduler (scheduler.h) on a worker thread of its own, for callers that
// submit from other threads and wait on futures (`serve`'s HTTP threads, `generate`, `chat`).
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "hyla/infer/scheduler.h"

namespace hyla {

class Engine {
 public:
  // The engine uses the model and tokenizer (which must outlive it) from its worker thread only,
  // with the creating thread's thread count.
  Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request (a request that can never run throws here); the future is fulfilled when it
  // finishes (a model failure arrives as an exception).
  std::future<GenerationOutput> submit(GenerationRequest request);
  // Runs `task` on the worker between two steps (the scheduler is the worker's alone) and gives
  // its result. With `slot` ≥ 0 it waits until no request runs in that slot, as llama-server
  // defers a slot action.
  template <class Result>
  std::future<Result> between_steps(std::function<Result(Scheduler&)> task, int slot = -1) {
    auto promise = std::make_shared<std::promise<Result>>();
    std::future<Result> future = promise->get_future();
    enqueue([task = std::move(task), promise, slot](Scheduler& scheduler) {
      if (scheduler.slot_busy(slot)) return false;
      try {
        promise->set_value(task(scheduler));
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
      return true;
    });
    return future;
  }
  EngineStats stats() const;
  const Model& model() const { return scheduler_.model(); }
  const Tokenizer& tokenizer() const { return scheduler_.tokenizer(); }
  const EngineOptions& options() const { return scheduler_.options(); }
  std::string memory_summary() const { return scheduler_.memory_summary(); }

 private:
  // A task between steps: returns whether it ran (false: try again after the next step). Never
  // throws; it answers its caller itself, and an engine that stops drops it (its future breaks).
  using Task = std::function<bool(Scheduler&)>;
  void enqueue(Task task);
  void run();

  Scheduler scheduler_;  // the worker's alone
  std::map<Scheduler::RequestId, std::promise<GenerationOutput>> promises_;  // the worker's alone
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::pair<GenerationRequest, std::promise<GenerationOutput>>> incoming_;
  std::vector<Task> tasks_;      // under the mutex
  std::vector<Task> deferred_;   // the worker's alone: tasks waiting for their slot
  EngineStats stats_;  // the scheduler's, as of its last step
  int64_t submitted_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// Loads a model directory for an Engine. OpenMP keeps a thread pool per thread that ran parallel
// work, and libgomp stops spin-waiting once pools outnumber the cores (decoding ran 4-6x slower):
// so loading runs on a passing thread, and the engine's worker owns the only pool.
std::unique_ptr<Model> load_model_for_engine(const std::filesystem::path& dir, const ModelLoadOptions& options = {});

// A command's context against the model's window (max_position_embeddings): a default past the
// window becomes the window, and a line on stderr from `command` says so; a context the user gave
// stays as given (the engine refuses one past the window, naming both).
int64_t fit_default_context(const Model& model, int64_t context, bool given, const char* command);

}  // namespace hyla
