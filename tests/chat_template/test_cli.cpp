// `tessera chat-template` as a user runs it: the fixture rendering byte for byte on
// stdout, the template's error as one line on stderr with status 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const fs::path kDir = fs::path(TESSERA_FIXTURES_DIR) / "chat_templates";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Result {
  int status = -1;
  std::string out, err;
};

fs::path scratch() {
  fs::path d = fs::path(testing::TempDir()) / ("tessera_chat_template_cli_" + std::to_string(getpid()) + "_" +
                                               testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::create_directories(d);
  return d;
}

Result run(const std::string& args) {
  fs::path d = scratch();
  std::string cmd = std::string(TESSERA_BIN_DIR) + "/tessera chat-template " + args + " >" + (d / "out").string() +
                    " 2>" + (d / "err").string();
  int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(d / "out"), slurp(d / "err")};
}

// Writes the variables of one fixture case (with the template's BOS/EOS) to a file.
fs::path context_file(const std::string& tmpl, const std::string& conversation) {
  ojson cases = ojson::parse(slurp(kDir / "cases.json"));
  ojson expected = ojson::parse(slurp(kDir / "expected.json"));
  ojson vars = cases["cases"][conversation];
  vars["bos_token"] = expected[tmpl]["bos_token"];
  vars["eos_token"] = expected[tmpl]["eos_token"];
  fs::path p = scratch() / (conversation + ".json");
  std::ofstream(p) << vars.dump(1);
  return p;
}

#define REQUIRE_FIXTURES()                                                                 \
  if (!fs::exists(kDir / "expected.json"))                                                 \
  GTEST_SKIP() << "shared fixtures missing: " << kDir << " (see ../shared/fixtures/README.md)"

TEST(ChatTemplateCli, RendersAFixtureByteForByte) {
  REQUIRE_FIXTURES();
  for (const char* tmpl : {"Qwen-Qwen3-0.6B", "ibm-granite-granite-3.3-2B-Instruct"}) {
    ojson expected = ojson::parse(slurp(kDir / "expected.json"));
    fs::path ctx = context_file(tmpl, "tool_round_trip");
    Result r = run((kDir / "templates" / (std::string(tmpl) + ".jinja")).string() + " " + ctx.string() + " --now 2024-07-26");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.out, expected[tmpl]["cases"]["tool_round_trip"]["text"].get<std::string>()) << tmpl;
  }
}

TEST(ChatTemplateCli, TemplateErrorIsOneLineAndStatusOne) {
  REQUIRE_FIXTURES();
  fs::path ctx = context_file("google-gemma-2-2b-it", "system_user");
  Result r = run((kDir / "templates" / "google-gemma-2-2b-it.jinja").string() + " " + ctx.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "tessera chat-template: error: System role not supported\n");
}

TEST(ChatTemplateCli, MultiLineMessagesStayOnOneLine) {
  fs::path d = scratch();
  std::ofstream(d / "t.jinja") << "{{ raise_exception('first\\nsecond') }}";
  std::ofstream(d / "c.json") << "{}";
  Result r = run((d / "t.jinja").string() + " " + (d / "c.json").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "tessera chat-template: error: first\\nsecond\n");
}

TEST(ChatTemplateCli, SyntaxErrorNamesTheFileAndLine) {
  fs::path d = scratch();
  std::ofstream(d / "t.jinja") << "ok\n{% if x %}\n";
  std::ofstream(d / "c.json") << "{}";
  Result r = run((d / "t.jinja").string() + " " + (d / "c.json").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("t.jinja: chat template syntax error, line 2"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(ChatTemplateCli, NoNewlineIsAdded) {
  fs::path d = scratch();
  std::ofstream(d / "t.jinja") << "{{ greeting }}, {{ strftime_now('%d %b %Y') }}";
  std::ofstream(d / "c.json") << R"({"greeting": "Grüße"})";
  Result r = run((d / "t.jinja").string() + " " + (d / "c.json").string() + " --now 2024-07-26");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Grüße, 26 Jul 2024");
}

TEST(ChatTemplateCli, BadInputsAreOneLineErrors) {
  fs::path d = scratch();
  std::ofstream(d / "t.jinja") << "x";
  std::ofstream(d / "bad.json") << "{not json";
  std::ofstream(d / "list.json") << "[1]";
  for (const std::string& args : {(d / "missing.jinja").string() + " " + (d / "bad.json").string(),
                                  (d / "t.jinja").string() + " " + (d / "bad.json").string(),
                                  (d / "t.jinja").string() + " " + (d / "list.json").string(),
                                  (d / "t.jinja").string() + " " + (d / "list.json").string() + " --now 2024-13-01",
                                  (d / "t.jinja").string()}) {
    Result r = run(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("tessera chat-template: error: ", 0), 0u) << r.err;
  }
}

TEST(ChatTemplateCli, HelpTellsTheUsage) {
  Result r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("usage: tessera chat-template TEMPLATE.jinja CONTEXT.json [--now YYYY-MM-DD]"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--now"), std::string::npos);
  Result top = run("");  // `tessera chat-template` alone: missing arguments
  EXPECT_NE(top.status, 0);
}

}  // namespace
