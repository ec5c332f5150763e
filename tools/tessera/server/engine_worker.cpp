#include "server/engine_worker.h"

#include <algorithm>
#include <iterator>

#include "tessera/engine.h"
#include "tessera/error.h"

namespace tessera::server {

std::vector<Job::Event> Job::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void Job::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

EngineWorker::EngineWorker(Engine& engine, const GeneratorOptions& options, size_t max_waiting, Metrics& metrics)
    : engine_(engine), gen_(engine, options), max_waiting_(max_waiting), metrics_(metrics) {
  metrics_.kv_pages_total = engine_.kv().total_pages();
  thread_ = std::thread([this] { run(); });
}

EngineWorker::~EngineWorker() { stop(); }

void EngineWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineWorker::end_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_all_ = true;
  }
  cv_.notify_all();
}

bool EngineWorker::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || end_all_ || pending_.load() >= max_waiting_) return false;
    incoming_.push_back(job);
    ++pending_;
  }
  cv_.notify_all();
  return true;
}

void EngineWorker::run() {
  using clock = std::chrono::steady_clock;
  for (;;) {
    std::vector<std::shared_ptr<Job>> fresh;
    bool end_all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !incoming_.empty() || !active_.empty(); });
      if (stop_) break;
      fresh.swap(incoming_);
      end_all = end_all_;
    }
    if (end_all) {
      for (auto& job : fresh) job->push(Job::Event::ended(FinishReason::Length));
      fresh.clear();
      for (auto& job : active_) {
        gen_.cancel(job->id_);
        job->push(Job::Event::ended(FinishReason::Length));
      }
      active_.clear();
    }
    for (auto& job : fresh) {
      if (job->cancelled()) continue;
      try {
        job->id_ = gen_.add(job->request);
        metrics_.prompt_tokens_total += int64_t(job->request.prompt.size());
        ++metrics_.requests_total;
        active_.push_back(job);
      } catch (const Error& e) {
        job->push(Job::Event::failed(e.what()));
      }
    }
    // Clients that went away: their sequences and pages are released now.
    for (auto it = active_.begin(); it != active_.end();) {
      if ((*it)->cancelled()) {
        gen_.cancel((*it)->id_);
        (*it)->push(Job::Event::ended(FinishReason::Cancelled));
        it = active_.erase(it);
      } else {
        ++it;
      }
    }
    if (!gen_.idle()) {
      std::vector<GenerationEvent> events;
      try {
        events = gen_.step();
      } catch (const std::exception& e) {
        // The engine failed: every request in flight gets the error.
        for (auto& job : active_) {
          gen_.cancel(job->id_);
          job->push(Job::Event::failed(e.what()));
        }
        active_.clear();
      }
      const auto now = clock::now();
      for (GenerationEvent& ev : events) {
        auto it = std::find_if(active_.begin(), active_.end(), [&](const auto& j) { return j->id_ == ev.id; });
        if (it == active_.end()) continue;
        Job& job = **it;
        if (!job.first_token_seen_) {
          job.first_token_seen_ = true;
          metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - job.submitted).count());
        } else {
          metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - job.last_token_).count());
        }
        job.last_token_ = now;
        ++metrics_.generated_tokens_total;
        const bool done = ev.finish != FinishReason::None;
        job.push(Job::Event::of(std::move(ev)));
        if (done) active_.erase(it);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // submit() counts under this lock too
      pending_ = gen_.waiting() + incoming_.size();
    }
    metrics_.requests_running = int64_t(gen_.running());
    metrics_.requests_waiting = int64_t(pending_.load());
    metrics_.kv_pages_used = engine_.kv().total_pages() - engine_.kv().free_pages();
    metrics_.prefix_cache_hit_tokens_total = gen_.stats().prefix_tokens_reused;
    metrics_.spec_drafted_tokens_total = gen_.stats().drafted_tokens;
    metrics_.spec_accepted_tokens_total = gen_.stats().accepted_tokens;
    const Engine::PlanCacheStats plans = engine_.plan_cache();
    metrics_.plan_cache_hits_total = int64_t(plans.hits);
    metrics_.plan_cache_misses_total = int64_t(plans.misses);
  }
  for (auto& job : active_) {
    gen_.cancel(job->id_);
    job->push(Job::Event::failed("the server is shutting down"));
  }
  active_.clear();
}

}  // namespace tessera::server
