// Learning-rate schedules at their key steps, and parsing them from flags.
#include "optim/lr_schedule.h"

#include <cmath>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace optim {
namespace {

TEST(LrScheduleTest, Constant) {
  ConstantLr s(3e-4);
  EXPECT_EQ(s.LrAt(0), 3e-4);
  EXPECT_EQ(s.LrAt(123456), 3e-4);
  EXPECT_EQ(s.ToString(), "constant:lr=0.0003");
}

TEST(LrScheduleTest, WarmupCosineKeySteps) {
  auto s = WarmupCosine::Create(6e-4, 6e-5, 10, 110);
  ASSERT_TRUE(s.ok()) << s.status();
  const LrSchedule& lr = **s;
  EXPECT_DOUBLE_EQ(lr.LrAt(0), 6e-4 * 1 / 10);  // (step + 1) / warmup
  EXPECT_DOUBLE_EQ(lr.LrAt(4), 6e-4 * 5 / 10);
  EXPECT_DOUBLE_EQ(lr.LrAt(9), 6e-4);                // last warmup step reaches max_lr
  EXPECT_DOUBLE_EQ(lr.LrAt(10), 6e-4);               // cosine starts at max_lr
  EXPECT_DOUBLE_EQ(lr.LrAt(60), (6e-4 + 6e-5) / 2);  // halfway down
  EXPECT_DOUBLE_EQ(lr.LrAt(35), 6e-5 + (6e-4 - 6e-5) * 0.5 * (1 + std::cos(M_PI * 0.25)));
  EXPECT_DOUBLE_EQ(lr.LrAt(110), 6e-5);
  EXPECT_DOUBLE_EQ(lr.LrAt(1000), 6e-5);
  EXPECT_DOUBLE_EQ(lr.LrAt(-5), lr.LrAt(0));
  // Monotone: up during warmup, down after.
  for (int64_t t = 1; t < 10; ++t) EXPECT_GT(lr.LrAt(t), lr.LrAt(t - 1));
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LT(lr.LrAt(t), lr.LrAt(t - 1));
}

TEST(LrScheduleTest, WarmupCosineEdgeCases) {
  auto no_warmup = WarmupCosine::Create(1.0, 0.0, 0, 4);
  ASSERT_TRUE(no_warmup.ok());
  EXPECT_DOUBLE_EQ((*no_warmup)->LrAt(0), 1.0);
  EXPECT_DOUBLE_EQ((*no_warmup)->LrAt(2), 0.5);
  EXPECT_DOUBLE_EQ((*no_warmup)->LrAt(4), 0.0);
  auto all_warmup = WarmupCosine::Create(1.0, 0.1, 4, 4);
  ASSERT_TRUE(all_warmup.ok());
  EXPECT_DOUBLE_EQ((*all_warmup)->LrAt(3), 1.0);
  EXPECT_DOUBLE_EQ((*all_warmup)->LrAt(4), 0.1);
  EXPECT_FALSE(WarmupCosine::Create(1e-3, 1e-2, 0, 10).ok());  // min > max
  EXPECT_FALSE(WarmupCosine::Create(1e-3, -1, 0, 10).ok());
  EXPECT_FALSE(WarmupCosine::Create(1e-3, 0, 20, 10).ok());  // warmup > total
  EXPECT_FALSE(WarmupCosine::Create(1e-3, 0, -1, 10).ok());
}

TEST(LrScheduleTest, ParsesAndRoundTrips) {
  auto c = ParseLrSchedule("constant:lr=3e-4");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->LrAt(7), 3e-4);
  auto s =
      ParseLrSchedule(" cosine : max_lr = 6e-4, min_lr=6e-5,warmup_steps=700,total_steps=19073");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ((*s)->LrAt(699), 6e-4);
  EXPECT_DOUBLE_EQ((*s)->LrAt(19073), 6e-5);
  EXPECT_EQ((*s)->ToString(),
            "cosine:max_lr=0.0006,min_lr=6e-05,warmup_steps=700,total_steps=19073");
  auto again = ParseLrSchedule((*s)->ToString());
  ASSERT_TRUE(again.ok()) << again.status();
  for (int64_t t : {0, 350, 700, 5000, 19073, 20000}) EXPECT_EQ((*again)->LrAt(t), (*s)->LrAt(t));
  // Defaults: min_lr 0, warmup 0.
  auto d = ParseLrSchedule("cosine:max_lr=1,total_steps=2");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ((*d)->LrAt(0), 1.0);
  EXPECT_DOUBLE_EQ((*d)->LrAt(2), 0.0);
}

