#include "cli/interrupt.hpp"

namespace grouplin::cli {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void record_signal(int signal) { g_signal = signal; }

}  // namespace

InterruptGuard::InterruptGuard() {
  struct sigaction sa = {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART: a blocking call returns EINTR, and every loop around one retries it, so the
  // work goes on to the next point that checks interrupt_signal().
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

int interrupt_signal() { return g_signal; }

std::string signal_description(int signal) {
  if (signal == SIGINT) return "SIGINT (Ctrl-C)";
  if (signal == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signal);
}

int interrupted_exit_status() { return 128 + (g_signal != 0 ? g_signal : SIGINT); }

}  // namespace grouplin::cli
