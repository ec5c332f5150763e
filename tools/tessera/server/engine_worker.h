// The server's one thread that owns the Engine's Generator: HTTP handlers submit
// jobs and read each job's events from its own queue; the worker admits new jobs,
// cancels abandoned ones, runs Generator::step() and hands out the tokens. A job
// whose client went away is cancelled at the next step, freeing its KV pages.
// Embedding jobs run on the same thread, one at a time, one forward step of theirs
// between two generation steps (embedder.h), so neither stalls the other for long.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "server/metrics.h"
#include "tessera/embedder.h"
#include "tessera/generator.h"

namespace tessera {
class Engine;
}

namespace tessera::server {

// One request's generation as the handler sees it.
class Job {
 public:
  // The Generator's event (a token and/or a finish), or the engine's failure.
  // error (GenerationEvent's) is also set when the engine failed: then no token.
  struct Event : GenerationEvent {
    int choice = -1;  // which of the job's choices it belongs to; -1: all of them
    static Event of(GenerationEvent e) {
      Event x;
      static_cast<GenerationEvent&>(x) = std::move(e);
      return x;
    }
    static Event ended(FinishReason why) {
      Event x;
      x.finish = why;
      return x;
    }
    static Event failed(std::string why) {
      Event x;
      x.finish = FinishReason::Failed;
      x.error = std::move(why);
      return x;
    }
  };
  // `choices` answers to one prompt (OpenAI's n): the prompt is prefilled once and the
  // choices fork it (Generator::add_choices).
  explicit Job(GenerationRequest r, int choices = 1) : request(std::move(r)), choices(choices) {}
  // Wait for the next events (up to `timeout`); returns them (maybe none).
  std::vector<Event> wait(std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Ends one choice (its stop string matched); the others go on. With one choice,
  // the same as cancel().
  void cancel_choice(int i) {
    if (choices == 1) return cancel();
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_choices_.push_back(i);
    }
    some_choice_cancelled_ = true;
  }

  GenerationRequest request;
  const int choices;
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();

 private:
  friend class EngineWorker;
  void push(Event e);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  std::atomic<bool> cancelled_{false};
  std::vector<int> cancelled_choices_;  // under mu_
  std::atomic<bool> some_choice_cancelled_{false};
  std::vector<uint64_t> ids_;  // the Generator's id of each choice once admitted
  std::vector<bool> finished_;  // per choice (the worker's thread only)
  int unfinished_ = 0;
  int choice_of(uint64_t id) const;
  bool first_token_seen_ = false;
  std::chrono::steady_clock::time_point last_token_;
};

// One embeddings request as the handler sees it: token inputs in, one pooled hidden
// state per input (not normalised) or an error out.
class EmbeddingJob {
 public:
  EmbeddingJob(std::vector<std::vector<int32_t>> in, Pooling p) : inputs(std::move(in)), pooling(p) {}
  // Waits up to `timeout`; true once the job is finished (results or error are set).
  bool wait(std::chrono::milliseconds timeout);
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  std::vector<std::vector<int32_t>> inputs;  // moved into the worker's batch
  Pooling pooling;
  // Valid once wait() returned true: the results, or an error (busy: the KV pool had no
  // free page for it, so retrying later may work).
  std::vector<std::vector<float>> results;
  std::string error;
  bool busy = false;

 private:
  friend class EngineWorker;
  void complete();
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> cancelled_{false};
};

class EngineWorker {
 public:
  // max_waiting: jobs queued beyond the running ones before submit() refuses.
  EngineWorker(Engine& engine, const GeneratorOptions& options, size_t max_waiting, Metrics& metrics);
  ~EngineWorker();
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  // Queue a job; false when the queue is full (the caller answers 503).
  bool submit(const std::shared_ptr<Job>& job);
  bool submit(const std::shared_ptr<EmbeddingJob>& job);
  // The shutdown timeout: every job, running or waiting, ends now with a Length
  // event (what was generated is the answer); later submits are refused.
  void end_all();
  void stop();

 private:
  void run();
  void cancel_all(Job& job);  // every unfinished choice of the job
  // One forward step of the current embedding job (starting the next one queued).
  void step_embeddings(std::vector<std::shared_ptr<EmbeddingJob>>& fresh);
  // Ends every embedding job (fresh, waiting, running) with the error `why`.
  void fail_embeddings(std::vector<std::shared_ptr<EmbeddingJob>>& fresh, const std::string& why);
  Engine& engine_;
  Generator gen_;
  size_t max_waiting_;
  Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Job>> incoming_;
  std::vector<std::shared_ptr<Job>> active_;  // admitted to the Generator
  std::vector<std::shared_ptr<EmbeddingJob>> embed_incoming_;
  std::deque<std::shared_ptr<EmbeddingJob>> embed_waiting_;  // taken from incoming, not started
  std::shared_ptr<EmbeddingJob> embed_job_;                  // the one running, with its batch
  std::unique_ptr<EmbeddingBatch> embed_batch_;
  std::atomic<size_t> embed_pending_{0};  // incoming + waiting
  std::atomic<size_t> pending_{0};            // incoming + waiting in the Generator, as of the last step
  bool stop_ = false, end_all_ = false;
  std::thread thread_;
};

}  // namespace tessera::server
