// tessera chat-template: renders a chat template (a Jinja2 file, as GGUF models carry in
// tokenizer.chat_template) with the variables of a JSON file, byte for byte on stdout.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_common.h"
#include "tessera/chat_template.h"
#include "tessera/error.h"

namespace tessera::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) throw Error(path + ": read error");
  return s.str();
}

// YYYY-MM-DD, optionally followed by HH:MM[:SS] (separated by 'T' or a space).
std::tm parse_now(const std::string& text) {
  std::tm t{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0, n = 0;
  int got = std::sscanf(text.c_str(), "%4d-%2d-%2d%n", &y, &mo, &d, &n);
  bool ok = got == 3;
  if (ok && static_cast<size_t>(n) < text.size()) {
    char sep = text[static_cast<size_t>(n)];
    int m = 0;
    std::string rest = text.substr(static_cast<size_t>(n) + 1);
    ok = (sep == 'T' || sep == ' ') &&
         ((std::sscanf(rest.c_str(), "%2d:%2d:%2d%n", &h, &mi, &s, &m) == 3 && static_cast<size_t>(m) == rest.size()) ||
          (std::sscanf(rest.c_str(), "%2d:%2d%n", &h, &mi, &m) == 2 && static_cast<size_t>(m) == rest.size()));
  }
  if (!ok || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
    throw Error("--now: expected YYYY-MM-DD (optionally with HH:MM[:SS]), got '" + text + "'");
  t.tm_year = y - 1900;
  t.tm_mon = mo - 1;
  t.tm_mday = d;
  t.tm_hour = h;
  t.tm_min = mi;
  t.tm_sec = s;
  return t;
}

std::string one_line(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\n')
      o += "\\n";
    else if (c == '\r')
      o += "\\r";
    else
      o += c;
  }
  return o;
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  std::string template_path, context_path, now;
  po::options_description desc("options");
  desc.add_options()
    ("template", po::value(&template_path)->required(), "the chat template, a Jinja2 file (first positional argument)")
    ("context", po::value(&context_path)->required(),
     "a JSON object with the template's variables: messages, tools, add_generation_prompt, bos_token, "
     "eos_token, enable_thinking ... (second positional argument)")
    ("now", po::value(&now), "the date strftime_now() sees: YYYY-MM-DD, optionally with HH:MM[:SS] "
                             "(default: the local time now)")
    ("help,h", "show this help");
  po::positional_options_description pos;
  pos.add("template", 1).add("context", 1);
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: tessera chat-template TEMPLATE.jinja CONTEXT.json [--now YYYY-MM-DD]\n\n"
             "Renders a chat template as Hugging Face's apply_chat_template does (Jinja2 with trim_blocks,\n"
             "lstrip_blocks, loop controls, tojson, raise_exception, strftime_now) and prints the text to\n"
             "stdout exactly, with no newline added. When the template raises an error (raise_exception or a\n"
             "run-time error) it prints that error on one line on stderr and exits with status 1.\n"
             "See docs/chat_templates.md for what is supported.",
             desc, &pos, vm))
    return 0;

  std::string source = read_file(template_path);
  nlohmann::ordered_json context;
  try {
    context = nlohmann::ordered_json::parse(read_file(context_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(context_path + ": invalid JSON: " + e.what());
  }
  if (!context.is_object()) throw Error(context_path + ": expected a JSON object with the template's variables");
  RenderOptions options;
  if (!now.empty()) options.now = parse_now(now);

  std::string text;
  try {
    ChatTemplate tmpl(source);
    text = tmpl.render(context, options);
  } catch (const ChatTemplateError& e) {
    std::string where = e.kind() == ChatTemplateError::Kind::Syntax ? template_path + ": " : "";
    throw Error(one_line(where + e.what()));
  }
  std::cout.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace tessera::cli
