// tessera serve: the OpenAI-compatible HTTP server (server/http_api.h) over one
// Engine and its Generator (server/engine_worker.h). It binds first, so /health
// answers 503 while the model loads, then prints "listening on http://HOST:PORT".
#include <httplib.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cli_common.h"
#include "server/chat_prompt.h"
#include "server/engine_worker.h"
#include "server/http_api.h"
#include "server/tool_calls.h"
#include "tessera/error.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {
namespace {

httplib::Server* g_server = nullptr;
void on_signal(int) {
  if (g_server) g_server->stop();
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  CommonOptions o;
  std::string host = "127.0.0.1", api_key, template_file;
  int port = 8080, queue = 64, http_threads = 0;
  po::options_description desc("options");
  desc.add_options()
    ("host", po::value(&host)->default_value("127.0.0.1"), "address to listen on")
    ("port", po::value(&port)->default_value(8080), "TCP port (0 = any free port; the one chosen is printed)")
    ("parallel", po::value(&o.parallel)->default_value(8), "sequences generated at once (each holds --ctx positions of KV cache)")
    ("queue", po::value(&queue)->default_value(64), "requests waiting beyond the running ones before 503")
    ("api-key", po::value(&api_key), "require 'Authorization: Bearer KEY' on every route but /health")
    ("chat-template", po::value(&template_file), "Jinja chat template file (default: the model's tokenizer.chat_template); "
                                                 "it also decides how tool calls in answers are parsed (<tool_call> blocks, "
                                                 "Llama 3 JSON, Mistral [TOOL_CALLS])")
    ("http-threads", po::value(&http_threads)->default_value(0), "HTTP connection threads (0 = 4 x --parallel + 8)");
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera serve [-m MODEL] [--host H] [--port P] [--parallel N] [--ctx N] [options]\n"
             "OpenAI-compatible HTTP server: POST /v1/completions, POST /v1/chat/completions (streaming, logprobs,\n"
             "tools), GET /v1/models, /health, /metrics (docs/server.md)",
             desc, nullptr, vm))
    return 0;
  if (port < 0 || port > 65535) throw Error("--port must be in [0, 65535]");
  if (queue < 0) throw Error("--queue must be >= 0");
  if (o.parallel < 1) throw Error("--parallel must be >= 1");
  if (http_threads < 0) throw Error("--http-threads must be >= 0");
  std::string template_text;
  if (!template_file.empty()) {
    template_text = read_text_file(template_file, "the chat template");
  }

  httplib::Server svr;
  const size_t threads = http_threads > 0 ? size_t(http_threads) : size_t(4 * o.parallel + 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(64 << 20);
  server::HttpApi api(api_key);
  api.install(svr);
  if (port == 0) {
    port = svr.bind_to_any_port(host);
    if (port < 0) throw Error("cannot listen on " + host);
  } else if (!svr.bind_to_port(host, port)) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + " (in use, or not an address here)");
  }
  std::thread http([&] { svr.listen_after_bind(); });
  g_server = &svr;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::EngineWorker> worker;
  server::Metrics metrics;
  try {
    auto reg = make_registry(o);
    engine = make_engine(*reg, o);
    const MemoryPlan& plan = engine->memory_plan();
    std::fprintf(stderr, "%s; %s\n", plan.budget.describe().c_str(), plan.describe().c_str());
    server::ModelContext mc;
    mc.tokenizer = &engine->tokenizer();
    mc.n_vocab = engine->n_vocab();
    mc.n_ctx = engine->n_ctx();
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
    GeneratorOptions go;
    go.max_running = o.parallel;
    worker = std::make_unique<server::EngineWorker>(*engine, go, size_t(queue), metrics);
    api.attach(worker.get(), &metrics, std::move(mc));
  } catch (...) {
    svr.stop();
    http.join();
    throw;
  }
  std::printf("listening on http://%s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  http.join();
  g_server = nullptr;
  worker->stop();
  return 0;
}

}  // namespace tessera::cli
