// Scheduler placement, fallback down the ranking, grouping of runs, and errors.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/graph.h"
#include "tessera/scheduler.h"

using namespace tessera;

namespace {

// Supports a fixed set of ops; records every execute() call.
class FakeBackend final : public Backend {
 public:
  FakeBackend(std::string name, std::set<Op> ops) : name_(std::move(name)), ops_(std::move(ops)) {}
  std::string name() const override { return name_; }
  OpSupport supports(const Graph&, const Node& n) const override {
    if (ops_.count(n.op)) return OpSupport::yes();
    return OpSupport::no(std::string("no ") + std::string(op_name(n.op)) + " in " + name_);
  }
  void execute(Graph&, size_t first, size_t count) override { calls.emplace_back(first, count); }
  std::vector<std::pair<size_t, size_t>> calls;

 private:
  std::string name_;
  std::set<Op> ops_;
};

void add(Graph& g, Op op, int32_t dst, int32_t a, int32_t b = -1) {
  Node n;
  n.op = op;
  n.dst = dst;
  n.src = {a, b, -1, -1};
  g.add_node(n);
}

}  // namespace

TEST(Scheduler, FallsBackDownTheRanking) {
  auto fast = std::make_shared<FakeBackend>("fast", std::set<Op>{Op::Add});
  auto slow = std::make_shared<FakeBackend>("slow", std::set<Op>{Op::Add, Op::Mul, Op::Silu});
  Scheduler s({fast, slow});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  int32_t y = g.new_tensor(DType::F32, {8}, "y");
  int32_t z = g.new_tensor(DType::F32, {8}, "z");
  add(g, Op::Add, y, x, x);
  add(g, Op::Add, y, y, x);
  add(g, Op::Mul, z, y, x);
  add(g, Op::Silu, z, z);
  add(g, Op::Add, z, z, y);
  EXPECT_EQ(s.place(g), (std::vector<int>{0, 0, 1, 1, 0}));

  s.run(g);
  EXPECT_EQ(fast->calls, (std::vector<std::pair<size_t, size_t>>{{0, 2}, {4, 1}}));
  EXPECT_EQ(slow->calls, (std::vector<std::pair<size_t, size_t>>{{2, 2}}));

  EXPECT_EQ(s.describe(g),
            "0 add y -> fast\n"
            "1 add y -> fast\n"
            "2 mul z -> slow\n"
            "3 silu z -> slow\n"
            "4 add z -> fast\n");
}

TEST(Scheduler, ErrorNamesTheOpAndEveryReason) {
  auto a = std::make_shared<FakeBackend>("alpha", std::set<Op>{Op::Add});
  auto b = std::make_shared<FakeBackend>("beta", std::set<Op>{Op::Mul});
  Scheduler s({a, b});
  Graph g;
  int32_t x = g.new_tensor(DType::F32, {8}, "x");
  int32_t y = g.new_tensor(DType::F32, {8}, "probs");
  add(g, Op::Add, x, x, x);
  add(g, Op::Softmax, y, x);
  try {
    s.place(g);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("node 1"), std::string::npos) << m;
    EXPECT_NE(m.find("softmax"), std::string::npos) << m;
    EXPECT_NE(m.find("probs"), std::string::npos) << m;
    EXPECT_NE(m.find("alpha: no softmax in alpha"), std::string::npos) << m;
    EXPECT_NE(m.find("beta: no softmax in beta"), std::string::npos) << m;
  }
  EXPECT_THROW(s.run(g), Error);
  EXPECT_TRUE(a->calls.empty());  // nothing runs when placement fails

  Scheduler none({});
  EXPECT_THROW(none.place(g), Error);
  Graph empty;
  EXPECT_TRUE(none.place(empty).empty());
  EXPECT_EQ(none.describe(empty), "");
}
