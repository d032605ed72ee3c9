// The kernels' thread pool: every task runs once, workers are exclusive, errors propagate, nested
// and concurrent runs fall back to the calling thread, the thread count is validated, and runs go
// to an OpenMP runtime's threads when asked (GCC's libgomp here, as PyTorch loads its own).
#include "kernels/thread_pool.hpp"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin::kernels {
namespace {

class ThreadPoolTest : public ::testing::Test {
 protected:
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = num_threads();
};

TEST_F(ThreadPoolTest, EveryTaskRunsOnceOnExclusiveWorkers) {
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    const size_t count = 1000;
    const int workers = workers_for(count);
    EXPECT_EQ(workers, threads);
    std::vector<std::atomic<int>> runs(count);
    std::vector<std::atomic<int>> busy(static_cast<size_t>(workers));
    std::atomic<bool> clash{false};
    run_tasks(count, workers, [&](size_t task, int worker) {
      ASSERT_GE(worker, 0);
      ASSERT_LT(worker, workers);
      if (busy[static_cast<size_t>(worker)].fetch_add(1) != 0) clash = true;
      runs[task].fetch_add(1);
      busy[static_cast<size_t>(worker)].fetch_sub(1);
    });
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
    EXPECT_FALSE(clash.load()) << "two tasks ran at once on one worker";
  }
}

// Many short runs back to back, with pauses that let the helpers fall asleep: helpers that wake
// after the caller has finished alone must not run anything, and every task still runs exactly
// once on an exclusive worker, with the caller never returning while a helper still works on it.
TEST_F(ThreadPoolTest, ShortRunsNeverWaitForLateHelpersAndLoseNothing) {
  set_num_threads(4);
  std::atomic<int> in_flight{0};
  std::atomic<int> helper_tasks{0};
  for (int round = 0; round < 3000; ++round) {
    const size_t count = 1 + static_cast<size_t>(round % 5);
    const int workers = workers_for(count);
    std::vector<std::atomic<int>> runs(count);
    std::vector<std::atomic<int>> busy(static_cast<size_t>(workers));
    std::atomic<bool> clash{false};
    run_tasks(count, workers, [&](size_t task, int worker) {
      in_flight.fetch_add(1);
      if (busy[static_cast<size_t>(worker)].fetch_add(1) != 0) clash = true;
      runs[task].fetch_add(1);
      if (worker != 0) helper_tasks.fetch_add(1);
      if (round % 3 == 0) {  // long enough (~10 us) for sleeping helpers to join some runs
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(10);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      busy[static_cast<size_t>(worker)].fetch_sub(1);
      in_flight.fetch_sub(1);
    });
    ASSERT_EQ(in_flight.load(), 0) << "a task of round " << round << " outlived its run";
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << "round " << round;
    ASSERT_FALSE(clash.load()) << "round " << round;
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_GT(helper_tasks.load(), 0) << "the helpers never took part";
}

TEST_F(ThreadPoolTest, WorkersNeverExceedTasks) {
  set_num_threads(4);
  EXPECT_EQ(workers_for(0), 1);
  EXPECT_EQ(workers_for(1), 1);
  EXPECT_EQ(workers_for(3), 3);
  EXPECT_EQ(workers_for(100), 4);
}

TEST_F(ThreadPoolTest, FirstExceptionIsRethrownAndThePoolStillWorks) {
  set_num_threads(2);
  EXPECT_THROW(run_tasks(100, 2,
                         [](size_t task, int) {
                           if (task == 17) throw std::runtime_error("task 17");
                         }),
               std::runtime_error);
  std::atomic<int> n{0};
  run_tasks(50, 2, [&](size_t, int) { ++n; });
  EXPECT_EQ(n.load(), 50);
}

TEST_F(ThreadPoolTest, NestedRunsExecuteOnTheCallingThread) {
  set_num_threads(2);
  std::atomic<int> inner{0};
  run_tasks(4, 2, [&](size_t, int) {
    run_tasks(10, 2, [&](size_t, int worker) {
      EXPECT_EQ(worker, 0);
      ++inner;
    });
  });
  EXPECT_EQ(inner.load(), 40);
}

TEST_F(ThreadPoolTest, ConcurrentCallersAllComplete) {
  set_num_threads(2);
  std::atomic<int> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) run_tasks(20, 2, [&](size_t, int) { ++total; });
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 20);
}

