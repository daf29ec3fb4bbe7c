// DDP and ZeRO-1 with parameters used more than once or outside their own
// module, over the threads engine: a module run twice in forward, and a
// parent that reads its child's weight itself, are reduced only after their
// last gradient write (bucket readiness, dist/grad_buckets.h), in fp32 and
// bf16 reduction; a later step using a parameter more often is an error (on
// every rank, when only some use it more often); a backward over gradients
// ZeRO-1 already reduced is refused; ZeroGrad zeroes a gradient the user
// replaced.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dist/ddp.h"
#include "dist/ddp_zero1_testing.h"
#include "dist/thread_group.h"
#include "dist/zero1.h"
#include "gtest/gtest.h"
#include "nn/linear.h"
#include "optim/sgd.h"
#include "tensor/error.h"
#include "tensor/ops/matmul.h"

namespace dist {
namespace {

using ddp_zero1_testing::ExpectSlicesEqual;
using ddp_zero1_testing::FlatGrads;
using ddp_zero1_testing::kSeed;
using ddp_zero1_testing::MakeOptimizer;
using ddp_zero1_testing::MaxAbsDiff;
using ddp_zero1_testing::Mode;
using ddp_zero1_testing::Opt;
using ddp_zero1_testing::ReducedSlices;
using tensor::Tensor;

// SGD with lr 0: a step changes nothing, so every step's gradients are alike.
std::unique_ptr<optim::Optimizer> StillSgd() {
  optim::SgdOptions o;
  o.lr = 0;
  return optim::SGD::Create(o).value();
}

// A model wrapped in DDP or ZeRO-1 (which one: the pointer set), both with
// buckets of `bucket_cap_mb`.
struct Wrapped {
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<Zero1> zero;
  void ZeroGrad(bool set_to_none = false) {
    ddp ? ddp->ZeroGrad(set_to_none) : zero->ZeroGrad(set_to_none);
  }
};
Wrapped Wrap(Mode mode, nn::Module& m, ProcessGroup& pg, std::unique_ptr<optim::Optimizer> opt,
             double bucket_cap_mb = 25) {
  Wrapped w;
  if (mode == Mode::kDdp) {
    DdpOptions o;
    o.bucket_cap_mb = bucket_cap_mb;
    w.ddp = std::make_unique<DistributedDataParallel>(m, pg, o);
  } else {
    Zero1Options o;
    o.bucket_cap_mb = bucket_cap_mb;
    w.zero = std::make_unique<Zero1>(m, pg, std::move(opt), o);
  }
  return w;
}

// A Linear whose weights and biases are all far from zero.
nn::LinearOptions RandomLinear() {
  nn::LinearOptions o;
  o.weight_init = nn::InitSpec::Normal(0.0f, 0.3f);
  o.bias_init = nn::InitSpec::Normal(0.0f, 0.1f);
  return o;
}

// y = shared(mid(shared(x))); `shared` is registered first, so its parameters
// sit in the last bucket, which every other bucket precedes: after shared's
// first backward (its second use) and mid's, the old readiness rule issued
// that bucket before shared's second backward had accumulated into it.
class SharedTwice : public nn::Module {
 public:
  explicit SharedTwice(int64_t d) : nn::Module("SharedTwice") {
    shared_ = RegisterModule("shared", std::make_unique<nn::Linear>(d, d, RandomLinear()));
    mid_ = RegisterModule("mid", std::make_unique<nn::Linear>(d, d, RandomLinear()));
  }

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    nn::Tensors h = shared_->Run(in, ctx.Child(0));
    h = mid_->Run(h, ctx.Child(1));
    return shared_->Run(h, ctx.Child(2));
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    nn::Tensors g = shared_->RunBackward(grad, ctx.Child(2));
    g = mid_->RunBackward(g, ctx.Child(1));
    return shared_->RunBackward(g, ctx.Child(0));
  }

