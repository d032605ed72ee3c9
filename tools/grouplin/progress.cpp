#include "cli/progress.hpp"

#include <unistd.h>

#include <cstdio>

namespace grouplin::cli {
namespace {

constexpr int kBarWidth = 24;
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

}  // namespace

std::string format_bytes(uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (bytes < 1000) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else if (b < 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f kB", b / 1e3);
  } else if (b < 1e9) {
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  }
  return buf;
}

ProgressBar::ProgressBar(std::string label, bool quiet, std::string at_end)
    : label_(std::move(label)),
      at_end_(std::move(at_end)),
      active_(!quiet && ::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - kRedrawInterval) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < kRedrawInterval && done != total) return;
  last_draw_ = now;
  draw(done, total);
}

void ProgressBar::draw(uint64_t done, uint64_t total) {
  const double seconds = std::chrono::duration<double>(last_draw_ - start_).count();
  const double fraction = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kBarWidth - filled), '.');
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  char eta[32] = "";
  if (rate > 0 && done < total) {
    std::snprintf(eta, sizeof eta, "  %.0f s left", static_cast<double>(total - done) / rate);
  }
  const std::string ending = done == total && !at_end_.empty() ? "  " + at_end_ + "..." : "";
  std::fprintf(stderr, "\r%s [%s] %3.0f%%  %s / %s  %s/s%s%s\033[K", label_.c_str(), bar.c_str(),
               fraction * 100, format_bytes(done).c_str(), format_bytes(total).c_str(),
               format_bytes(static_cast<uint64_t>(rate)).c_str(), eta, ending.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (active_ && drawn_) {
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  drawn_ = false;
  active_ = false;
}

}  // namespace grouplin::cli
