#include "server/exchange.h"

#include <cstdio>
#include <random>

namespace tessera::server {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse_event(const std::string& name, const json& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, (unsigned long long)(salt ^ (++counter * 0x9e3779b97f4a7c15ull)));
  return buf;
}

Exchange::Exchange(ParsedRequest r, ResponseIds i, const Tokenizer& t)
    : req(std::move(r)), ids(std::move(i)), tok(t), answer(t, req.stop, req.tool_format, req.tools) {}

AnswerDelta Exchange::advance(const std::vector<Job::Event>& events, const char*& finish, std::string& error) {
  AnswerDelta out;
  auto add = [&](AnswerDelta d) {
    out.content += d.content;
    out.reasoning += d.reasoning;
    for (auto& t : d.tokens) out.tokens.push_back(std::move(t));
    for (auto& c : d.tool_calls) out.tool_calls.push_back(std::move(c));
  };
  for (const Job::Event& e : events) {
    if (finished) break;
    if (e.choice >= 0 && e.choice != choice) continue;  // another choice's
    if (!e.error.empty()) {
      error = e.error;
      finished = true;
      break;
    }
    if (e.token >= 0) {
      ++completion_tokens;
      add(answer.push(e.token, e.logprobs));
      if (answer.stopped()) {
        job->cancel_choice(choice);  // the stop string ends it; the worker frees its pages
        add(answer.finish());
        finish = "stop";
        stop_string = true;
        finished = true;
        break;
      }
    }
    if (e.finish != FinishReason::None) {
      add(answer.finish());
      finish = openai_finish_reason(e.finish, false);
      ended = e.finish;
      finished = true;
    }
  }
  if (!out.tool_calls.empty()) {
    if (!req.parallel_tool_calls) out.tool_calls.resize(1);
    finish = "tool_calls";
  }
  return out;
}

json Exchange::logprobs(const std::vector<AnswerToken>& tokens) const {
  return req.logprobs ? logprobs_json(tokens, tok, req.chat, req.top_logprobs) : json(nullptr);
}

}  // namespace tessera::server
