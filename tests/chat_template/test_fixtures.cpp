// Every fixture template x conversation renders exactly as Hugging Face's
// apply_chat_template rendered it (../shared/fixtures/chat_templates/expected.json), or
// raises the same error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tessera/chat_template.h"

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

struct Pair {
  std::string tmpl, conversation;
};

std::vector<Pair> pairs() {
  std::vector<Pair> out;
  if (!fs::exists(kDir / "expected.json")) return {{"", ""}};  // one test that skips with the reason
  ojson expected = ojson::parse(slurp(kDir / "expected.json"));
  for (auto it = expected.begin(); it != expected.end(); ++it)
    for (auto c = it.value()["cases"].begin(); c != it.value()["cases"].end(); ++c) out.push_back({it.key(), c.key()});
  return out;
}

std::string test_name(const testing::TestParamInfo<Pair>& info) {
  if (info.param.tmpl.empty()) return "fixtures_missing";
  std::string n = info.param.tmpl + "__" + info.param.conversation;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

std::tm date_of(const std::string& ymd) {
  std::tm t{};
  t.tm_year = std::stoi(ymd.substr(0, 4)) - 1900;
  t.tm_mon = std::stoi(ymd.substr(5, 2)) - 1;
  t.tm_mday = std::stoi(ymd.substr(8, 2));
  return t;
}

class ChatTemplateFixture : public testing::TestWithParam<Pair> {};

TEST_P(ChatTemplateFixture, RendersLikeHuggingFace) {
  const Pair& p = GetParam();
  if (p.tmpl.empty()) GTEST_SKIP() << "shared fixtures missing: " << kDir << " (see ../shared/fixtures/README.md)";
  ojson expected = ojson::parse(slurp(kDir / "expected.json"))[p.tmpl];
  ojson cases = ojson::parse(slurp(kDir / "cases.json"));
  ojson want = expected["cases"][p.conversation];

  ojson vars = cases["cases"][p.conversation];
  vars["bos_token"] = expected["bos_token"];
  vars["eos_token"] = expected["eos_token"];
  tessera::RenderOptions options;
  options.now = date_of(cases["strftime_now_date"].get<std::string>());

  tessera::ChatTemplate tmpl(slurp(kDir / "templates" / (p.tmpl + ".jinja")));
  if (want.contains("text")) {
    EXPECT_EQ(tmpl.render(vars, options), want["text"].get<std::string>());
  } else {
    // expected.json words errors as Python prints them: "TemplateError: <message>".
    try {
      std::string text = tmpl.render(vars, options);
      ADD_FAILURE() << "rendered instead of raising " << want["error"] << ":\n" << text;
    } catch (const tessera::ChatTemplateError& e) {
      EXPECT_EQ(e.kind(), tessera::ChatTemplateError::Kind::Raised) << e.what();
      EXPECT_EQ("TemplateError: " + std::string(e.what()), want["error"].get<std::string>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPairs, ChatTemplateFixture, testing::ValuesIn(pairs()), test_name);

// The nlohmann::json overload works too, with keys sorted (std::map): tojson then prints
// them sorted, which is why ordered_json is the one for byte-exact renderings.
TEST(ChatTemplateFixtureApi, PlainJsonSortsKeys) {
  tessera::ChatTemplate t("{{ x | tojson }}");
  nlohmann::json vars = {{"x", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(t.render(vars), "{\"a\": 2, \"b\": 1}");
  ojson ovars = ojson::parse(R"({"x": {"b": 1, "a": 2}})");
  EXPECT_EQ(t.render(ovars), "{\"b\": 1, \"a\": 2}");
}

}  // namespace
