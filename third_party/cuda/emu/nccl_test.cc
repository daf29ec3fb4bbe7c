// The emulated NCCL's model (nccl.cc), where the project's nccl engine tests
// do not reach it: a collective stays pending on its stream (events after it
// not ready, work queued after it waits) until every rank has made it; calls that differ across ranks
// fail every communicator; a rank that aborts during a call fails its peers'
// (ncclRemoteError) instead of hanging them; two ranks on one device are
// refused; non-blocking init and split report ncclInProgress until complete;
// communicators sharing devices launched in different orders fail, also in
// a cycle through four devices, and calls launched in one order complete in
// it.
// Emulation only (--config=cuda_emu, CUDA_EMU_DEVICES=4 from the BUILD file).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

// The emulation's test hook (nccl.cc): how deep a thread is inside calls on
// `comm`'s emulated process's communicators.
extern "C" int cuda_emu_nccl_calls_inside(ncclComm_t comm);

namespace {

// Rank r's non-blocking communicator of `n` on cuda:`devices[r]`, through
// one unique id; each rank's init runs on its own thread.
std::vector<ncclComm_t> InitAll(const std::vector<int>& devices, std::vector<ncclResult_t>* states) {
  const int n = static_cast<int>(devices.size());
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(devices[r]);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const ncclResult_t result = ncclCommInitRankConfig(&comms[r], n, id, r, &config);
      EXPECT_TRUE(result == ncclSuccess || result == ncclInProgress) << result;
    });
  }
  for (std::thread& t : threads) t.join();
  states->assign(n, ncclInProgress);
  for (int r = 0; r < n; ++r) EXPECT_EQ(ncclCommGetAsyncError(comms[r], &(*states)[r]), ncclSuccess);
  return comms;
}

float* DeviceFloats(int device, std::vector<float> values) {
  cudaSetDevice(device);
  float* p = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), values.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}

