#include "kernels/thread_pool.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grouplin/error.hpp"

namespace grouplin::kernels {
namespace {

constexpr int kMaxThreads = 256;
constexpr const char* kThreadsEnv = "GROUPLIN_NUM_THREADS";

std::atomic<int> g_threads{0};  // 0: not chosen yet

// One step of a spin-wait: x86's pause, AArch64's yield hint, nothing on other architectures.
inline void spin_pause() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

struct OpenMpRuntime;

// One run of run_tasks: the task function and the shared task counter.
struct Run {
  const std::function<void(size_t, int)>* fn = nullptr;
  size_t count = 0;
  int workers = 0;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  const OpenMpRuntime* openmp = nullptr;  // the team's runtime, when it runs on one

  void work(int worker) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const size_t task = next.fetch_add(1, std::memory_order_relaxed);
      if (task >= count) return;
      try {
        (*fn)(task, worker);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
};

// Helpers sleep on `state_` (through std::atomic::wait, a futex) and wake when a run starts. The
// state packs a run counter with the run's worker count, so a helper reads both at once. A helper
// whose index is below the worker count then tries to join the run through `ticket_` (the run's
// id, a closed bit and the number of helpers that joined): the caller, once it has taken and
// finished every task it could, closes the ticket and waits only for the helpers that joined.
// A helper that wakes late finds the run closed and never touches it, so a call never waits for a
// sleeping thread to wake (tens of microseconds on a VM; docs/PERFORMANCE.md).
class Pool {
 public:
  ~Pool() {
    stopping_.store(true);
    state_.fetch_add(kOneRun);
    state_.notify_all();
    for (std::thread& t : helpers_) t.join();
  }

  // False when another run holds the pool.
  bool try_acquire() { return !busy_.exchange(true, std::memory_order_acquire); }
  void release() { busy_.store(false, std::memory_order_release); }

  // Runs `run` on the caller and run.workers - 1 helpers. Requires: the pool is acquired,
  // 2 <= run.workers <= kMaxThreads.
  void execute(Run& run) {
    while (static_cast<int>(helpers_.size()) < run.workers - 1) {
      // The helper starts from the state before this run, so it cannot miss the run's start.
      const int index = static_cast<int>(helpers_.size()) + 1;
      const uint64_t before = state_.load(std::memory_order_relaxed);
      helpers_.emplace_back([this, index, before] { helper_loop(index, before); });
    }
    run_ = &run;
    finished_.store(0, std::memory_order_relaxed);
    const uint64_t id = state_.load(std::memory_order_relaxed) / kOneRun + 1;
    ticket_.store(id << kTicketIdShift, std::memory_order_relaxed);
    state_.store(id * kOneRun + static_cast<uint64_t>(run.workers), std::memory_order_release);
    state_.notify_all();
    run.work(0);
    // Every task is taken: close the run, then wait for the helpers that joined it.
    const auto joined = static_cast<int>(
        ticket_.fetch_or(kTicketClosed, std::memory_order_acq_rel) & kTicketJoinedMask);
    for (int spin = 0; spin < kSpinRounds && finished_.load(std::memory_order_acquire) != joined;
         ++spin) {
      spin_pause();
    }
    for (int done = finished_.load(std::memory_order_acquire); done != joined;
         done = finished_.load(std::memory_order_acquire)) {
      finished_.wait(done, std::memory_order_acquire);
    }
  }

 private:
  static constexpr uint64_t kOneRun = uint64_t{1} << 16;  // low 16 bits: the run's worker count
  // ticket_: run id << kTicketIdShift | kTicketClosed once the caller closed it | helpers joined.
  static constexpr int kTicketIdShift = 16;
  static constexpr uint64_t kTicketClosed = uint64_t{1} << 15;
  static constexpr uint64_t kTicketJoinedMask = kTicketClosed - 1;
  // ~50 us of x86 pause instructions (measured median wake-up of a sleeping helper: ~40 us); far
  // less of AArch64's yield hints, which only make a helper sleep sooner.
  static constexpr int kSpinRounds = 2000;

  void helper_loop(int index, uint64_t seen) {
    for (;;) {
      // Spin a little before sleeping: kernels often come back to back (forward, then the next
      // layer's), and waking a sleeping thread takes tens of microseconds on a VM.
      for (int spin = 0; spin < kSpinRounds && state_.load(std::memory_order_acquire) == seen;
           ++spin) {
        spin_pause();
      }
      state_.wait(seen, std::memory_order_acquire);
      seen = state_.load(std::memory_order_acquire);
      if (stopping_.load()) return;
      if (index >= static_cast<int>(seen % kOneRun)) continue;  // not part of this run
      if (!join(seen / kOneRun)) continue;                      // closed already, or a newer run
      run_->work(index);
      finished_.fetch_add(1, std::memory_order_acq_rel);
      finished_.notify_one();
    }
  }

  // Counts this helper in run `id` unless the caller has closed it (or started a newer one).
  bool join(uint64_t id) {
    uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      if ((t >> kTicketIdShift) != id || (t & kTicketClosed) != 0) return false;
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) return true;
    }
  }