 private:
  nn::Linear* shared_;
  nn::Linear* mid_;
};

// Gradients of 0.5 * sum(y^2) / rows for x (rows, d), rows = x's rows.
std::vector<float> HalfSquareGrads(nn::Module& m, const Tensor& x, int64_t rows) {
  nn::Context ctx;
  Tensor y = m.Run(x, ctx);
  std::vector<float> g = y.ToVector<float>();
  for (float& v : g) v /= static_cast<float>(rows);
  m.RunBackward(Tensor::FromVector(g, y.shape()), ctx);
  return FlatGrads(m);
}

// The inputs, the one-process gradients and the tolerances for SharedTwice
// reduced over n ranks of kRows / n rows each.
struct SharedTwiceCase {
  static constexpr int64_t kD = 16, kRows = 8;
  int n = 2;
  Tensor x;                 // (kRows, kD)
  std::vector<float> want;  // one process, every row
  // A bf16 reduction rounds each rank's gradient (and the sum) to 8
  // significant bits, so where the ranks' local gradients cancel the error is
  // relative to the largest local gradient, not to the mean. An early issue
  // (a bucket reduced before the shared module's second backward) loses a
  // whole contribution: errors of the order of that largest local gradient.
  double bf16_tol = 0;

  Tensor RankRows(int rank) const {
    const int64_t B = kRows / n;
    return x.Narrow(0, rank * B, B).Contiguous();
  }
  double Tol(tensor::Dtype reduce) const { return reduce == tensor::Dtype::kF32 ? 1e-6 : bf16_tol; }
};

SharedTwiceCase MakeSharedTwiceCase(int n) {
  SharedTwiceCase c;
  c.n = n;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  std::vector<float> xs(c.kRows * c.kD);
  for (float& v : xs) v = normal(gen);
  c.x = Tensor::FromVector(xs, {c.kRows, c.kD});
  SharedTwice ref(c.kD);
  ref.Materialize(kSeed);
  c.want = HalfSquareGrads(ref, c.x, c.kRows);
  double local_max = 0;
  for (int r = 0; r < n; ++r) {
    SharedTwice local(c.kD);
    local.Materialize(kSeed);
    for (float g : HalfSquareGrads(local, c.RankRows(r), c.kRows / n)) {
      local_max = std::max(local_max, static_cast<double>(std::abs(g)));
    }
  }
  c.bf16_tol = local_max / 128;
  return c;
}

TEST(DdpTest, ModuleRunTwiceIsReducedAfterItsLastBackward) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  for (tensor::Dtype reduce : {tensor::Dtype::kF32, tensor::Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(reduce));
    // Per step, per rank: step 0 learns the gradient writes (every bucket at
    // its end); step 1 issues buckets during backward by the rule.
    std::vector<std::vector<std::vector<float>>> got(2, std::vector<std::vector<float>>(c.n));
    ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                  SharedTwice m(c.kD);
                  m.Materialize(kSeed);
                  DdpOptions o;
                  o.bucket_cap_mb = 0.002;  // one Linear per bucket
                  o.mixed_precision.reduce_dtype = reduce;
                  DistributedDataParallel ddp(m, pg, o);
                  ASSERT_EQ(ddp.num_buckets(), 2);
                  EXPECT_EQ(ddp.BucketParameterNames(1).back(), "shared.weight");
                  for (int step = 0; step < 2; ++step) {
                    // Local means, averaged by DDP: the global mean.
                    got[step][rank] = HalfSquareGrads(m, c.RankRows(rank), c.kRows / c.n);
                    ddp.ZeroGrad();
                  }
                }).ok());
    for (int step = 0; step < 2; ++step) {
      for (int r = 0; r < c.n; ++r) {
        ASSERT_EQ(got[step][r].size(), c.want.size());
        for (size_t i = 0; i < c.want.size(); ++i) {
          EXPECT_NEAR(got[step][r][i], c.want[i], c.Tol(reduce))
              << "step " << step << " rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST(Zero1Test, ModuleRunTwiceIsReducedAfterItsLastBackward) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  for (tensor::Dtype reduce : {tensor::Dtype::kF32, tensor::Dtype::kBF16}) {
    SCOPED_TRACE(tensor::DtypeName(reduce));
    // Per step, per rank (as the DDP test: step 1 reduces by the rule).
    std::vector<std::vector<std::vector<std::pair<int64_t, float>>>> got(
        2, std::vector<std::vector<std::pair<int64_t, float>>>(c.n));
    ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                  SharedTwice m(c.kD);
                  m.Materialize(kSeed);
                  Zero1Options o;
                  o.bucket_cap_mb = 0.002;  // one Linear per bucket
                  o.mixed_precision.reduce_dtype = reduce;
                  Zero1 zero(m, pg, StillSgd(), o);
                  ASSERT_EQ(zero.num_buckets(), 2);
                  EXPECT_EQ(zero.BucketParameters(1).front().first, "shared.weight");
                  for (int step = 0; step < 2; ++step) {
                    HalfSquareGrads(m, c.RankRows(rank), c.kRows / c.n);
                    ASSERT_TRUE(zero.FinishBackward().ok());
                    got[step][rank] = ReducedSlices(zero);
                    ASSERT_TRUE(zero.Step().ok());
                    zero.ZeroGrad();
                  }
                }).ok());
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(step);
      for (int r = 0; r < c.n; ++r) ExpectSlicesEqual(got[step][r], c.want, c.Tol(reduce), r);
    }
  }
}

