// A one-line progress bar on stderr: bytes done, total, rate and time left.
//
//   grouplin::cli::ProgressBar bar("converting", quiet);
//   bar.update(done, total);   // as often as you like: redraws at most 10 times a second
//   bar.finish();              // ends the line (also done by the destructor)
//
// It draws only when stderr is a terminal and `quiet` is false; otherwise every call is a no-op,
// so scripts and logs never see carriage returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace grouplin::cli {

// "1.07 GB" (decimal units, as the rates).
std::string format_bytes(uint64_t bytes);

class ProgressBar {
 public:
  // `at_end`: what the command still does once every byte is done, shown then (convert:
  // "flushing to disk", the fsync that can take seconds on a large file).
  ProgressBar(std::string label, bool quiet, std::string at_end = "");
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool active() const { return active_; }
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  void draw(uint64_t done, uint64_t total);

  std::string label_;
  std::string at_end_;
  bool active_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

}  // namespace grouplin::cli