  std::vector<std::thread> helpers_;
  std::atomic<bool> busy_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> state_{0};
  std::atomic<uint64_t> ticket_{0};
  std::atomic<int> finished_{0};  // helpers of the current run that are done with it
  Run* run_ = nullptr;            // written before state_ is stored (release), read after joining
};

Pool& pool() {
  static Pool instance;
  return instance;
}

// An OpenMP runtime already loaded in the process (use_openmp_threads), reached through the GNU
// ABI that GCC's libgomp defines and LLVM's and Intel's runtimes also export: GOMP_parallel runs
// fn(data) on a team of num_threads threads, the caller as thread 0, and returns when all have.
struct OpenMpRuntime {
  std::string library;
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
  int (*thread_num)();
};
std::atomic<const OpenMpRuntime*> g_openmp{nullptr};
std::atomic<bool> g_openmp_busy{false};
std::mutex g_openmp_mutex;  // serializes use_openmp_threads and use_own_threads

void openmp_body(void* data) {
  Run& run = *static_cast<Run*>(data);
  const int worker = run.openmp->thread_num();
  if (worker >= 0 && worker < run.workers) run.work(worker);
}

}  // namespace

int threads_from_environment(const char* value) {
  if (value == nullptr) {
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
  }
  const std::string v(value);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  const bool digits_only = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
  if (!digits_only || end != v.c_str() + v.size() || n < 1 || n > kMaxThreads) {
    throw Error(ErrorCode::InvalidEnvironment, std::string("environment variable ") + kThreadsEnv +
                                                   "=" + quote(v) + ": expected an integer 1.." +
                                                   std::to_string(kMaxThreads));
  }
  return static_cast<int>(n);
}

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = threads_from_environment(std::getenv(kThreadsEnv));
    int expected = 0;
    if (!g_threads.compare_exchange_strong(expected, n)) n = expected;
  }
  return n;
}

void set_num_threads(int n) {
  if (n < 1 || n > kMaxThreads) {
    throw Error(ErrorCode::InvalidArgument, "set_num_threads: " + std::to_string(n) +
                                                " threads, expected 1.." +
                                                std::to_string(kMaxThreads));
  }
  g_threads.store(n);
}

int workers_for(size_t count) {
  const auto n = static_cast<size_t>(num_threads());
  return static_cast<int>(std::max<size_t>(1, std::min(count, n)));
}

void run_tasks(size_t count, int workers, const std::function<void(size_t, int)>& fn) {
  if (count == 0) return;
  Run run;
  run.fn = &fn;
  run.count = count;
  run.workers = std::max(1, workers);
  // On an OpenMP runtime's team when one is in use, else on the pool; one run at a time on
  // either: a nested or concurrent call runs on its calling thread alone.
  const OpenMpRuntime* openmp = g_openmp.load(std::memory_order_acquire);
  Pool& p = pool();
  if (run.workers > 1 && openmp != nullptr && !g_openmp_busy.exchange(true)) {
    run.openmp = openmp;
    openmp->parallel(openmp_body, &run, static_cast<unsigned>(run.workers), 0);
    g_openmp_busy.store(false);
    run.work(0);  // a team smaller than asked for (the runtime's choice) leaves tasks here
  } else if (run.workers > 1 && openmp == nullptr && p.try_acquire()) {
    try {
      p.execute(run);
    } catch (...) {  // only thread creation can throw here, before any task ran on a helper
      p.release();
      throw;
    }
    p.release();
  } else {
    run.workers = 1;
    run.work(0);
  }
  if (run.error) std::rethrow_exception(run.error);
}

void use_openmp_threads(const std::string& library) {
  std::lock_guard lock(g_openmp_mutex);
  // Every runtime used stays, with its library handle open, until exit (one per library), so
  // that a call still running on the one before never sees it go.
  static auto* const kept = new std::vector<std::unique_ptr<OpenMpRuntime>>;
  for (const auto& r : *kept) {
    if (r->library == library) {
      g_openmp.store(r.get(), std::memory_order_release);
      return;
    }
  }
  const std::string what = "use_openmp_threads: " + quote(library) + ": ";
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (handle == nullptr) {
    throw Error(ErrorCode::InvalidArgument,
                what + "expected an OpenMP runtime already loaded in this process; found none");
  }
  auto runtime = std::make_unique<OpenMpRuntime>();
  runtime->library = library;
  runtime->parallel = reinterpret_cast<decltype(runtime->parallel)>(dlsym(handle, "GOMP_parallel"));
  runtime->thread_num = reinterpret_cast<int (*)()>(dlsym(handle, "omp_get_thread_num"));
  if (runtime->parallel == nullptr || runtime->thread_num == nullptr) {
    dlclose(handle);
    throw Error(ErrorCode::InvalidArgument,
                what + "expected a library exporting GOMP_parallel and omp_get_thread_num (an " +
                    "OpenMP runtime); this one does not");
  }
  kept->push_back(std::move(runtime));
  g_openmp.store(kept->back().get(), std::memory_order_release);
}

void use_own_threads() {
  std::lock_guard lock(g_openmp_mutex);
  g_openmp.store(nullptr, std::memory_order_release);
}

std::string openmp_threads() {
  const OpenMpRuntime* r = g_openmp.load(std::memory_order_acquire);
  return r == nullptr ? std::string() : r->library;
}

}  // namespace grouplin::kernels
