// One generation request while its answer is produced, shared by every API's routes
// (OpenAI's, Anthropic's): the parsed request, the engine's job, and the answer
// pipeline that turns the job's events into content and tool calls.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/answer_stream.h"
#include "server/engine_worker.h"
#include "server/openai_api.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::server {

// JSON text of a response: generated text can hold invalid UTF-8 (a model may emit
// any byte); JSON gets U+FFFD.
std::string dump(const nlohmann::json& j);

// One Server-Sent Event with a name: "event: NAME\ndata: JSON\n\n".
std::string sse_event(const std::string& name, const nlohmann::json& data);

// A response id: `prefix` and 16 hex digits, unique within the process.
std::string new_id(const char* prefix);

// Counts one generation response from its handler until its last byte is written
// (a streamed one's provider holds it).
struct InFlight {
  std::shared_ptr<std::atomic<int64_t>> count;
  explicit InFlight(std::shared_ptr<std::atomic<int64_t>> c) : count(std::move(c)) { ++*count; }
  ~InFlight() { --*count; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
};

// Everything one generation request needs while its answer is produced.
struct Exchange {
  ParsedRequest req;
  ResponseIds ids;
  std::shared_ptr<Job> job;
  const Tokenizer& tok;
  AnswerStream answer;
  int64_t completion_tokens = 0;
  int choice = 0;  // which of the job's choices this answer is (OpenAI's n)
  bool role_sent = false, finished = false;
  // Once finished: why the engine ended the answer (None when a stop string did, or
  // on an error), and whether a stop string did (answer.stop_sequence() says which).
  FinishReason ended = FinishReason::None;
  bool stop_string = false;
  Exchange(ParsedRequest r, ResponseIds i, const Tokenizer& t);
  // Feed the job's events (another choice's are skipped); returns what to send and
  // sets `finish` (OpenAI's finish reason) when done.
  AnswerDelta advance(const std::vector<Job::Event>& events, const char*& finish, std::string& error);
  nlohmann::json logprobs(const std::vector<AnswerToken>& tokens) const;
};

}  // namespace tessera::server
