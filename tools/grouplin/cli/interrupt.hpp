// Ctrl-C and SIGTERM as an error a command can clean up after.
//
//   grouplin::cli::InterruptGuard guard;                 // SIGINT, SIGTERM only recorded now
//   ... if (int sig = grouplin::cli::interrupt_signal()) throw Error(ErrorCode::Interrupted, ...);
//   // main() prints the error and exits with interrupted_exit_status(): 130 for SIGINT
//
// While a guard lives, SIGINT and SIGTERM do not kill the process: the handler only records the
// signal, and the command polls interrupt_signal() at points where it can stop (convert: its
// progress callback, after every 16 MiB), throws Error(Interrupted) and unwinds, removing its
// temporary file. main() turns that error into the exit status a shell gives a process the
// signal killed, 128 + the signal number (SIGINT 130, SIGTERM 143). Outside a guard the signals
// keep their default action. One guard at a time; not for use from several threads.
#pragma once

#include <csignal>
#include <string>

namespace grouplin::cli {

class InterruptGuard {
 public:
  InterruptGuard();   // installs the handler for SIGINT and SIGTERM
  ~InterruptGuard();  // puts back the previous handlers
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

 private:
  struct sigaction old_int_ = {};
  struct sigaction old_term_ = {};
};

// The last SIGINT or SIGTERM received under a guard (in this process), 0 if none.
int interrupt_signal();

// "SIGINT (Ctrl-C)", "SIGTERM", or "signal N".
std::string signal_description(int signal);

// 128 + interrupt_signal(), or 130 (SIGINT's) if no signal was recorded.
int interrupted_exit_status();

}  // namespace grouplin::cli