TEST_F(ThreadPoolTest, ThreadCountIsValidated) {
  try {
    set_num_threads(0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
  }
  EXPECT_THROW(set_num_threads(257), Error);
  EXPECT_EQ(threads_from_environment("3"), 3);
  EXPECT_GE(threads_from_environment(nullptr), 1);
  for (const char* bad : {"", "0", "-1", "2x", "257", " 2"}) {
    try {
      threads_from_environment(bad);
      FAIL() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidEnvironment);
      EXPECT_NE(std::string(e.what()).find("GROUPLIN_NUM_THREADS"), std::string::npos);
    }
  }
}

// GCC's OpenMP runtime loaded as PyTorch loads its copy, or null (then the tests say so and skip).
void* load_libgomp() { return dlopen("libgomp.so.1", RTLD_NOW | RTLD_LOCAL); }

TEST_F(ThreadPoolTest, RunsOnAnOpenMpRuntimesTeamWhenAsked) {
  void* gomp = load_libgomp();
  if (gomp == nullptr) GTEST_SKIP() << "libgomp.so.1 not found: " << dlerror();
  auto thread_num = reinterpret_cast<int (*)()>(dlsym(gomp, "omp_get_thread_num"));
  ASSERT_NE(thread_num, nullptr);
  use_openmp_threads("libgomp.so.1");
  EXPECT_EQ(openmp_threads(), "libgomp.so.1");
  set_num_threads(2);
  const size_t count = 400;
  std::vector<std::atomic<int>> runs(count);
  std::atomic<int> on_team{0}, off_team{0}, second{0};
  run_tasks(count, 2, [&](size_t task, int worker) {
    runs[task].fetch_add(1);
    // On the team, the runtime numbers its threads as the workers are numbered.
    (thread_num() == worker ? on_team : off_team).fetch_add(1);
    if (worker == 1) second.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(50));  // 20 ms: both threads work
    if (task % 100 == 0) {  // nested: runs on this thread alone, every task once
      std::atomic<int> inner{0};
      run_tasks(10, 2, [&](size_t, int w) { inner += w == 0 ? 1 : 100; });
      EXPECT_EQ(inner.load(), 10);
    }
  });
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(runs[i].load(), 1) << i;
  EXPECT_EQ(off_team.load(), 0);
  EXPECT_GT(second.load(), 0);
  // An exception in a task on the team comes back to the caller.
  EXPECT_THROW(run_tasks(50, 2,
                         [](size_t task, int) {
                           if (task == 25) throw std::runtime_error("task 25");
                         }),
               std::runtime_error);
  use_own_threads();
  EXPECT_EQ(openmp_threads(), "");
  std::atomic<int> own_off_team{0};
  run_tasks(count, 2, [&](size_t, int worker) {
    if (worker == 1 && thread_num() != 0) own_off_team.fetch_add(1);
  });
  EXPECT_EQ(own_off_team.load(), 0);  // the pool's own helper is no OpenMP thread
}

TEST_F(ThreadPoolTest, RefusesWhatIsNotALoadedOpenMpRuntime) {
  for (const char* library : {"libgrouplin-no-such-runtime.so.7", "libm.so.6"}) {
    try {
      use_openmp_threads(library);
      FAIL() << "accepted " << library;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
      EXPECT_NE(std::string(e.what()).find(library), std::string::npos) << e.what();
    }
    EXPECT_EQ(openmp_threads(), "");  // nothing changed
  }
}

}  // namespace
}  // namespace grouplin::kernels
