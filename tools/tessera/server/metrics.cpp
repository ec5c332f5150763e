#include "server/metrics.h"

#include <cstdio>

namespace tessera::server {

namespace {
std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
std::string gauge(const char* name, const char* type, const char* help, int64_t v) {
  return std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         std::to_string(v) + "\n";
}
}  // namespace

void Histogram::observe(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  ++counts_[b];
  sum_ += seconds;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out = "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cum = 0;
  for (size_t b = 0; b < kBounds.size(); ++b) {
    cum += counts_[b];
    out += name + "_bucket{le=\"" + number(kBounds[b]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_[kBounds.size()];
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
  return out;
}

std::string Metrics::render() const {
  std::string out;
  out += gauge("tessera_requests_running", "gauge", "Requests generating now.", requests_running);
  out += gauge("tessera_requests_waiting", "gauge", "Requests queued for admission.", requests_waiting);
  out += gauge("tessera_kv_pages_used", "gauge", "KV cache pages held by sequences.", kv_pages_used);
  out += gauge("tessera_kv_pages_total", "gauge", "KV cache pages in the pool.", kv_pages_total);
  out += gauge("tessera_prompt_tokens_total", "counter", "Prompt tokens of finished and running requests.",
               prompt_tokens_total);
  out += gauge("tessera_generated_tokens_total", "counter", "Tokens generated.", generated_tokens_total);
  out += gauge("tessera_prefix_cache_hit_tokens_total", "counter",
               "Prompt tokens whose KV came from the prefix cache.", prefix_cache_hit_tokens_total);
  out += gauge("tessera_spec_drafted_tokens_total", "counter", "Tokens proposed by the speculative drafter.",
               spec_drafted_tokens_total);
  out += gauge("tessera_spec_accepted_tokens_total", "counter", "Drafted tokens the verification accepted.",
               spec_accepted_tokens_total);
  out += gauge("tessera_requests_total", "counter", "Generation requests accepted.", requests_total);
  out += gauge("tessera_request_errors_total", "counter", "Requests answered with an error.", request_errors_total);
  out += gauge("tessera_plan_cache_hits_total", "counter",
               "Forward steps whose graph shape had a plan (validation, placement, fusion) already.",
               plan_cache_hits_total);
  out += gauge("tessera_plan_cache_misses_total", "counter", "Forward steps that made a plan for a new graph shape.",
               plan_cache_misses_total);
  out += gauge("tessera_requests_cancelled_total", "counter", "Requests cancelled because their client went away.",
               requests_cancelled_total);
  out += gauge("tessera_embedding_requests_total", "counter", "Embedding requests answered.", embedding_requests_total);
  out += gauge("tessera_embedding_inputs_total", "counter", "Inputs embedded (a request may hold many).",
               embedding_inputs_total);
  out += gauge("tessera_embedding_tokens_total", "counter", "Tokens of the inputs embedded.", embedding_tokens_total);
  out += gauge("tessera_http_connections_open", "gauge", "HTTP connections being served.", http_connections_open);
  out += gauge("tessera_http_connections_refused_total", "counter",
               "Connections answered 503 beyond --max-connections.", http_connections_refused_total);
  out += gauge("tessera_http_requests_refused_total", "counter",
               "Requests refused by a limit: body or headers too large (413, 431), too slow (408).",
               http_requests_refused_total);
  out += time_to_first_token.render("tessera_time_to_first_token_seconds",
                                    "From a request's arrival to its first generated token.");
  out += inter_token_latency.render("tessera_inter_token_latency_seconds", "Between consecutive generated tokens.");
  return out;
}

}  // namespace tessera::server