std::vector<float> HostFloats(const float* p, size_t n) {
  std::vector<float> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST(EmulatedNccl, ACallIsPendingUntilEveryRankMakesIt) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> comms = InitAll({0, 1}, &states);
  EXPECT_EQ(states, std::vector<ncclResult_t>(2, ncclSuccess));
  float* a = DeviceFloats(0, {1, 2, 3});
  float* b = DeviceFloats(1, {10, 20, 30});
  cudaStream_t s0, s1;
  cudaSetDevice(0);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t done0;  // an event is recorded on a stream of its device
  ASSERT_EQ(cudaEventCreateWithFlags(&done0, cudaEventDisableTiming), cudaSuccess);
  cudaSetDevice(1);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);

  ASSERT_EQ(ncclAllReduce(a, a, 3, ncclFloat32, ncclSum, comms[0], s0), ncclSuccess);
  ASSERT_EQ(cudaEventRecord(done0, s0), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(done0), cudaErrorNotReady) << "rank 1 has not made the call";
  EXPECT_EQ(cudaStreamQuery(s0), cudaErrorNotReady);
  EXPECT_EQ(ncclCommFinalize(comms[0]), ncclInProgress) << "a call is unfinished";
  ASSERT_EQ(ncclAllReduce(b, b, 3, ncclFloat32, ncclSum, comms[1], s1), ncclSuccess);
  EXPECT_EQ(cudaEventQuery(done0), cudaSuccess);
  EXPECT_EQ(HostFloats(a, 3), (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(HostFloats(b, 3), (std::vector<float>{11, 22, 33}));

  // All-gather and an in-place reduce-scatter (rank r's output is chunk r).
  float* g0 = DeviceFloats(0, {0, 0, 0, 0});
  float* g1 = DeviceFloats(1, {0, 0, 0, 0});
  ASSERT_EQ(ncclAllGather(a, g0, 2, ncclFloat32, comms[0], s0), ncclSuccess);
  ASSERT_EQ(ncclAllGather(b + 1, g1, 2, ncclFloat32, comms[1], s1), ncclSuccess);
  EXPECT_EQ(HostFloats(g0, 4), (std::vector<float>{11, 22, 22, 33}));
  EXPECT_EQ(HostFloats(g1, 4), HostFloats(g0, 4));
  ASSERT_EQ(ncclReduceScatter(g0, g0, 2, ncclFloat32, ncclMax, comms[0], s0), ncclSuccess);
  ASSERT_EQ(ncclReduceScatter(g1, g1 + 2, 2, ncclFloat32, ncclMax, comms[1], s1), ncclSuccess);
  EXPECT_EQ(HostFloats(g0, 2), (std::vector<float>{11, 22}));
  EXPECT_EQ(HostFloats(g1 + 2, 2), (std::vector<float>{22, 33}));

  for (ncclComm_t c : comms) {
    EXPECT_EQ(ncclCommFinalize(c), ncclSuccess);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  cudaEventDestroy(done0);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
  for (float* p : {a, b, g0, g1}) cudaFree(p);
}

// Work queued behind a pending call runs after it: rank 0's copy of its
// result, queued right after its all-reduce, sees the reduced values although
// rank 1 makes the call only later (the emulation's host waits for it).
TEST(EmulatedNccl, WorkQueuedBehindAPendingCallRunsAfterIt) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> comms = InitAll({0, 1}, &states);
  float* a = DeviceFloats(0, {1, 2});
  float* b = DeviceFloats(1, {10, 20});
  std::vector<float> copied(2, 0.0f);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 2 * sizeof(float)), cudaSuccess);
  std::thread rank0([&] {
    cudaSetDevice(0);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(a, a, 2, ncclFloat32, ncclSum, comms[0], s), ncclSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned, a, 2 * sizeof(float), cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    copied.assign(pinned, pinned + 2);
    cudaStreamDestroy(s);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(ncclAllReduce(b, b, 2, ncclFloat32, ncclSum, comms[1], cudaStreamPerThread),
            ncclSuccess);
  rank0.join();
  EXPECT_EQ(copied, (std::vector<float>{11, 22}));
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  cudaFreeHost(pinned);
  cudaFree(a);
  cudaFree(b);
}

TEST(EmulatedNccl, CallsThatDifferAcrossRanksFailEveryCommunicator) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> comms = InitAll({0, 1}, &states);
  float* a = DeviceFloats(0, {1, 2, 3});
  float* b = DeviceFloats(1, {1, 2, 3});
  ASSERT_EQ(ncclAllReduce(a, a, 3, ncclFloat32, ncclSum, comms[0], cudaStreamPerThread), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(b, b, 2, ncclFloat32, ncclSum, comms[1], cudaStreamPerThread), ncclSuccess);
  for (ncclComm_t c : comms) {
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
    EXPECT_EQ(state, ncclInvalidUsage);
    EXPECT_NE(std::strstr(ncclGetLastError(c), "differs across ranks"), nullptr)
        << ncclGetLastError(c);
  }
  EXPECT_EQ(HostFloats(a, 3), (std::vector<float>{1, 2, 3})) << "nothing written";
  for (ncclComm_t c : comms) ncclCommAbort(c);
  cudaFree(a);
  cudaFree(b);
}

