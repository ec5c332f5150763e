#include "server/engine_worker.h"

#include <algorithm>
#include <iterator>
#include <utility>

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

int Job::choice_of(uint64_t id) const {
  for (size_t i = 0; i < ids_.size(); ++i)
    if (ids_[i] == id) return int(i);
  return -1;
}

bool EmbeddingJob::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return done_; });
}

void EmbeddingJob::complete() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
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

bool EngineWorker::submit(const std::shared_ptr<EmbeddingJob>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || end_all_ || embed_pending_.load() >= max_waiting_) return false;
    embed_incoming_.push_back(job);
    ++embed_pending_;
  }
  cv_.notify_all();
  return true;
}

void EngineWorker::step_embeddings(std::vector<std::shared_ptr<EmbeddingJob>>& fresh) {
  for (auto& job : fresh) embed_waiting_.push_back(std::move(job));
  fresh.clear();
  auto fail = [&](const std::string& why, bool busy) {
    embed_job_->error = why;
    embed_job_->busy = busy;
    embed_batch_.reset();  // frees the sequences it holds
    std::exchange(embed_job_, nullptr)->complete();
  };
  if (embed_job_ && embed_job_->cancelled()) {
    embed_batch_.reset();
    embed_job_ = nullptr;
  }
  while (!embed_job_ && !embed_waiting_.empty()) {
    embed_job_ = std::move(embed_waiting_.front());
    embed_waiting_.pop_front();
    if (embed_job_->cancelled()) {
      embed_job_ = nullptr;
      continue;
    }
    try {
      embed_batch_ = std::make_unique<EmbeddingBatch>(engine_, std::move(embed_job_->inputs), embed_job_->pooling);
    } catch (const Error& e) {
      fail(e.what(), false);
    }
  }
  if (!embed_job_) return;
  try {
    bool done = false;
    try {
      done = embed_batch_->step();
    } catch (const KvPagesExhausted&) {
      // Finished sequences kept for reuse (recurrent models) give their pages back first.
      if (gen_.kept_sequences() == 0) throw;
      gen_.release_kept_sequences();
      done = embed_batch_->step();
    }
    if (!done) return;
  } catch (const KvPagesExhausted& e) {
    return fail(e.what(), true);
  } catch (const std::exception& e) {
    return fail(e.what(), false);
  }
  ++metrics_.embedding_requests_total;
  metrics_.embedding_inputs_total += int64_t(embed_batch_->results().size());
  metrics_.embedding_tokens_total += embed_batch_->tokens();
  embed_job_->results = embed_batch_->results();
  embed_batch_.reset();
  std::exchange(embed_job_, nullptr)->complete();
}

void EngineWorker::cancel_all(Job& job) {
  for (size_t c = 0; c < job.ids_.size(); ++c)
    if (!job.finished_[c]) gen_.cancel(job.ids_[c]);
}

void EngineWorker::run() {
  using clock = std::chrono::steady_clock;
  for (;;) {
    std::vector<std::shared_ptr<Job>> fresh;
    std::vector<std::shared_ptr<EmbeddingJob>> fresh_embeds;
    bool end_all = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !incoming_.empty() || !active_.empty() || !embed_incoming_.empty() || embed_job_ ||
               !embed_waiting_.empty();
      });
      if (stop_) break;
      fresh.swap(incoming_);
      fresh_embeds.swap(embed_incoming_);
      end_all = end_all_;
    }
    if (end_all) {
      for (auto& job : fresh) job->push(Job::Event::ended(FinishReason::Length));
      fresh.clear();
      for (auto& job : active_) {
        cancel_all(*job);
        job->push(Job::Event::ended(FinishReason::Length));
      }
      active_.clear();
      fail_embeddings(fresh_embeds, "the server is shutting down");
    }
    for (auto& job : fresh) {
      if (job->cancelled()) continue;
      try {
        job->ids_ = job->choices > 1 ? gen_.add_choices(job->request, job->choices)
                                     : std::vector<uint64_t>{gen_.add(job->request)};
        job->finished_.assign(job->ids_.size(), false);
        job->unfinished_ = int(job->ids_.size());
        metrics_.prompt_tokens_total += int64_t(job->request.prompt.size());
        ++metrics_.requests_total;
        active_.push_back(job);
      } catch (const Error& e) {
        job->push(Job::Event::failed(e.what()));
      }
    }
    // Clients that went away: their sequences and pages are released now.
    for (auto it = active_.begin(); it != active_.end();) {
      Job& job = **it;
      if (job.cancelled()) {
        cancel_all(job);
        job.push(Job::Event::ended(FinishReason::Cancelled));
        it = active_.erase(it);
        continue;
      }
      if (job.some_choice_cancelled_.exchange(false)) {  // a choice whose stop string matched
        std::vector<int> which;
        {
          std::lock_guard<std::mutex> lock(job.mu_);
          which.swap(job.cancelled_choices_);
        }
        for (int c : which)
          if (c >= 0 && size_t(c) < job.ids_.size() && !job.finished_[size_t(c)]) {
            gen_.cancel(job.ids_[size_t(c)]);
            job.finished_[size_t(c)] = true;
            --job.unfinished_;
          }
        if (job.unfinished_ == 0) {
          it = active_.erase(it);
          continue;
        }
      }
      ++it;
    }
    step_embeddings(fresh_embeds);
    if (!gen_.idle()) {
      std::vector<GenerationEvent> events;
      try {
        events = gen_.step();
      } catch (const std::exception& e) {
        // The engine failed: every request in flight gets the error.
        for (auto& job : active_) {
          cancel_all(*job);
          job->push(Job::Event::failed(e.what()));
        }
        active_.clear();
      }
      const auto now = clock::now();
      for (GenerationEvent& ev : events) {
        auto it = std::find_if(active_.begin(), active_.end(), [&](const auto& j) { return j->choice_of(ev.id) >= 0; });
        if (it == active_.end()) continue;
        Job& job = **it;
        const int choice = job.choice_of(ev.id);
        if (job.finished_[size_t(choice)]) continue;
        if (!job.first_token_seen_) {
          job.first_token_seen_ = true;
          metrics_.time_to_first_token.observe(std::chrono::duration<double>(now - job.submitted).count());
        } else {
          metrics_.inter_token_latency.observe(std::chrono::duration<double>(now - job.last_token_).count());
        }
        job.last_token_ = now;
        ++metrics_.generated_tokens_total;
        const bool done = ev.finish != FinishReason::None;
        Job::Event out = Job::Event::of(std::move(ev));
        out.choice = choice;
        job.push(std::move(out));
        if (done) {
          job.finished_[size_t(choice)] = true;
          if (--job.unfinished_ == 0) active_.erase(it);
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // submit() counts under this lock too
      pending_ = gen_.waiting() + incoming_.size();
      embed_pending_ = embed_waiting_.size() + embed_incoming_.size();
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
    cancel_all(*job);
    job->push(Job::Event::failed("the server is shutting down"));
  }
  active_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_embeddings(embed_incoming_, "the server is shutting down");
  }
}

void EngineWorker::fail_embeddings(std::vector<std::shared_ptr<EmbeddingJob>>& fresh, const std::string& why) {
  for (auto& job : fresh) embed_waiting_.push_back(std::move(job));
  fresh.clear();
  if (embed_job_) embed_waiting_.push_front(std::exchange(embed_job_, nullptr));
  embed_batch_.reset();
  for (auto& job : embed_waiting_) {
    job->error = why;
    job->busy = true;
    job->complete();
  }
  embed_waiting_.clear();
}

}  // namespace tessera::server
