// ApplyFreeze: the line the train binaries print, and the errors naming --freeze.
#include "models/common/freeze_flags.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "nn/containers.h"
#include "nn/embedding.h"
#include "nn/linear.h"

namespace train {
namespace {

// 0: Embedding(100, 10) (1000), 1: Linear(10, 20) (220), 2: Linear(20, 5) (105).
std::unique_ptr<nn::Sequential> Model() {
  auto seq = std::make_unique<nn::Sequential>();
  seq->Append(std::make_unique<nn::Embedding>(100, 10));
  seq->Append(std::make_unique<nn::Linear>(10, 20));
  seq->Append(std::make_unique<nn::Linear>(20, 5));
  return seq;
}

TEST(ApplyFreezeTest, FreezesAndDescribes) {
  auto m = Model();
  absl::StatusOr<std::string> line = ApplyFreeze(*m, "0, 1.weight");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "frozen: 0, 1.weight | 2 tensors, 1200 of 1325 parameters; 125 train");
  int frozen = 0;
  for (auto& [name, p] : m->NamedParameters()) frozen += p->requires_grad ? 0 : 1;
  EXPECT_EQ(frozen, 2);
}

TEST(ApplyFreezeTest, EmptyFlagFreezesNothing) {
  auto m = Model();
  absl::StatusOr<std::string> line = ApplyFreeze(*m, "");
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(*line, "");
  for (auto& [name, p] : m->NamedParameters()) EXPECT_TRUE(p->requires_grad) << name;
}

TEST(ApplyFreezeTest, ErrorsNameTheFlag) {
  for (const auto& [flag, want] : std::vector<std::pair<std::string, std::string>>{
           {"0,", "--freeze='0,' has an empty pattern"},
           {"transformer.wte", "--freeze: freeze pattern 'transformer.wte' selects no parameter"},
           {"*", "--freeze='*' freezes every parameter of the model: nothing would train"},
       }) {
    auto m = Model();
    absl::StatusOr<std::string> line = ApplyFreeze(*m, flag);
    ASSERT_FALSE(line.ok()) << flag;
    EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(line.status().message().find(want), std::string::npos) << line.status();
  }
}

}  // namespace
}  // namespace train