// Two communicators over the same two devices: calls launched in the same
// order on both run; launched in opposite orders (a kernel of each waiting
// for the other's peer, which can deadlock a GPU) they fail both
// communicators, and name the devices: as soon as one device launched both
// and the other one of them in the other order, or, when each launched one,
// as a cycle (each will launch the other after it); a launch after that
// fails.
TEST(EmulatedNccl, CommunicatorsLaunchedInDifferentOrdersFail) {
  // Launches as (rank, communicator): {0, 0} is rank 0's call on comm A.
  const std::vector<std::vector<std::pair<int, int>>> orders = {
      {{0, 0}, {0, 1}, {1, 0}, {1, 1}},  // the same order: fine
      {{0, 0}, {0, 1}, {1, 1}},          // rank 1 launches B first
      {{0, 0}, {1, 1}, {0, 1}},          // rank 1 launches B while rank 0 is in A
  };
  for (size_t o = 0; o < orders.size(); ++o) {
    std::vector<ncclResult_t> states;
    std::vector<ncclComm_t> a = InitAll({0, 1}, &states);
    std::vector<ncclComm_t> b = InitAll({0, 1}, &states);
    float* x[2] = {DeviceFloats(0, {1, 2}), DeviceFloats(1, {3, 4})};
    cudaStream_t streams[2][2];  // [rank][communicator]
    for (int r = 0; r < 2; ++r) {
      cudaSetDevice(r);
      for (int c = 0; c < 2; ++c) {
        ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r][c], cudaStreamNonBlocking), cudaSuccess);
      }
    }
    for (size_t i = 0; i < orders[o].size(); ++i) {
      const auto [r, c] = orders[o][i];
      cudaSetDevice(r);
      EXPECT_EQ(ncclAllReduce(x[r], x[r], 1 + c, ncclFloat32, ncclSum, (c == 0 ? a : b)[r],
                              streams[r][c]),
                o == 2 && i == 2 ? ncclInvalidUsage : ncclSuccess)
          << "order " << o << ", launch " << i;
    }
    for (const std::vector<ncclComm_t>* comms : {&a, &b}) {
      for (ncclComm_t comm : *comms) {
        ncclResult_t state = ncclSuccess;
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        if (o == 0) {
          EXPECT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
        } else {
          EXPECT_EQ(state, ncclInvalidUsage) << "order " << o;
          EXPECT_NE(std::strstr(ncclGetLastError(comm), "launched in different orders"), nullptr)
              << ncclGetLastError(comm);
          // Rank 0 (cuda:0) launched A (call #0, count 1) before B.
          EXPECT_NE(std::strstr(ncclGetLastError(comm),
                                o == 1 ? "cuda:0 launched call #0 of one before call #0 of "
                                         "another, cuda:1 the other way round"
                                       : "in a cycle of calls each waiting for the next: cuda:"),
                    nullptr)
              << ncclGetLastError(comm);
        }
      }
    }
    if (o == 0) {
      // A: 1 + 3; then B: 4 + 4, 2 + 4.
      EXPECT_EQ(HostFloats(x[0], 2), (std::vector<float>{8, 6}));
    } else {
      // The failed pair's launches (not aborted yet) blame no communicator
      // made later: a new one runs in the same order as before.
      std::vector<ncclComm_t> c = InitAll({0, 1}, &states);
      for (int r : {1, 0}) {
        cudaSetDevice(r);
        ASSERT_EQ(ncclAllReduce(x[r], x[r], 1, ncclFloat32, ncclSum, c[r], streams[r][0]),
                  ncclSuccess);
      }
      for (ncclComm_t comm : c) {
        ncclResult_t state = ncclSuccess;
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        EXPECT_EQ(state, ncclSuccess) << ncclGetLastError(comm);
        ncclCommAbort(comm);
      }
    }
    for (int r = 0; r < 2; ++r) {
      ncclCommAbort(a[r]);
      ncclCommAbort(b[r]);
      for (int c = 0; c < 2; ++c) cudaStreamDestroy(streams[r][c]);
      cudaFree(x[r]);
    }
  }
}

