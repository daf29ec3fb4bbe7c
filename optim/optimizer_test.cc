// Optimizer state handling, through SGD and AdamW: sharded stepping is
// bitwise equal to whole stepping, save/load round trips, load errors leave
// the state unchanged, invalid refs are rejected before anything changes.
#include "optim/optimizer.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/memory_ledger.h"
#include "tensor/testing.h"

namespace optim {
namespace {

using tensor::Tensor;
using tensor::testing::RandomTensor;

std::unique_ptr<Optimizer> MakeAdamW() {
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  return std::move(*AdamW::Create(o));
}

std::unique_ptr<Optimizer> MakeSgd() {
  SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.01;
  return std::move(*SGD::Create(o));
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.Contiguous(), cb = b.Contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// Deep copies of the state tensors (StateTensors() aliases the live buffers).
NamedTensors Snapshot(const Optimizer& opt) {
  NamedTensors out;
  for (auto& [name, t] : opt.StateTensors()) out.emplace_back(name, t.Clone());
  return out;
}

bool SameState(const NamedTensors& a, const NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !BitwiseEqual(a[i].second, b[i].second)) return false;
  }
  return true;
}

using Factory = std::function<std::unique_ptr<Optimizer>()>;

class OptimizerTest : public ::testing::TestWithParam<std::pair<const char*, Factory>> {
 protected:
  std::unique_ptr<Optimizer> Make() { return GetParam().second(); }
};

// A flat buffer stepped as two shards (two refs, as two FSDP ranks would) ends
// bitwise equal to the whole buffer stepped as one ref. The buffer is large
// enough to be split over several ParallelFor chunks, and the split point and
// chunk edges fall inside decay ranges.
TEST_P(OptimizerTest, ShardedStepEqualsWholeStep) {
  const int64_t n = 100003;
  const int64_t split = 41017;
  const ElementRanges decay = {{5, 30000}, {33333, 70001}, {90000, 100000}};
  Tensor whole = RandomTensor({n}, 1);
  Tensor flat = whole.Clone();
  Tensor all = whole.Clone();   // decayed everywhere
  Tensor none = whole.Clone();  // decayed nowhere
  auto opt_whole = Make();
  auto opt_shard0 = Make();
  auto opt_shard1 = Make();
  auto opt_all = Make();
  auto opt_none = Make();
  for (int step = 0; step < 3; ++step) {
    Tensor grad = RandomTensor({n}, 10 + step);
    std::vector<ParamRef> whole_refs = {{"flat", whole, grad.Clone(), decay}};
    opt_whole->Step(whole_refs);
    opt_all->Step({MakeParamRef("flat", all, grad, true)});
    opt_none->Step({MakeParamRef("flat", none, grad, false)});
    std::vector<ParamRef> shard0 = {{"flat.shard", flat.Narrow(0, 0, split),
                                     grad.Narrow(0, 0, split), SliceRanges(decay, 0, split)}};
    std::vector<ParamRef> shard1 = {{"flat.shard", flat.Narrow(0, split, n - split),
                                     grad.Narrow(0, split, n - split),
                                     SliceRanges(decay, split, n)}};
    opt_shard0->Step(shard0);
    opt_shard1->Step(shard1);
  }
  EXPECT_TRUE(BitwiseEqual(whole, flat));
  // Each element got decay exactly when inside a range, across chunk edges.
  const std::vector<float> w = whole.ToVector<float>(), a = all.ToVector<float>(),
                           z = none.ToVector<float>();
  int64_t wrong = 0, decay_mattered = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool in_range = false;
    for (const auto& [b, e] : decay) in_range |= i >= b && i < e;
    wrong += w[i] != (in_range ? a[i] : z[i]);
    decay_mattered += a[i] != z[i];
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_GT(decay_mattered, n / 2);
  // The state is split the same way.
  NamedTensors ws = opt_whole->StateTensors(), s0 = opt_shard0->StateTensors(),
               s1 = opt_shard1->StateTensors();
  ASSERT_EQ(ws.size(), s0.size());
  for (size_t i = 1; i < ws.size(); ++i) {  // entry 0 is the step
    EXPECT_TRUE(BitwiseEqual(ws[i].second.Narrow(0, 0, split), s0[i].second)) << ws[i].first;
    EXPECT_TRUE(BitwiseEqual(ws[i].second.Narrow(0, split, n - split), s1[i].second))
        << ws[i].first;
  }
}

// Frozen ranges (frozen parameters inside an FSDP shard): their elements and
// state stay as they are, and every other element gets, to the bit, the update
// of a ref without frozen ranges, across ParallelFor chunk edges and decay
// ranges that start or end inside a frozen one.
TEST_P(OptimizerTest, FrozenRangesAreLeftAsTheyAre) {
  const int64_t n = 100003;
  const ElementRanges decay = {{5, 30000}, {33333, 70001}, {90000, 100000}};
  const ElementRanges frozen = {{0, 7}, {29990, 40000}, {65536, 65537}, {99000, n}};
  const Tensor start = RandomTensor({n}, 1);
  Tensor all = start.Clone(), some = start.Clone();
  auto opt_all = Make();
  auto opt_some = Make();
  for (int step = 0; step < 3; ++step) {
    const Tensor grad = RandomTensor({n}, 10 + step);
    opt_all->Step({{"flat", all, grad, decay}});
    opt_some->Step({{"flat", some, grad, decay, frozen}});
  }
  auto is_frozen = [&](int64_t i) {
    for (const auto& [b, e] : frozen) {
      if (i >= b && i < e) return true;
    }
    return false;
  };
  const std::vector<float> a = all.ToVector<float>(), s = some.ToVector<float>(),
                           s0 = start.ToVector<float>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += s[i] != (is_frozen(i) ? s0[i] : a[i]);
  EXPECT_EQ(wrong, 0);
  NamedTensors state_all = opt_all->StateTensors(), state_some = opt_some->StateTensors();
  ASSERT_EQ(state_all.size(), state_some.size());
  for (size_t k = 1; k < state_all.size(); ++k) {  // entry 0 is the step
    const std::vector<float> x = state_all[k].second.ToVector<float>(),
                             y = state_some[k].second.ToVector<float>();
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += y[i] != (is_frozen(i) ? 0.0f : x[i]);
    EXPECT_EQ(bad, 0) << state_all[k].first;
  }
}

// Save after 3 steps, take 2 more; a fresh optimizer loaded from the save
// takes the same 2 steps to bitwise the same parameters and state.
TEST_P(OptimizerTest, SaveLoadRoundTripContinuesIdentically) {
  Tensor a = RandomTensor({4, 5}, 1), b = RandomTensor({7}, 2);
  auto grads_at = [](int step) {
    return std::make_pair(RandomTensor({4, 5}, 100 + step), RandomTensor({7}, 200 + step));
  };
  auto refs_at = [&](Tensor pa, Tensor pb, int step) {
    auto [ga, gb] = grads_at(step);
    return std::vector<ParamRef>{MakeParamRef("layer.weight", pa, ga, true),
                                 MakeParamRef("layer.bias", pb, gb, false)};
  };
  auto opt = Make();
  for (int step = 0; step < 3; ++step) opt->Step(refs_at(a, b, step));
  const NamedTensors saved = Snapshot(*opt);
  Tensor a_saved = a.Clone(), b_saved = b.Clone();
  for (int step = 3; step < 5; ++step) opt->Step(refs_at(a, b, step));

  for (bool with_params : {false, true}) {
    auto fresh = Make();
    Tensor a2 = a_saved.Clone(), b2 = b_saved.Clone();
    absl::Status status = with_params ? fresh->LoadStateTensors(saved, refs_at(a2, b2, 0))
                                      : fresh->LoadStateTensors(saved);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(fresh->StepCount("layer.weight"), 3);
    for (int step = 3; step < 5; ++step) fresh->Step(refs_at(a2, b2, step));
    EXPECT_TRUE(BitwiseEqual(a, a2));
    EXPECT_TRUE(BitwiseEqual(b, b2));
    EXPECT_TRUE(SameState(opt->StateTensors(), Snapshot(*fresh)));
  }
}

// Loading copies into kOptimizerState memory, whatever the source's category,
// and reuses same-shaped buffers instead of allocating new ones.
TEST_P(OptimizerTest, LoadedStateIsChargedAsOptimizerState) {
  Tensor a = RandomTensor({300}, 1);
  auto opt = Make();
  opt->Step({MakeParamRef("a", a, RandomTensor({300}, 2), true)});
  const NamedTensors saved = Snapshot(*opt);  // kTemporaries
  tensor::MemoryLedger ledger;
  tensor::ScopedLedger scoped(&ledger);
  const auto cpu = tensor::Device::Cpu();
  const auto category = tensor::MemoryCategory::kOptimizerState;
  auto fresh = Make();
  ASSERT_TRUE(fresh->LoadStateTensors(saved).ok());
  EXPECT_EQ(ledger.Stats(cpu, category).current, fresh->StateBytes());
  EXPECT_EQ(fresh->StateBytes(), opt->StateBytes());
  ASSERT_TRUE(fresh->LoadStateTensors(saved).ok());
  EXPECT_EQ(ledger.Stats(cpu, category).peak, fresh->StateBytes());  // reused
  EXPECT_TRUE(SameState(Snapshot(*fresh), saved));
}

// Adopting takes host f32 buffers as the state itself (no second copy),
// with the same result as loading; buffers the state already has of that
// shape are copied into instead.
TEST_P(OptimizerTest, AdoptedStateIsTheGivenBuffers) {
  Tensor a = RandomTensor({300}, 1);
  auto opt = Make();
  opt->Step({MakeParamRef("a", a, RandomTensor({300}, 2), true)});
  const NamedTensors saved = Snapshot(*opt);
  auto fresh = Make();
  ASSERT_TRUE(fresh->AdoptStateTensors(Snapshot(*opt)).ok());
  EXPECT_TRUE(SameState(Snapshot(*fresh), saved));
  auto given = Snapshot(*opt);
  auto other = Make();
  ASSERT_TRUE(other->AdoptStateTensors(given).ok());
  for (const auto& [name, t] : other->StateTensors()) {
    if (absl::EndsWith(name, ".step")) continue;
    bool shared = false;
    for (const auto& [gname, g] : given) shared |= gname == name && g.SharesStorageWith(t);
    EXPECT_TRUE(shared) << name;
  }
  auto again = Snapshot(*opt);
  ASSERT_TRUE(other->AdoptStateTensors(again).ok());  // same shapes: copied into the held ones
  for (const auto& [name, t] : other->StateTensors()) {
    for (const auto& [gname, g] : again) EXPECT_FALSE(g.SharesStorageWith(t)) << name;
  }
}

// Every kind of bad input is an error that names the entry and changes nothing.
TEST_P(OptimizerTest, LoadErrorsLeaveStateUnchanged) {
  Tensor a = RandomTensor({6}, 1), b = RandomTensor({2, 2}, 2);
  std::vector<ParamRef> refs = {MakeParamRef("a", a, RandomTensor({6}, 3), true),
                                MakeParamRef("b", b, RandomTensor({2, 2}, 4), true)};
  auto opt = Make();
  opt->Step(refs);
  opt->Step(refs);
  const NamedTensors good = Snapshot(*opt);
  const std::vector<std::string> keys = opt->BufferNames();
  ASSERT_FALSE(keys.empty());
  const std::string key0 = keys[0];
  const std::string last_key = keys.back();

  auto without = [&](const std::string& entry) {
    NamedTensors out;
    for (auto& e : good) {
      if (e.first != entry) out.push_back(e);
    }
    return out;
  };
  auto replaced = [&](const std::string& entry, Tensor t) {
    NamedTensors out = good;
    for (auto& e : out) {
      if (e.first == entry) e.second = t;
    }
    return out;
  };
  auto with_extra = [&](const std::string& entry, Tensor t) {
    NamedTensors out = good;
    out.emplace_back(entry, t);
    return out;
  };
  struct Case {
    std::string what;
    NamedTensors tensors;
    bool with_params;
    std::string says;
  };
  std::vector<ParamRef> refs_c = refs;
  refs_c.push_back(MakeParamRef("c", RandomTensor({3}, 5), RandomTensor({3}, 6), true));
  std::vector<ParamRef> refs_a = {refs[0]};
  const std::vector<Case> cases = {
      {"missing buffer", without("b." + last_key), false, "missing entry 'b." + last_key + "'"},
      {"missing step", without("a.step"), false, "missing entry 'a.step'"},
      {"missing parameter",
       [&] {
         NamedTensors out;
         for (auto& e : good) {
           if (e.first.rfind("a.", 0) != 0) out.push_back(e);
         }
         return out;
       }(),
       false, "missing state for parameter 'a'"},
      {"wrong shape", replaced("a." + key0, Tensor::Zeros({7})), false,
       "shape mismatch: entry 'a." + key0 + "' has shape (7)"},
      {"wrong shape for both buffers",
       [&] {
         NamedTensors out = good;
         for (auto& e : out) {
           if (e.first.rfind("b.", 0) == 0 && e.first != "b.step") e.second = Tensor::Zeros({4});
         }
         return out;
       }(),
       false, "shape mismatch: entry 'b." + key0 + "' has shape (4)"},
      {"wrong dtype", replaced("a." + key0, Tensor::Zeros({6}, tensor::Dtype::kBF16)), false,
       "entry 'a." + key0 + "' is bf16"},
      {"unknown key", with_extra("a.velocity", Tensor::Zeros({6})), false,
       "unexpected entry 'a.velocity'"},
      {"duplicate", with_extra("a.step", Tensor::Zeros({1})), false,
       "entry 'a.step' is given twice"},
      {"fractional step", replaced("a.step", Tensor::Full({1}, 2.5)), false,
       "entry 'a.step' is 2.5"},
      {"negative step", replaced("a.step", Tensor::Full({1}, -1, tensor::Dtype::kI64)), false,
       "entry 'a.step' is -1"},
      {"step not scalar", replaced("a.step", Tensor::Zeros({2}, tensor::Dtype::kI64)), false,
       "entry 'a.step' has shape (2)"},
      {"param not loaded", good, true, "missing state for parameter 'c'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::Status status =
        c.with_params ? opt->LoadStateTensors(c.tensors, refs_c) : opt->LoadStateTensors(c.tensors);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(status.message()).find(c.says), std::string::npos) << status;
    EXPECT_TRUE(SameState(Snapshot(*opt), good));
    if (!c.with_params) {  // the checks alone say the same
      EXPECT_EQ(opt->CheckStateTensors(c.tensors), status);
      EXPECT_TRUE(SameState(Snapshot(*opt), good));
    }
  }
  EXPECT_TRUE(opt->CheckStateTensors(good).ok());
  // Loading state for a parameter not among the refs given is an error too.
  absl::Status extra = opt->LoadStateTensors(good, refs_a);
  EXPECT_NE(std::string(extra.message()).find("unexpected state for 'b'"), std::string::npos)
      << extra;
  EXPECT_TRUE(SameState(Snapshot(*opt), good));
  // A ref whose shape differs from the loaded buffers.
  std::vector<ParamRef> reshaped = refs;
  reshaped[1] = MakeParamRef("b", RandomTensor({4}, 7), RandomTensor({4}, 8), true);
  absl::Status shape = opt->LoadStateTensors(good, reshaped);
  EXPECT_NE(std::string(shape.message()).find("shape mismatch"), std::string::npos) << shape;
  EXPECT_TRUE(SameState(Snapshot(*opt), good));
  // After all that, a good load still works.
  EXPECT_TRUE(opt->LoadStateTensors(good, refs).ok());
  EXPECT_TRUE(SameState(Snapshot(*opt), good));
}

// Bad refs throw before any parameter or state changes.
TEST_P(OptimizerTest, InvalidRefsChangeNothing) {
  Tensor a = RandomTensor({8}, 1);
  Tensor a_before = a.Clone();
  Tensor g = RandomTensor({8}, 2);
  auto opt = Make();
  std::vector<std::vector<ParamRef>> bad = {
      {MakeParamRef("a", a, g, true), MakeParamRef("b", RandomTensor({3}, 3), g, true)},
      {MakeParamRef("a", a, g, true), MakeParamRef("a", RandomTensor({8}, 3), g, true)},
      {MakeParamRef("a", a, g, true), {"b", RandomTensor({8}, 4), g, {{0, 4}, {3, 6}}}},
      {MakeParamRef("a", a, g, true), {"b", RandomTensor({8}, 4), g, {{0, 9}}}},
      {MakeParamRef("a", a, g, true), {"b", RandomTensor({8}, 4), g, {{2, 2}}}},
      {MakeParamRef("a", a, g, true), {"b", RandomTensor({8}, 4), g, {}, {{3, 9}}}},
      {MakeParamRef("a", a, g, true), {"b", RandomTensor({8}, 4), g, {}, {{4, 6}, {1, 2}}}},
      {MakeParamRef("a", a, g, true),
       MakeParamRef("b", RandomTensor({8}, 5, -1, 1, tensor::Dtype::kBF16), g, true)},
      {MakeParamRef("a", a, g, true), MakeParamRef("b", RandomTensor({8}, 5), Tensor(), true)},
      {MakeParamRef("a", a, g, true),
       MakeParamRef("b", RandomTensor({4, 4}, 5).Transpose(0, 1), RandomTensor({4, 4}, 6), true)},
      // Low-precision copies: f32, another shape, not contiguous.
      {MakeParamRef("a", a, g, true),
       {"b", RandomTensor({8}, 4), g, {}, {}, Tensor::Zeros({8}, tensor::Dtype::kF32)}},
      {MakeParamRef("a", a, g, true),
       {"b", RandomTensor({8}, 4), g, {}, {}, Tensor::Zeros({9}, tensor::Dtype::kBF16)}},
      {MakeParamRef("a", a, g, true),
       {"b", RandomTensor({2, 4}, 4), RandomTensor({2, 4}, 5), {}, {},
        Tensor::Zeros({4, 2}, tensor::Dtype::kBF16).Transpose(0, 1)}},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_THROW(opt->Step(bad[i]), tensor::OpError) << "case " << i;
    EXPECT_TRUE(BitwiseEqual(a, a_before)) << "case " << i;
    EXPECT_FALSE(opt->HasState("a")) << "case " << i;
  }
  // A name's shape is fixed by its state.
  opt->Step({MakeParamRef("a", a, g, true)});
  try {
    opt->Step({MakeParamRef("a", RandomTensor({9}, 1), RandomTensor({9}, 2), true)});
    if (!opt->BufferNames().empty()) ADD_FAILURE() << "expected a shape error";
  } catch (const tensor::OpError& e) {
    EXPECT_NE(std::string(e.what()).find("'a' has shape (9)"), std::string::npos) << e.what();
  }
}

// A ref's low-precision copy holds the updated parameter cast to its dtype
// after each step (on the CPU the step casts after the update), and the
// parameter is what it is without a copy.
TEST_P(OptimizerTest, TheStepWritesTheLowPrecisionCopy) {
  for (tensor::Dtype dtype : {tensor::Dtype::kBF16, tensor::Dtype::kF16}) {
    SCOPED_TRACE(tensor::DtypeName(dtype));
    auto plain = Make();
    auto with_copy = Make();
    Tensor p = RandomTensor({1001}, 1);
    Tensor p_plain = p.Clone();
    Tensor copy = Tensor::Zeros({1001}, dtype);
    for (int step = 0; step < 3; ++step) {
      const Tensor g = RandomTensor({1001}, 10 + step);
      ParamRef ref = MakeParamRef("w", p, g, true);
      ref.low_precision_copy = copy;
      plain->Step({MakeParamRef("w", p_plain, g, true)});
      with_copy->Step({ref});
      EXPECT_TRUE(BitwiseEqual(p, p_plain)) << "step " << step;
      EXPECT_TRUE(BitwiseEqual(copy, p.To(dtype))) << "step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerTest,
                         ::testing::Values(std::make_pair("adamw", Factory(MakeAdamW)),
                                           std::make_pair("sgd", Factory(MakeSgd))),
                         [](const auto& info) { return std::string(info.param.first); });

TEST(OptimizerStateTest, StateTensorsNamesAndOrder) {
  auto opt = MakeAdamW();
  Tensor w = RandomTensor({2, 3}, 1), b = RandomTensor({3}, 2);
  opt->Step({MakeParamRef("h.0.w", w, RandomTensor({2, 3}, 3), true),
             MakeParamRef("h.0.b", b, RandomTensor({3}, 4), false)});
  NamedTensors state = opt->StateTensors();
  std::vector<std::string> names;
  for (auto& [n, t] : state) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"h.0.w.step", "h.0.w.exp_avg", "h.0.w.exp_avg_sq",
                                             "h.0.b.step", "h.0.b.exp_avg", "h.0.b.exp_avg_sq"}));
  EXPECT_EQ(state[0].second.dtype(), tensor::Dtype::kI64);
  EXPECT_EQ(state[0].second.shape(), tensor::Shape({1}));
  EXPECT_EQ(state[1].second.shape(), tensor::Shape({2, 3}));
  EXPECT_EQ(state[4].second.shape(), tensor::Shape({3}));
  opt->ClearState();
  EXPECT_TRUE(opt->StateTensors().empty());
  EXPECT_EQ(opt->StateBytes(), 0);
}

}  // namespace
}  // namespace optim
