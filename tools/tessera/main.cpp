// `tessera`: the command line. Each subcommand lives in its own cmd_*.cpp.
#include <cstdio>
#include <cstring>
#include <iostream>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "rank_worker.h"
#include "tessera/mpi_run.h"
#include "tessera/error.h"
#include "tessera/model.h"
#include "tessera/model_file.h"

namespace tessera::cli {
int cmd_run(int argc, char** argv);
int cmd_backends(int argc, char** argv);
int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_conformance(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_embed(int argc, char** argv);
}  // namespace tessera::cli

namespace {

struct Command {
  const char* name;
  int (*fn)(int, char**);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"run", tessera::cli::cmd_run, "generate text from a prompt (streams to stdout)"},
    {"backends", tessera::cli::cmd_backends, "list every plugin found: score, usable or why not, rank"},
    {"info", tessera::cli::cmd_info, "print a model's architecture, hyperparameters and tensors"},
    {"tokenize", tessera::cli::cmd_tokenize, "print the token ids of a text"},
    {"logits", tessera::cli::cmd_logits, "write the logits of a token list (batched prefill) to a file"},
    {"embed", tessera::cli::cmd_embed, "print the embedding (pooled final hidden state) of each text"},
    {"bench", tessera::cli::cmd_bench, "measure prefill and decode tokens/s"},
    {"conformance", tessera::cli::cmd_conformance, "check backends op by op against the cpu_scalar oracle"},
    {"chat-template", tessera::cli::cmd_chat_template, "render a chat template (Jinja2) with a JSON file's variables"},
    {"serve", tessera::cli::cmd_serve, "serve the model over an OpenAI-compatible HTTP API"},
    {"chat", tessera::cli::cmd_chat, "chat with the model in the terminal (its chat template, streaming)"},
};

void usage(std::ostream& os) {
  os << "tessera — a modular LLM inference runtime\n\n"
        "usage: tessera <command> [options]     (tessera <command> --help for its options)\n\ncommands:\n";
  for (const auto& c : kCommands) os << "  " << c.name << std::string(std::strlen(c.name) < 14 ? 14 - std::strlen(c.name) : 1, ' ') << c.summary << "\n";
  std::string archs;
  for (const std::string& a : tessera::Model::supported_architectures()) archs += (archs.empty() ? "" : ", ") + a;
  os << "\nmodels (-m): a GGUF file or a Hugging Face checkpoint folder; architectures: " << archs << "\n";
  os << "\nenvironment:\n"
        "  TESSERA_PLUGINS_TOML   plugins.toml to use\n"
        "  TESSERA_PLUGIN_PATH    extra plugin folders (colon-separated), searched first\n"
        "  TESSERA_DEFAULT_MODEL  model used when -m is not given\n";
}

}  // namespace

int run_command(int argc, char** argv);

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("tessera");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[%l] %v");
  spdlog::set_level(spdlog::level::warn);
  if (!tessera::dist::launched_with_ranks()) return run_command(argc, argv);

  // Started by mpirun as one of several processes (docs/distributed.md).
  try {
    tessera::cli::set_rank_group(tessera::dist::join());
  } catch (const std::exception& e) {
    std::cerr << "tessera: error: " << tessera::printable(e.what()) << "\n";
    return 1;
  }
  const int rank = tessera::cli::rank_group()->rank();
  int rc = 0;
  if (rank != 0) {
    rc = tessera::cli::run_rank_worker(argc > 1 ? argc - 1 : 0, argc > 1 ? argv + 1 : argv);
  } else {
    rc = run_command(argc, argv);
    try {
      tessera::cli::finish_ranks(rc);
    } catch (const std::exception& e) {
      std::cerr << "tessera: error: could not tell the other ranks to exit: " << tessera::printable(e.what()) << "\n";
      rc = rc ? rc : 1;
    }
  }
  tessera::cli::set_rank_group(nullptr);  // leaves MPI
  return rc;
}

int run_command(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(std::cout);
    std::cout.flush();
    if (std::fflush(stdout) != 0 || !std::cout) {
      std::cerr << "tessera: error: cannot write to standard output\n";
      return 1;
    }
    return 0;
  }
  // Messages can quote a file's metadata, tensor names or a plugin's strings: they are
  // escaped (no terminal control sequences, one line).
  for (const auto& c : kCommands) {
    if (cmd != c.name) continue;
    try {
      const int rc = c.fn(argc - 1, argv + 1);
      tessera::cli::check_stdout();  // a full disk or closed pipe is an error, not exit 0
      return rc;
    } catch (const tessera::Error& e) {
      std::cerr << "tessera " << cmd << ": error: " << tessera::printable(e.what()) << "\n";
    } catch (const std::bad_alloc&) {
      std::cerr << "tessera " << cmd << ": error: out of memory\n";
    } catch (const std::exception& e) {
      std::cerr << "tessera " << cmd << ": error: " << tessera::printable(e.what()) << "\n";
    }
    // Whatever is still buffered for stdout must not fail silently at exit either.
    std::cout.flush();
    std::fflush(stdout);
    return 1;
  }
  std::cerr << "tessera: unknown command '" << tessera::printable(cmd, 80) << "' (see tessera --help)\n";
  return 2;
}