// HYBRID_SHARD's shape on four devices: shard groups S0 = {0, 1}, S1 =
// {2, 3}, replica groups R0 = {0, 2}, R1 = {1, 3}; each pair of groups shares
// at most one device; and Q = {0, 1}, another group, launched last on its
// devices. Launched in one order on every device (R, then S, then Q), every
// call completes, each waiting for the calls launched before it on its
// devices. Launched so that each device's first call waits for a call queued
// second on another device, around all four, none could finish on a GPU that
// runs one NCCL kernel at a time: the four communicators fail when the launch
// that closes the cycle comes (a launch after it may see the failure), naming
// it, and Q, which waited for their calls, runs once they are dropped.
TEST(EmulatedNccl, ACycleOfLaunchOrdersThroughFourDevicesFails) {
  // Launches as (device, group): groups 0 S0, 1 S1, 2 R0, 3 R1, 4 Q.
  const std::vector<std::vector<std::pair<int, int>>> orders = {
      {{0, 2}, {0, 0}, {0, 4}, {1, 3}, {1, 0}, {1, 4}, {2, 2}, {2, 1}, {3, 3}, {3, 1}},
      {{0, 2}, {0, 0}, {1, 0}, {1, 3}, {3, 3}, {3, 1}, {0, 4}, {1, 4}, {2, 1}, {2, 2}},
  };
  const std::vector<std::vector<int>> members = {{0, 1}, {2, 3}, {0, 2}, {1, 3}, {0, 1}};
  constexpr int kGroups = 5;
  for (size_t o = 0; o < orders.size(); ++o) {
    SCOPED_TRACE(o == 0 ? "one order" : "a cycle");
    std::vector<ncclResult_t> states;
    std::vector<std::vector<ncclComm_t>> comms;  // [group][rank in group]
    for (const std::vector<int>& devices : members) comms.push_back(InitAll(devices, &states));
    float* x[4];
    cudaStream_t streams[4][kGroups];  // [device][group]
    for (int d = 0; d < 4; ++d) {
      x[d] = DeviceFloats(d, {1.0f + d});
      cudaSetDevice(d);
      for (int g = 0; g < kGroups; ++g) {
        ASSERT_EQ(cudaStreamCreateWithFlags(&streams[d][g], cudaStreamNonBlocking), cudaSuccess);
      }
    }
    for (const auto& [d, g] : orders[o]) {
      const int r = members[g][0] == d ? 0 : 1;
      cudaSetDevice(d);
      const ncclResult_t launched =
          ncclAllReduce(x[d], x[d], 1, ncclFloat32, ncclSum, comms[g][r], streams[d][g]);
      if (launched != ncclSuccess) {
        EXPECT_EQ(launched, ncclInvalidUsage);
        EXPECT_EQ(o, 1u) << "a launch failed in the ordered case";
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      for (ncclComm_t comm : comms[g]) {
        ncclResult_t state = ncclSuccess;
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        if (o == 0 || g == 4) {
          EXPECT_EQ(state, ncclSuccess) << "group " << g << ": " << ncclGetLastError(comm);
        } else {
          EXPECT_EQ(state, ncclInvalidUsage) << "group " << g;
          EXPECT_NE(std::strstr(ncclGetLastError(comm), "in a cycle of calls"), nullptr)
              << ncclGetLastError(comm);
          // The four groups, by their devices, in the message.
          for (const char* group :
               {"the group on cuda:0 and cuda:1", "the group on cuda:2 and cuda:3",
                "the group on cuda:0 and cuda:2", "the group on cuda:1 and cuda:3"}) {
            EXPECT_NE(std::strstr(ncclGetLastError(comm), group), nullptr) << group;
          }
        }
      }
    }
    // Q ran (its streams are idle) although R0 and S0, launched before it,
    // never will.
    for (int d : {0, 1}) EXPECT_EQ(cudaStreamQuery(streams[d][4]), cudaSuccess) << "cuda:" << d;
    for (int g = 0; g < kGroups; ++g) {
      for (ncclComm_t comm : comms[g]) ncclCommAbort(comm);  // ends the failed calls
    }
    if (o == 0) {
      // R: {1 + 3, 2 + 4} = {4, 6} on devices {0, 2} and {1, 3}; then S:
      // 4 + 6 on every device; then Q: 10 + 10 on devices 0 and 1.
      const float want[4] = {20, 20, 10, 10};
      for (int d = 0; d < 4; ++d) EXPECT_EQ(HostFloats(x[d], 1)[0], want[d]) << "cuda:" << d;
    } else {
      EXPECT_EQ(HostFloats(x[0], 1)[0], 3.0f) << "Q alone: 1 + 2";
    }
    for (int d = 0; d < 4; ++d) {
      for (int g = 0; g < kGroups; ++g) cudaStreamDestroy(streams[d][g]);
      cudaFree(x[d]);
    }
  }
}

// A call that waits for another communicator's call launched before it on
// its device runs when that communicator is aborted.
TEST(EmulatedNccl, AnAbortLetsTheCallsThatWaitedForItsCallsRun) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> a = InitAll({0, 1}, &states);
  std::vector<ncclComm_t> b = InitAll({0, 2}, &states);
  float* x0 = DeviceFloats(0, {1});
  float* x2 = DeviceFloats(2, {2});
  cudaStream_t sa, sb0, sb2;
  cudaSetDevice(0);
  ASSERT_EQ(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&sb0, cudaStreamNonBlocking), cudaSuccess);
  cudaSetDevice(2);
  ASSERT_EQ(cudaStreamCreateWithFlags(&sb2, cudaStreamNonBlocking), cudaSuccess);
  cudaSetDevice(0);
  ASSERT_EQ(ncclAllReduce(x0, x0, 1, ncclFloat32, ncclSum, a[0], sa), ncclSuccess);  // no rank 1
  ASSERT_EQ(ncclAllReduce(x0, x0, 1, ncclFloat32, ncclSum, b[0], sb0), ncclSuccess);
  cudaSetDevice(2);
  ASSERT_EQ(ncclAllReduce(x2, x2, 1, ncclFloat32, ncclSum, b[1], sb2), ncclSuccess);
  EXPECT_EQ(cudaStreamQuery(sb0), cudaErrorNotReady) << "b waits for a's call on cuda:0";
  ncclCommAbort(a[0]);
  EXPECT_EQ(cudaStreamQuery(sb0), cudaSuccess);
  EXPECT_EQ(cudaStreamQuery(sb2), cudaSuccess);
  EXPECT_EQ(HostFloats(x2, 1)[0], 3.0f);
  ncclCommAbort(a[1]);
  for (ncclComm_t c : b) ncclCommAbort(c);
  for (cudaStream_t st : {sa, sb0, sb2}) cudaStreamDestroy(st);
  cudaFree(x0);
  cudaFree(x2);
}

