// Tests of LaunchOrder: tickets in issue order, the turn advancing over
// tickets passed out of order, a waiter woken by the pass it waits for.
#include "dist/nccl_launch_order.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dist {
namespace nccl {
namespace {

TEST(LaunchOrderTest, TicketsComeInOrderAndTheFirstHasTheTurn) {
  LaunchOrder order;
  EXPECT_EQ(order.Take(), 0);
  EXPECT_EQ(order.Take(), 1);
  EXPECT_EQ(order.taken(), 2);
  EXPECT_TRUE(order.IsTurn(0));
  EXPECT_FALSE(order.IsTurn(1));
}

TEST(LaunchOrderTest, TheTurnWaitsForEveryEarlierTicket) {
  LaunchOrder order;
  for (int i = 0; i < 4; ++i) order.Take();
  order.Pass(2);  // out of order: 0 and 1 still pending
  EXPECT_FALSE(order.IsTurn(1));
  EXPECT_FALSE(order.IsTurn(3));
  order.Pass(0);
  EXPECT_TRUE(order.IsTurn(1));
  EXPECT_FALSE(order.IsTurn(3));
  order.Pass(1);  // 2 was passed already: the turn moves to 3
  EXPECT_TRUE(order.IsTurn(3));
  order.Pass(1);  // passed twice: ignored
  order.Pass(7);  // never taken: ignored
  EXPECT_TRUE(order.IsTurn(3));
  order.Pass(3);
  EXPECT_EQ(order.Take(), 4);
  EXPECT_TRUE(order.IsTurn(4));
}

TEST(LaunchOrderTest, AWaiterWakesWhenItsTurnComes) {
  LaunchOrder order;
  order.Take();
  order.Take();
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    order.WaitForTurn(1);
    woke = true;
  });
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(woke.load());
  order.Pass(0);
  waiter.join();
  EXPECT_TRUE(woke.load());
}

}  // namespace
}  // namespace nccl
}  // namespace dist