// y = inner(x) @ inner.weight^T: the root reads its child's weight itself,
// and its backward writes that gradient after the child's backward is done
// (the module rule alone would reduce the bucket before this second write).
// With uses_weight false in a step, y = inner(x): one write fewer.
class ParentReadsChildWeight : public nn::Module {
 public:
  explicit ParentReadsChildWeight(int64_t d) : nn::Module("ParentReadsChildWeight") {
    inner_ = RegisterModule("inner", std::make_unique<nn::Linear>(d, d, RandomLinear()));
  }
  bool uses_weight = true;

 protected:
  nn::Tensors Forward(const nn::Tensors& in, nn::Context& ctx) override {
    Tensor h = inner_->Run(in, ctx.Child(0)).at(0);  // (rows, d)
    ctx.Save(h);
    if (!uses_weight) return {h};
    tensor::MatmulOptions o;
    o.trans_b = true;
    return {tensor::Matmul(h, inner_->weight()->value, o)};  // (rows, d)
  }
  nn::Tensors Backward(const nn::Tensors& grad, nn::Context& ctx) override {
    const Tensor h = ctx.Saved<Tensor>();
    const Tensor& g = grad.at(0);  // (rows, d)
    if (!uses_weight) return {inner_->RunBackward(g, ctx.Child(0))};
    nn::Parameter& w = *inner_->weight();
    const Tensor dx = inner_->RunBackward(tensor::Matmul(g, w.value), ctx.Child(0));
    tensor::MatmulOptions o;  // d weight += g^T h, after inner's own backward
    o.trans_a = true;
    const nn::Parameter::GradSink sink = w.GradToWrite();
    tensor::MatmulInto(g, h, sink.grad, o, sink.accumulate ? 1.0f : 0.0f);
    return {dx};
  }

 private:
  nn::Linear* inner_;
};