// An abort ends the aborting rank's calls. Peers that made a call with it
// get ncclRemoteError; a peer that comes to the call later waits, as on one
// node where nothing tells it (the engine's watchdog times it out).
TEST(EmulatedNccl, AbortEndsTheCallsAndFailsThePeersInThem) {
  cudaEvent_t done0, done1;  // each rank's stream and event, on its device
  cudaStream_t s0, s1;
  cudaSetDevice(0);
  ASSERT_EQ(cudaEventCreateWithFlags(&done0, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  cudaSetDevice(1);
  ASSERT_EQ(cudaEventCreateWithFlags(&done1, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  float* a = DeviceFloats(0, {1});
  float* b = DeviceFloats(1, {1});
  {
    std::vector<ncclResult_t> states;
    std::vector<ncclComm_t> comms = InitAll({0, 1}, &states);
    ASSERT_EQ(ncclAllReduce(a, a, 1, ncclFloat32, ncclSum, comms[0], s0), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done0, s0), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(done0), cudaErrorNotReady);
    ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);  // as the engine's watchdog does
    EXPECT_EQ(cudaEventQuery(done0), cudaSuccess);
    ASSERT_EQ(ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, comms[1], s1), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done1, s1), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(done1), cudaErrorNotReady) << "rank 1 came after: it waits";
    ncclResult_t state = ncclInProgress;
    ASSERT_EQ(ncclCommGetAsyncError(comms[1], &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
    ASSERT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
    EXPECT_EQ(cudaEventQuery(done1), cudaSuccess);
  }
  {
    std::vector<ncclResult_t> states;
    std::vector<ncclComm_t> comms = InitAll({0, 1, 2}, &states);
    ASSERT_EQ(ncclAllReduce(a, a, 1, ncclFloat32, ncclSum, comms[0], s0), ncclSuccess);
    ASSERT_EQ(ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, comms[1], s1), ncclSuccess);
    ASSERT_EQ(cudaEventRecord(done1, s1), cudaSuccess);
    EXPECT_EQ(cudaEventQuery(done1), cudaErrorNotReady) << "rank 2 has not come";
    ASSERT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
    EXPECT_EQ(cudaEventQuery(done1), cudaSuccess) << "rank 1's call ended";
    ncclResult_t state = ncclSuccess;
    ASSERT_EQ(ncclCommGetAsyncError(comms[1], &state), ncclSuccess);
    EXPECT_EQ(state, ncclRemoteError);
    ASSERT_EQ(ncclCommGetAsyncError(comms[2], &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess) << "rank 2 was not in the call";
    ncclCommAbort(comms[1]);
    ncclCommAbort(comms[2]);
  }
  cudaEventDestroy(done0);
  cudaEventDestroy(done1);
  cudaStreamDestroy(s0);
  cudaStreamDestroy(s1);
  cudaFree(a);
  cudaFree(b);
}

// NCCL launches with its communicator's device current: a call on a stream
// created on another device fails, queues nothing, and (as NCCL's group
// cleanup does) fails the non-blocking communicator; the default stream is
// the communicator's device's whichever device is current.
TEST(EmulatedNccl, ACallOnAStreamOfAnotherDeviceFails) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> comms = InitAll({0, 1}, &states);  // non-blocking
  float* a = DeviceFloats(0, {1, 2});
  float* b = DeviceFloats(1, {10, 20});
  cudaStream_t s1;
  cudaSetDevice(1);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(ncclAllReduce(b, b, 2, ncclFloat32, ncclSum, comms[1], s1), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(a, a, 2, ncclFloat32, ncclSum, comms[0], s1), ncclUnhandledCudaError);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(comms[0], &state), ncclSuccess);
  EXPECT_EQ(state, ncclUnhandledCudaError);
  EXPECT_EQ(HostFloats(a, 2), (std::vector<float>{1, 2})) << "the failed call ran";
  for (ncclComm_t c : comms) ncclCommAbort(c);  // rank 1's call ends
  EXPECT_EQ(cudaStreamSynchronize(s1), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  cudaSetDevice(0);
  cudaFree(a);
  cudaFree(b);
}

// NCCL is not thread-safe across the communicators of one device: a call on
// one while another thread of the process is inside a call on another (here
// a blocking split of its parent, waiting for the peer) fails the
// communicator, naming the rule. (Ranks are threads standing for processes:
// a process is a communicator from init and those split from it.)
TEST(EmulatedNccl, CallsOnOneDevicesCommunicatorsFromTwoThreadsAtOnceFail) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> parents = InitAll({0, 1}, &states);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;  // blocking
  ncclComm_t first[2] = {nullptr, nullptr}, second[2] = {nullptr, nullptr};
  {
    std::thread peer([&] {
      cudaSetDevice(1);
      EXPECT_EQ(ncclCommSplit(parents[1], 0, 0, &first[1], &config), ncclSuccess);
    });
    cudaSetDevice(0);
    ASSERT_EQ(ncclCommSplit(parents[0], 0, 0, &first[0], &config), ncclSuccess);
    peer.join();
  }
  // This thread goes inside a call on rank 0's parent (its split waits for
  // rank 1's); another, once it is there, calls on rank 0's first child,
  // then makes rank 1's split.
  ncclResult_t state = ncclSuccess;
  std::thread other([&] {
    while (cuda_emu_nccl_calls_inside(parents[0]) == 0) std::this_thread::yield();
    EXPECT_EQ(ncclCommGetAsyncError(first[0], &state), ncclSuccess);
    cudaSetDevice(1);
    EXPECT_EQ(ncclCommSplit(parents[1], 0, 0, &second[1], &config), ncclSuccess);
  });
  cudaSetDevice(0);
  EXPECT_EQ(ncclCommSplit(parents[0], 0, 0, &second[0], &config), ncclSuccess);
  other.join();
  EXPECT_EQ(state, ncclInvalidUsage);
  EXPECT_NE(std::strstr(ncclGetLastError(first[0]), "two threads made calls on communicators of "
                                                    "cuda:0 at once"),
            nullptr)
      << ncclGetLastError(first[0]);
  for (ncclComm_t c : {first[0], first[1], second[0], second[1], parents[0], parents[1]}) {
    ncclCommAbort(c);
  }
}

