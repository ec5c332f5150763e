// Hostile templates: each one ends quickly with a clear error (never a hang, a crash or
// an exhausted memory).
#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "tessera/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;
using Kind = tessera::ChatTemplateError::Kind;

struct Outcome {
  bool rendered = false;
  Kind kind = Kind::Runtime;
  std::string message;
  double seconds = 0;
};

Outcome run(const std::string& src, const ojson& vars = ojson::object(), const tessera::RenderOptions& o = {}) {
  Outcome out;
  auto t0 = std::chrono::steady_clock::now();
  try {
    tessera::ChatTemplate t(src);
    t.render(vars, o);
    out.rendered = true;
  } catch (const tessera::ChatTemplateError& e) {
    out.kind = e.kind();
    out.message = e.what();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void expect_limit(const Outcome& r, const std::string& needle, Kind kind = Kind::Limit) {
  EXPECT_FALSE(r.rendered);
  EXPECT_EQ(r.kind, kind) << r.message;
  EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
  EXPECT_LT(r.seconds, 60.0) << r.message;  // generous for sanitizer builds: the point is "no hang"
}

TEST(ChatTemplateLimits, HugeRangeIsRefused) {
  expect_limit(run("{% for i in range(1000000000) %}x{% endfor %}"), "Range too big", Kind::Runtime);
}

TEST(ChatTemplateLimits, NestedLoopsStopAtTheStepBudget) {
  tessera::RenderOptions o;
  o.max_steps = 1'000'000;
  expect_limit(run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {}, o),
               "steps");
}

TEST(ChatTemplateLimits, DefaultStepBudgetEndsQuickly) {
  Outcome r = run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  expect_limit(r, "steps");
}

TEST(ChatTemplateLimits, InfiniteRecursionStops) {
  expect_limit(run("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "nested deeper");
}

TEST(ChatTemplateLimits, ExponentialMacroCallsStop) {
  tessera::RenderOptions o;
  o.max_steps = 2'000'000;
  expect_limit(run("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", {}, o),
               "steps");
}

TEST(ChatTemplateLimits, DoublingStringsStop) {
  expect_limit(run("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"),
               "exceed");
  expect_limit(run("{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"),
               "exceed");
  expect_limit(run("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"),
               "exceed");
}

TEST(ChatTemplateLimits, RepetitionIsBounded) {
  expect_limit(run("{{ 'x' * 1000000000000 }}"), "exceed");
  expect_limit(run("{{ [1, 2] * 1000000000000 }}"), "exceed");
  expect_limit(run("{{ 'x'.center(1000000000000) }}"), "exceed");
}

TEST(ChatTemplateLimits, OutputSizeIsBounded) {
  tessera::RenderOptions o;
  o.max_output_bytes = 1 << 20;
  expect_limit(run("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", {}, o), "output");
}

TEST(ChatTemplateLimits, DeepNestingIsASyntaxError) {
  expect_limit(run("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"), "nested too deeply",
               Kind::Syntax);
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  expect_limit(run(ifs), "nested too deeply", Kind::Syntax);
  expect_limit(run("{{ " + std::string(100000, '-') + "1 }}"), "nested too deeply", Kind::Syntax);
  expect_limit(run("{{ " + std::string(50000, '[') + std::string(50000, ']') + " }}"), "nested too deeply", Kind::Syntax);
}

TEST(ChatTemplateLimits, DeepExpressionsInsideRecursionStop) {
  // Each call nests an expression 150 deep, then recurses: the run-time depth guard
  // stops it before the C++ stack is exhausted.
  std::string deep = std::string(150, '-') + "f(n + 1)";
  Outcome r = run("{% macro f(n) %}{{ " + deep + " }}{% endmacro %}{{ f(0) }}");
  EXPECT_FALSE(r.rendered);
  EXPECT_EQ(r.kind, Kind::Limit) << r.message;
}

TEST(ChatTemplateLimits, DeepVariablesAreRefused) {
  ojson v = 1;
  for (int i = 0; i < 2000; ++i) v = ojson::array({v});
  expect_limit(run("{{ x }}", ojson{{"x", v}}), "nested too deeply", Kind::Runtime);
}

TEST(ChatTemplateLimits, HugeReprIsBounded) {
  tessera::RenderOptions o;
  o.max_output_bytes = 1 << 20;
  expect_limit(run("{% set s = 'x' * 500000 %}{{ [s, s, s, s] }}", {}, o), "exceed");
  expect_limit(run("{% set s = 'x' * 500000 %}{{ [s, s, s, s] | tojson }}", {}, o), "exceed");
}

TEST(ChatTemplateLimits, CircularNamespacesDoNotCrash) {
  Outcome r = run("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}{{ ns | tojson }}");
  EXPECT_FALSE(r.rendered);
  EXPECT_NE(r.message.find("circular"), std::string::npos) << r.message;
}

TEST(ChatTemplateLimits, RecursiveLoopDepthIsBounded) {
  // A loop that feeds itself its own list forever.
  expect_limit(run("{% set l = [[1]] %}{% for x in l recursive %}{{ loop(l) }}{% endfor %}"), "recursive loop");
}

}  // namespace