// Step after step (the first learns each gradient's writes, the later ones
// overlap), the weight the parent also uses is reduced after both writes:
// every rank holds the one-process gradients. A later step that uses it more
// often than the first is an error naming it, not a wrong average.
TEST(DdpTest, AWeightTheParentAlsoUsesIsReducedAfterItsLastWrite) {
  constexpr int64_t kD = 8, kRows = 8;
  const int n = 2;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> xs(kRows * kD);
  for (float& v : xs) v = normal(gen);
  const Tensor x = Tensor::FromVector(xs, {kRows, kD});
  ParentReadsChildWeight ref(kD);
  ref.Materialize(kSeed);
  const std::vector<float> want = HalfSquareGrads(ref, x, kRows);
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    SCOPED_TRACE(mode == Mode::kDdp ? "ddp" : "zero1");
    ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                  ParentReadsChildWeight m(kD);
                  m.Materialize(kSeed);
                  const Tensor rows = x.Narrow(0, rank * kRows / n, kRows / n).Contiguous();
                  // Buckets: the bias, then the weight.
                  Wrapped w = Wrap(mode, m, pg, StillSgd(), /*bucket_cap_mb=*/0.0001);
                  for (int step = 0; step < 3; ++step) {
                    const std::vector<float> got = HalfSquareGrads(m, rows, kRows / n);
                    if (w.ddp) {
                      EXPECT_LT(MaxAbsDiff(got, want), 1e-6) << "step " << step;
                      w.ddp->ZeroGrad();
                    } else {
                      ASSERT_TRUE(w.zero->FinishBackward().ok());
                      ExpectSlicesEqual(ReducedSlices(*w.zero), want, 1e-6, rank);
                      ASSERT_TRUE(w.zero->Step().ok());
                      w.zero->ZeroGrad();
                    }
                  }
                }).ok());
  }
  // First step without the parent's use (one write), then with it (two).
  ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                ParentReadsChildWeight m(kD);
                m.Materialize(kSeed);
                const Tensor rows = x.Narrow(0, rank * kRows / n, kRows / n).Contiguous();
                DdpOptions o;
                o.bucket_cap_mb = 0.0001;
                DistributedDataParallel ddp(m, pg, o);
                m.uses_weight = false;
                HalfSquareGrads(m, rows, kRows / n);
                ddp.ZeroGrad();
                m.uses_weight = true;
                try {
                  HalfSquareGrads(m, rows, kRows / n);
                  ADD_FAILURE() << "a write after the bucket went out was not refused";
                } catch (const tensor::OpError& e) {
                  EXPECT_NE(std::string(e.what()).find(
                                "the gradient of 'inner.weight' was written after its bucket's "
                                "all-reduce went out"),
                            std::string::npos)
                      << e.what();
                }
              }).ok());
}

// A rank-dependent forward: in step 1 only rank 1 uses the weight more often
// than in step 0. The late write is agreed: every rank's step fails (rank 1
// naming the weight, rank 0 naming rank 1), no rank steps, and after
// ZeroGrad both train on in step with the same parameters.
TEST(DdpTest, ALateWriteOnOneRankFailsEveryRank) {
  constexpr int64_t kD = 8, kRows = 4;
  const int n = 2;
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    SCOPED_TRACE(mode == Mode::kDdp ? "ddp" : "zero1");
    const std::string collective = mode == Mode::kDdp ? "all-reduce" : "reduce-scatter";
    std::vector<std::vector<float>> params(n);
    ASSERT_TRUE(RunRanks(n, [&](int rank, ProcessGroup& pg) {
                  ParentReadsChildWeight m(kD);
                  m.Materialize(kSeed);
                  // Buckets: the bias, then the weight.
                  Wrapped w = Wrap(mode, m, pg, MakeOptimizer(Opt::kSgd), 0.0001);
                  const Tensor x = Tensor::Full({kRows, kD}, 0.5f + rank);
                  for (int step = 0; step < 3; ++step) {
                    m.uses_weight = step == 1 && rank == 1;
                    std::string error;
                    try {
                      HalfSquareGrads(m, x, kRows);  // DDP: fails at the root's PostBackward
                      if (w.zero) {
                        const absl::Status s = w.zero->Step();
                        if (!s.ok()) error = std::string(s.message());
                      }
                    } catch (const tensor::OpError& e) {
                      error = e.what();
                    }
                    if (step != 1) {
                      EXPECT_EQ(error, "") << "step " << step;
                    } else if (rank == 1) {
                      EXPECT_NE(error.find("the gradient of 'inner.weight' was written after its "
                                           "bucket's " + collective + " went out"),
                                std::string::npos)
                          << error;
                    } else {
                      EXPECT_NE(error.find("rank 1 (see its error) wrote a gradient after its "
                                           "bucket's " + collective + " went out"),
                                std::string::npos)
                          << error;
                    }
                    w.ZeroGrad();
                  }
                  params[rank] = ddp_zero1_testing::FlatParams(m);
                }).ok());
    EXPECT_EQ(MaxAbsDiff(params[0], params[1]), 0.0);
  }
}

