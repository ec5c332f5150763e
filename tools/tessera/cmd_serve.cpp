// tessera serve: the OpenAI-compatible HTTP server (server/http_api.h) over one
// Engine and its Generator (server/engine_worker.h), on a GuardedServer (limits on
// connections, request sizes and times). It binds first, so /health answers 503 while
// the model loads, then prints "listening on http://HOST:PORT". SIGTERM or SIGINT
// drains: new generation requests get 503, running ones finish (or are ended with a
// final event at --shutdown-timeout), then the process exits 0.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <httplib.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_common.h"
#include "server/chat_prompt.h"
#include "server/engine_worker.h"
#include "server/grammar_cache.h"
#include "server/guarded_server.h"
#include "server/harmony_answer.h"
#include "server/http_api.h"
#include "server/tool_calls.h"
#include "tessera/embedder.h"
#include "tessera/error.h"
#include "tessera/expert_stream.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {
namespace {

// SIGTERM and SIGINT write a byte here; the main thread reads it (a handler may do
// nothing more).
int g_signal_pipe[2] = {-1, -1};
void on_signal(int) {
  const int saved = errno;
  const char c = 1;
  [[maybe_unused]] ssize_t r = ::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

// Waits up to `timeout` (forever when negative) for a signal; true if one came.
bool wait_for_signal(std::chrono::milliseconds timeout) {
  pollfd p{g_signal_pipe[0], POLLIN, 0};
  int r;
  do r = ::poll(&p, 1, timeout.count() < 0 ? -1 : int(timeout.count()));
  while (r < 0 && errno == EINTR);  // the signal itself interrupts the wait; its byte is there now
  if (r <= 0) return false;
  char buf[16];
  [[maybe_unused]] ssize_t n = ::read(g_signal_pipe[0], buf, sizeof buf);
  return true;
}

// Every connection holds a descriptor: raise the soft limit as far as the hard one
// allows, and lower the bound (with a warning) if even that is too low.
size_t fit_connections_to_fd_limit(size_t wanted) {
  constexpr size_t kReserve = 64;  // model files, plugins, pipes, the listener
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return wanted;
  const rlim_t need = rlim_t(wanted + kReserve);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    const size_t fit = rl.rlim_cur > kReserve + 1 ? size_t(rl.rlim_cur) - kReserve : 1;
    std::fprintf(stderr, "[warning] --max-connections %zu needs %zu file descriptors; the limit (ulimit -n) is %llu: "
                 "using %zu\n", wanted, wanted + kReserve, (unsigned long long)rl.rlim_cur, fit);
    return fit;
  }
  return wanted;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CommonOptions o;
  std::string host = "127.0.0.1", api_key, template_file, max_body = "8M", pooling;
  int port = 8080, queue = 64;
  int64_t max_connections = 1024, max_header_bytes = 16384, max_headers = 100, max_tokens_limit = 0;
  int64_t read_timeout = 10, idle_timeout = 5, write_timeout = 10;
  double shutdown_timeout = 30;
  po::options_description desc("options");
  desc.add_options()
    ("host", po::value(&host)->default_value("127.0.0.1"), "address to listen on")
    ("port", po::value(&port)->default_value(8080), "TCP port (0 = any free port; the one chosen is printed)")
    ("parallel", po::value(&o.parallel)->default_value(8), "sequences generated at once (each holds --ctx positions of KV cache)")
    ("queue", po::value(&queue)->default_value(64), "requests waiting beyond the running ones before 503")
    ("api-key", po::value(&api_key), "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every route but /health")
    ("chat-template", po::value(&template_file), "Jinja chat template file (default: the model's tokenizer.chat_template); "
                                                 "it also decides how answers are parsed for tool calls (<tool_call> blocks, "
                                                 "Llama 3 JSON, Mistral [TOOL_CALLS], gpt-oss's harmony channels, whose "
                                                 "analysis becomes reasoning_content)")
    ("pooling", po::value(&pooling), "how /v1/embeddings pools a text's final hidden states: mean or last (token); "
                                     "default: the model's pooling_type metadata, else last")
    ("max-tokens-limit", po::value(&max_tokens_limit)->default_value(0),
     "the most tokens one answer may have: max_tokens -1 (the rest of the context) and larger values are "
     "lowered to it (0 = the context)")
    ("max-connections", po::value(&max_connections)->default_value(1024),
     "open HTTP connections (each has a thread while open); more are answered 503 at once")
    ("max-body", po::value(&max_body)->default_value("8M"), "largest request body (bytes, or K/M/G); larger: 413")
    ("max-header-bytes", po::value(&max_header_bytes)->default_value(16384),
     "largest request line and headers together; larger: 431")
    ("max-headers", po::value(&max_headers)->default_value(100), "most header lines in a request; more: 431")
    ("read-timeout", po::value(&read_timeout)->default_value(10),
     "seconds a client has to send a whole request (line, headers, body) from its first byte (or from connecting); "
     "slower: 408 and closed")
    ("idle-timeout", po::value(&idle_timeout)->default_value(5), "seconds a kept-alive connection may wait for its next request")
    ("write-timeout", po::value(&write_timeout)->default_value(10),
     "seconds a client may take no data before it is dropped (its request cancelled)")
    ("shutdown-timeout", po::value(&shutdown_timeout)->default_value(30),
     "on SIGTERM/SIGINT: seconds running requests have to finish; then each is ended (a stream with its final "
     "chunk, finish_reason \"length\", and [DONE]) and the process exits 0");
  SpecOptions spec;
  add_spec_options(desc, spec);
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera serve [-m MODEL] [--host H] [--port P] [--parallel N] [--ctx N] [options]\n"
             "OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions (streaming, logprobs,\n"
             "tools), POST /v1/embeddings, POST /v1/responses (stateless), GET /v1/models, /health, /metrics;\n"
             "Anthropic's POST /v1/messages (streaming, tools) and /v1/messages/count_tokens (docs/server.md)",
             desc, nullptr, vm))
    return 0;
  if (port < 0 || port > 65535) throw Error("--port must be in [0, 65535]");
  if (queue < 0) throw Error("--queue must be >= 0");
  std::optional<Pooling> pooling_override;
  if (!pooling.empty() && !(pooling_override = parse_pooling(pooling)))
    throw Error("--pooling must be mean or last, not '" + printable(pooling, 40) + "'");
  if (o.parallel < 1) throw Error("--parallel must be >= 1");
  if (max_tokens_limit < 0) throw Error("--max-tokens-limit must be >= 0 (0 = the context)");
  if (max_connections < 1) throw Error("--max-connections must be >= 1");
  if (max_header_bytes < 256) throw Error("--max-header-bytes must be >= 256");
  if (max_headers < 1) throw Error("--max-headers must be >= 1");
  auto seconds = [](int64_t v, const char* flag) {
    if (v < 1 || v > 86400) throw Error(std::string("--") + flag + " must be in [1, 86400] seconds");
    return std::chrono::seconds(v);
  };
  server::HttpLimits limits;
  limits.read_timeout = seconds(read_timeout, "read-timeout");
  limits.idle_timeout = seconds(idle_timeout, "idle-timeout");
  limits.write_timeout = seconds(write_timeout, "write-timeout");
  if (!(shutdown_timeout >= 0 && shutdown_timeout <= 86400)) throw Error("--shutdown-timeout must be in [0, 86400] seconds");
  limits.max_body_bytes = size_t(parse_byte_size(max_body));
  if (limits.max_body_bytes < 1024) throw Error("--max-body must be at least 1K");
  limits.max_header_bytes = size_t(max_header_bytes);
  limits.max_headers = size_t(max_headers);
  limits.max_connections = fit_connections_to_fd_limit(size_t(max_connections));
  std::string template_text;
  if (!template_file.empty()) {
    template_text = read_text_file(template_file, "the chat template");
  }

  server::Metrics metrics;
  server::GuardedServer svr(limits, metrics);
  server::HttpApi api(api_key);
  svr.set_tcp_nodelay(true);
  api.install(svr);
  if (port == 0) {
    port = svr.bind_to_any_port(host);
    if (port < 0) throw Error("cannot listen on " + host);
  } else if (!svr.bind_to_port(host, port)) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("cannot create a pipe");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  // The listener ending on its own (it failed) ends the wait below like a signal.
  std::thread http([&] {
    svr.listen_after_bind();
    on_signal(0);
  });
  auto finish = [&] {
    svr.close_all();
    http.join();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  };

  std::unique_ptr<Engine> engine;
  std::unique_ptr<Drafter> drafter;  // after the engine (a draft model shares its pool), before the worker
  std::unique_ptr<server::EngineWorker> worker;
  try {
    auto reg = make_registry(o);
    engine = make_engine(*reg, o);
    const MemoryPlan& plan = engine->memory_plan();
    std::fprintf(stderr, "%s; %s\n", plan.budget.describe().c_str(), plan.describe().c_str());
    server::ModelContext mc;
    mc.tokenizer = &engine->tokenizer();
    mc.n_vocab = engine->n_vocab();
    mc.n_ctx = engine->n_ctx();
    mc.max_tokens_limit = max_tokens_limit;
    // The file's name without .gguf, or a checkpoint folder's whole name ("Qwen3-0.6B").
    std::filesystem::path mp = std::filesystem::path(engine->file().path()).lexically_normal();
    if (!mp.has_filename()) mp = mp.parent_path();  // "folder/"
    mc.model_id = engine->file().format() == "safetensors" ? mp.filename().string() : mp.stem().string();
    if (template_text.empty())
      template_text = engine->file().metadata().get_string("tokenizer.chat_template").value_or("");
    if (!template_text.empty()) {
      mc.render_chat = server::make_chat_renderer(template_text, *mc.tokenizer);
      mc.tool_format = server::detect_tool_call_format(template_text);
    }
    // Harmony's markers are text to the answer parser, and so to grammars (a forced
    // call is written with them).
    const std::vector<int32_t> shown = mc.tool_format == server::ToolCallFormat::Harmony
                                           ? server::harmony_marker_tokens(*mc.tokenizer)
                                           : std::vector<int32_t>{};
    mc.grammars = std::make_shared<server::GrammarCache>(std::make_shared<const TokenVocabulary>(*mc.tokenizer, shown));
    drafter = make_drafter(*reg, o, spec, *engine);
    mc.spec_max = drafter ? spec.spec_max : 0;
    GeneratorOptions go;
    go.max_running = o.parallel;
    go.drafter = drafter.get();
    worker = std::make_unique<server::EngineWorker>(*engine, go, size_t(queue), metrics);
    server::EmbeddingContext ec;
    ec.n_embd = engine->n_embd();
    ec.add_eos = tokenizer_adds_eos(engine->file());
    try {
      ec.pooling = pooling_override ? *pooling_override : model_pooling(engine->file());
    } catch (const Error& e) {
      ec.unavailable = std::string(e.what()) + " (choose one with --pooling)";
    }
    api.attach(worker.get(), &metrics, std::move(mc), std::move(ec));
  } catch (...) {
    finish();
    throw;
  }
  std::printf("listening on http://%s:%d\n", host.c_str(), port);
  std::fflush(stdout);

  // Serve until a signal, then drain.
  using Clock = std::chrono::steady_clock;
  wait_for_signal(std::chrono::milliseconds(-1));
  const auto start = Clock::now();
  api.begin_drain();
  svr.begin_drain();
  // Running requests get the timeout less a little time to write their final events.
  const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(shutdown_timeout));
  const auto end_at = start + timeout - std::min<Clock::duration>(std::chrono::seconds(1), timeout / 2);
  bool again = false;  // a second signal ends the requests at once
  while (api.in_flight() > 0 && Clock::now() < end_at && !again)
    again = wait_for_signal(std::chrono::milliseconds(20));
  if (api.in_flight() > 0) {
    std::fprintf(stderr, "shutting down: ending %lld running requests\n", (long long)api.in_flight());
    worker->end_all();
    while (api.in_flight() > 0 && Clock::now() < start + timeout) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  finish();
  worker->stop();
  return 0;
}

}  // namespace tessera::cli
