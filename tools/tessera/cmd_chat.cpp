// tessera chat: an interactive terminal chat. Each turn renders the whole
// conversation with the chat template and runs it as one Generator request; the
// pages of the conversation so far come from the prefix cache (or, for models with
// recurrent layers, the previous turn's kept sequence), so only the new text is
// computed. Ctrl-C stops the current answer; /reset forgets the conversation;
// /exit or end of input leaves.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "server/chat_prompt.h"
#include "server/openai_api.h"
#include "server/text_stream.h"
#include "tessera/error.h"
#include "tessera/generator.h"
#include "tessera/model_file.h"
#include "tessera/tokenizer.h"

namespace tessera::cli {
namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

}  // namespace

int cmd_chat(int argc, char** argv) {
  CommonOptions o;
  SamplerParams sp;
  int64_t seed = -1;
  int n_predict = 512;
  std::string system, template_file;
  po::options_description desc("options");
  desc.add_options()
    ("system", po::value(&system), "a system message that opens the conversation")
    ("chat-template", po::value(&template_file), "Jinja chat template file (default: the model's tokenizer.chat_template)")
    ("n-predict,n", po::value(&n_predict)->default_value(512), "tokens per answer at most")
    ("seed", po::value(&seed)->default_value(-1), "random seed (-1 = random)");
  add_sampling_options(desc, sp);
  SpecOptions spec;
  add_spec_options(desc, spec);
  add_common_options(desc, o, true);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera chat [-m MODEL] [--system TEXT] [--chat-template FILE] [sampling options]\n"
             "Type a message and press Enter. Ctrl-C stops an answer, /reset starts over, /exit (or Ctrl-D) leaves.",
             desc, nullptr, vm))
    return 0;
  if (n_predict < 1) throw Error("-n must be >= 1");
  sp.seed = seed >= 0 ? uint64_t(seed) : std::random_device{}();
  { Sampler check(sp); }

  auto reg = make_registry(o);
  auto engine = make_engine(*reg, o);
  const Tokenizer& tok = engine->tokenizer();
  std::string template_text;
  if (!template_file.empty()) {
    template_text = read_text_file(template_file, "the chat template");
  } else {
    template_text = engine->file().metadata().get_string("tokenizer.chat_template").value_or("");
  }
  if (template_text.empty())
    throw Error(engine->file().path() + " has no chat template (tokenizer.chat_template); give one with --chat-template");
  auto render = server::make_chat_renderer(template_text, tok);
  const std::unique_ptr<Drafter> drafter = make_drafter(*reg, o, spec, *engine);
  GeneratorOptions go;
  go.drafter = drafter.get();
  Generator gen(*engine, go);

  std::signal(SIGINT, on_sigint);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  auto reset = [&] {
    messages = nlohmann::ordered_json::array();
    if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  };
  reset();
  int turn = 0;
  for (;;) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      std::fprintf(stderr, "[conversation cleared]\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    std::vector<int32_t> prompt;
    try {
      const std::string text = render(messages, nullptr);
      const bool bos = tok.add_bos_default() && tok.bos() >= 0 && text.rfind(tok.token_to_piece(tok.bos(), true), 0) != 0;
      prompt = tok.encode_with_special(text, bos);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[%s]\n", e.what());
      messages.erase(messages.size() - 1);
      continue;
    }
    if (int64_t(prompt.size()) + 1 >= engine->n_ctx()) {
      std::fprintf(stderr, "[the conversation (%zu tokens) fills the context of %lld: /reset to start over]\n",
                   prompt.size(), (long long)engine->n_ctx());
      messages.erase(messages.size() - 1);
      continue;
    }
    GenerationRequest req;
    req.prompt = prompt;
    req.sampling = sp;
    req.sampling.seed = sp.seed + uint64_t(turn);
    req.spec_max = drafter ? spec.spec_max : 0;
    req.max_tokens = int(std::min<int64_t>(n_predict, engine->n_ctx() - int64_t(prompt.size())));
    const int64_t reused_before = gen.stats().prefix_tokens_reused;
    const uint64_t id = gen.add(std::move(req));
    server::TextStream out(tok, {});
    int generated = 0;
    bool stopped_by_user = false;
    const auto t0 = std::chrono::steady_clock::now();
    while (!gen.idle()) {
      if (g_interrupted) {
        gen.cancel(id);
        stopped_by_user = true;
        break;
      }
      for (const GenerationEvent& ev : gen.step()) {
        if (ev.token >= 0) {
          ++generated;
          std::fputs(out.push(ev.token).c_str(), stdout);
          check_stdout();  // a failed write ends the chat with an error
        }
      }
    }
    std::fputs(out.finish().c_str(), stdout);
    std::fputs("\n", stdout);
    check_stdout();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    messages.push_back({{"role", "assistant"}, {"content", out.text()}});
    ++turn;
    std::fprintf(stderr, "[turn %d: prompt %zu tokens, %lld of them reused from earlier turns; %d generated in %.2f s%s]\n",
                 turn, prompt.size(), (long long)(gen.stats().prefix_tokens_reused - reused_before), generated, dt,
                 stopped_by_user ? "; stopped" : "");
  }
  std::signal(SIGINT, SIG_DFL);
  return 0;
}

}  // namespace tessera::cli