TEST(EmulatedNccl, TwoRanksOnOneDeviceAreRefused) {
  std::vector<ncclResult_t> states;
  std::vector<ncclComm_t> comms = InitAll({0, 0}, &states);
  EXPECT_EQ(states, std::vector<ncclResult_t>(2, ncclInvalidUsage));
  EXPECT_NE(std::strstr(ncclGetLastError(comms[0]), "Duplicate GPU detected"), nullptr);
  for (ncclComm_t c : comms) ncclCommAbort(c);
}

TEST(EmulatedNccl, InitAndSplitAreInProgressUntilEveryRankCame) {
  cudaSetDevice(0);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c0 = nullptr, c1 = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, id, 0, &config), ncclInProgress);
  ncclResult_t state = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  cudaSetDevice(1);
  ASSERT_EQ(ncclCommInitRankConfig(&c1, 2, id, 1, &config), ncclSuccess);
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);

  // Split by color, reversed by key; then rank 1 alone with the other out.
  ncclComm_t s0 = nullptr, s1 = nullptr;
  ASSERT_EQ(ncclCommSplit(c0, 5, 1, &s0, &config), ncclInProgress);
  ASSERT_EQ(ncclCommGetAsyncError(s0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress) << "the parent too, until every rank has split";
  ASSERT_EQ(ncclCommSplit(c1, 5, 0, &s1, &config), ncclSuccess);
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  int rank = -1, count = -1;
  ASSERT_EQ(ncclCommUserRank(s0, &rank), ncclSuccess);
  ASSERT_EQ(ncclCommCount(s0, &count), ncclSuccess);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(count, 2);
  // A rank that takes no part in a new communicator still takes part in the
  // split: its parent is in progress until the others have split (a rank that
  // went on and destroyed it would fail their split).
  ncclComm_t none = c0, alone = nullptr;
  ASSERT_EQ(ncclCommSplit(c0, NCCL_SPLIT_NOCOLOR, 0, &none, &config), ncclInProgress);
  EXPECT_EQ(none, nullptr);
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  ASSERT_EQ(ncclCommSplit(c1, 0, 0, &alone, &config), ncclSuccess);
  ASSERT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  ASSERT_EQ(ncclCommCount(alone, &count), ncclSuccess);
  EXPECT_EQ(count, 1);
  for (ncclComm_t c : {s0, s1, alone, c0, c1}) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

}  // namespace