// ZeroGrad(set_to_none=false) after the user replaced a gradient (with
// another tensor, holding 7s): the replacement reads zeros, and the next
// backward's gradients are the one-process ones, not added to the 7s.
TEST(DdpTest, ZeroGradZeroesAReplacedGradient) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  for (Mode mode : {Mode::kDdp, Mode::kZero1}) {
    SCOPED_TRACE(mode == Mode::kDdp ? "ddp" : "zero1");
    ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                  SharedTwice m(c.kD);
                  m.Materialize(kSeed);
                  Wrapped w = Wrap(mode, m, pg, StillSgd());
                  const Tensor x = c.RankRows(rank);
                  const int64_t rows = c.kRows / c.n;
                  HalfSquareGrads(m, x, rows);
                  if (w.zero) {
                    ASSERT_TRUE(w.zero->Step().ok());
                  }
                  nn::Parameter* p = m.NamedParameters().front().second;
                  p->grad = Tensor::Full(p->shape, 7.0);
                  const Tensor replaced = p->grad;
                  w.ZeroGrad(false);
                  for (float v : replaced.ToVector<float>()) ASSERT_EQ(v, 0.0f);
                  for (float v : p->grad.ToVector<float>()) ASSERT_EQ(v, 0.0f);
                  const std::vector<float> got = HalfSquareGrads(m, x, rows);
                  if (w.ddp) {
                    EXPECT_LT(MaxAbsDiff(got, c.want), 1e-6);
                  } else {
                    ASSERT_TRUE(w.zero->FinishBackward().ok());
                    ExpectSlicesEqual(ReducedSlices(*w.zero), c.want, 1e-6, rank);
                  }
                }).ok());
  }
}

// ZeRO-1 averages the flat gradient in place, so a second backward after a
// synced one (before Step), or one after Step without ZeroGrad, is refused
// rather than averaged again; after ZeroGrad training goes on.
TEST(Zero1Test, ABackwardOverReducedGradientsIsRefused) {
  const SharedTwiceCase c = MakeSharedTwiceCase(2);
  const auto throws = [](const std::function<void()>& f, const std::string& expected) {
    try {
      f();
      ADD_FAILURE() << "no error; expected: " << expected;
    } catch (const tensor::OpError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  ASSERT_TRUE(RunRanks(c.n, [&](int rank, ProcessGroup& pg) {
                SharedTwice m(c.kD);
                m.Materialize(kSeed);
                Zero1 zero(m, pg, MakeOptimizer(Opt::kSgd));
                const Tensor x = c.RankRows(rank);
                const int64_t rows = c.kRows / c.n;
                HalfSquareGrads(m, x, rows);
                throws([&] { HalfSquareGrads(m, x, rows); },
                       "a backward after a synced backward whose gradients Step() has not taken");
                ASSERT_TRUE(zero.Step().ok());
                throws([&] { HalfSquareGrads(m, x, rows); },
                       "a backward after Step() without ZeroGrad()");
                zero.ZeroGrad();
                HalfSquareGrads(m, x, rows);
                EXPECT_TRUE(zero.Step().ok());
              }).ok());
}

}  // namespace
}  // namespace dist
