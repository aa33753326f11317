#include "hyla/infer/engine.h"

#include "hyla/core/error.h"
#include "hyla/core/threads.h"
#include "hyla/dist/expert_serving.h"

namespace hyla {

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : scheduler_(model, tokenizer, options), stats_(scheduler_.stats()) {
  // The thread configuration is per thread: the worker does the math with its creator's.
  worker_ = std::thread([this, config = thread_config()] {
    set_thread_config(config);
    run();
  });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

std::future<GenerationOutput> Engine::submit(GenerationRequest request) {
  scheduler_.validate(request);  // reads only the options and the config: safe beside the worker
  std::promise<GenerationOutput> promise;
  std::future<GenerationOutput> future = promise.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HYLA_CHECK(!stopping_, "the engine is shutting down");
    incoming_.emplace_back(std::move(request), std::move(promise));
    ++submitted_;
  }
  wake_.notify_one();
  return future;
}

void Engine::enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HYLA_CHECK(!stopping_, "the engine is shutting down");
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  EngineStats s = stats_;
  s.requests = submitted_;
  s.waiting += int64_t(incoming_.size());
  return s;
}

void Engine::run() {
  for (;;) {
    std::vector<std::pair<GenerationRequest, std::promise<GenerationOutput>>> arrived;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // A task deferred until its slot's request finished runs after the step that finished it.
      wake_.wait(lock, [&] {
        return stopping_ || !incoming_.empty() || !tasks_.empty() || !deferred_.empty() || !scheduler_.idle();
      });
      if (stopping_) break;
      arrived.swap(incoming_);
      deferred_.insert(deferred_.end(), std::make_move_iterator(tasks_.begin()), std::make_move_iterator(tasks_.end()));
      tasks_.clear();
    }
    // Before the new requests are admitted: an action asked for before a request comes first.
    std::erase_if(deferred_, [&](Task& task) { return task(scheduler_); });
    for (auto& [request, promise] : arrived) promises_.emplace(scheduler_.add(std::move(request)), std::move(promise));
    std::vector<Scheduler::Finished> finished;
    std::exception_ptr failure;
    std::vector<Scheduler::RequestId> failed;
    try {
      finished = scheduler_.step();
    } catch (const ProcessFailure&) {  // the job cannot go on: said as it is, for the caller to end it
      failure = std::current_exception();
      failed = scheduler_.abort();
    } catch (const std::exception& e) {
      // A failure inside the model fails every request in flight, not the process.
      failure = std::make_exception_ptr(Error("inference failed: " + describe_exception(e)));
      failed = scheduler_.abort();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);  // counters first: a caller whose future is ready sees its request in them
      stats_ = scheduler_.stats();
    }
    for (Scheduler::Finished& f : finished) {
      if (f.error) promises_.at(f.id).set_exception(f.error);
      else promises_.at(f.id).set_value(std::move(f.output));
      promises_.erase(f.id);
    }
    for (Scheduler::RequestId id : failed) {
      promises_.at(id).set_exception(failure);
      promises_.erase(id);
    }
  }
  const auto stopped = std::make_exception_ptr(Error("the engine stopped"));
  scheduler_.abort();
  for (auto& [id, promise] : promises_) promise.set_exception(stopped);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [request, promise] : incoming_) promise.set_exception(stopped);
}

std::unique_ptr<Model> load_model_for_engine(const std::filesystem::path& dir, const ModelLoadOptions& options) {
  std::unique_ptr<Model> model;
  run_on_passing_thread([&] { model = load_model_across_processes(dir, options); });
  return model;
}

int64_t fit_default_context(const Model& model, int64_t context, bool given, const char* command) {
  const int64_t window = model.config().max_position_embeddings;
  if (given || context <= window) return context;
  fmt::print(stderr, "{}: the model's window is {} tokens (max_position_embeddings): using a context of {} rather "
             "than {}\n", command, window, window, context);
  return window;
}

}  // namespace hyla