TEST(LrScheduleTest, MakeFromOptions) {
  LrScheduleOptions o;
  o.kind = "cosine";
  o.max_lr = 1.0;
  o.min_lr = 0.5;
  o.warmup_steps = 2;
  o.total_steps = 4;
  auto s = MakeLrSchedule(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_DOUBLE_EQ((*s)->LrAt(0), 0.5);
  EXPECT_DOUBLE_EQ((*s)->LrAt(3), 0.75);
  o.kind = "linear";
  EXPECT_NE(std::string(MakeLrSchedule(o).status().message()).find("unknown kind 'linear'"),
            std::string::npos);
}

TEST(LrScheduleTest, ParseErrorsNameTheBadPart) {
  struct Case {
    const char* spec;
    const char* says;
  };
  const Case cases[] = {
      {"step:lr=1", "unknown kind 'step'"},
      {"", "unknown kind ''"},
      {"constant", "constant needs lr=..."},
      {"constant:lr=abc", "bad value 'abc' for lr"},
      {"constant:lr=nan", "bad value 'nan' for lr"},
      {"constant:lr=-1", "lr=-1"},
      {"cosine:max_lr=-1", "max_lr=-1 must be >= 0 in 'cosine:max_lr=-1'"},
      {"constant:rate=1", "unknown key 'rate' for constant"},
      {"cosine:max_lr=1,warmup=10",
       "unknown key 'warmup' for cosine in 'cosine:max_lr=1,warmup=10' (its keys: max_lr, "
       "min_lr, total_steps, warmup_steps)"},
      {"constant:lr", "expected key=value, got 'lr'"},
      {"constant:lr=1,lr=2", "key 'lr' given twice"},
      {"cosine:max_lr=1", "cosine needs total_steps=..."},
      {"cosine:max_lr=1,total_steps=1.5", "bad value '1.5' for total_steps"},
      {"cosine:max_lr=1e-3,min_lr=1e-2,total_steps=10", "min_lr=0.01 max_lr=0.001"},
      {"cosine:max_lr=1,warmup_steps=20,total_steps=10", "warmup_steps=20 total_steps=10"},
  };
  for (const Case& c : cases) {
    auto s = ParseLrSchedule(c.spec);
    ASSERT_FALSE(s.ok()) << c.spec;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.status().message()).find(c.says), std::string::npos)
        << c.spec << ": " << s.status();
  }
}

// ParseLrSpec says which keys a spec gives, requires none, and refuses what
// ParseLrSchedule refuses in the keys it reads.
TEST(LrScheduleTest, ParseLrSpecSaysWhichKeysTheSpecGives) {
  absl::StatusOr<LrSpec> spec = ParseLrSpec("cosine:warmup_steps=5,min_lr=1e-5");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->options.kind, "cosine");
  EXPECT_EQ(spec->keys, (std::set<std::string>{"min_lr", "warmup_steps"}));
  EXPECT_EQ(spec->options.warmup_steps, 5);
  EXPECT_EQ(spec->options.min_lr, 1e-5);
  EXPECT_EQ(spec->options.total_steps, 0);  // LrScheduleOptions' default
  for (const char* none : {"constant", "constant:", "cosine: "}) {
    spec = ParseLrSpec(none);
    ASSERT_TRUE(spec.ok()) << none << ": " << spec.status();
    EXPECT_TRUE(spec->keys.empty()) << none;
  }
  for (const char* bad : {"cosine:max_lr=-1", "cosine:warmup=3", "linear:lr=1"}) {
    EXPECT_FALSE(ParseLrSpec(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace optim
