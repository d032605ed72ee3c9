// Checkpoints of an expert-parallel job: each rank loads its slice (all or nothing across
// ranks), and a collective save writes one sharded directory, a shard per rank, renamed into
// place by rank 0 only when every rank has written its own.
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <span>
#include <string>

#include "distributed/mpi_call.hpp"
#include "grouplin/checkpoint.hpp"
#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/expert_parallel.hpp"
#include "grouplin/file.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/safetensors.hpp"
#include "grouplin/sharded_checkpoint.hpp"
#include "io/checkpoints/atomic_directory.hpp"
#include "layout/plan.hpp"

namespace grouplin {

using distributed::check_mpi;
using distributed::comm_rank;
using distributed::comm_size;
using distributed::failure_of;

LoadReport load_experts(MPI_Comm comm, Module& module, const std::string& path,
                        LoadOptions options) {
  // A copy of what the module holds, so that a rank that loaded can go back when another failed.
  StateDict before;
  for (const auto& [name, t] : module.state_dict()) before.insert(name, t.clone());
  LoadReport report;
  bool loaded = false;
  const auto failure = failure_of([&] {
    report = module.load_state_dict(load_checkpoint(path).tensors, options);
    loaded = true;
  });
  try {
    distributed::raise_agreed(comm, failure);
  } catch (const Error&) {
    if (loaded) module.load_state_dict(before);
    throw;
  }
  return report;
}

namespace {

namespace fs = std::filesystem;

bool is_weight_file(const std::string& name) {
  for (const char* ext : {".safetensors", ".bin", ".pt", ".pth", ".index.json"}) {
    const std::string e = ext;
    if (name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0) {
      return true;
    }
  }
  return false;
}

// The files of `dir` that a save copies (regular files, not weights or indexes), by name.
std::vector<std::string> copied_files(const std::string& dir) {
  std::vector<std::string> names;
  if (dir.empty()) return names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && !is_weight_file(name)) names.push_back(name);
  }
  if (ec) {
    throw Error(ErrorCode::IoError,
                "save_experts: reading " + quote(dir) + " for files to copy: " + ec.message());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// An existing output may be replaced only when it holds nothing a save does not write.
void check_output(const std::string& dir, const ParallelSaveOptions& o) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  if (!o.overwrite) {
    throw Error(ErrorCode::IoError, "save_experts: " + quote(dir) +
                                        " exists; set overwrite to replace it, or choose another "
                                        "output");
  }
  if (!fs::is_directory(dir, ec)) {
    throw Error(ErrorCode::OutputHoldsOtherFiles,
                "save_experts: " + quote(dir) +
                    " is not a directory; only a directory a save "
                    "wrote is replaced");
  }
  const std::vector<std::string> copies = copied_files(o.copy_files_from);
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours =
        entry.is_regular_file() &&
        (is_weight_file(name) || std::find(copies.begin(), copies.end(), name) != copies.end());
    if (!ours) {
      throw Error(ErrorCode::OutputHoldsOtherFiles,
                  "save_experts: " + quote(dir) + " holds " + quote(name) +
                      ", which a save does not write; move it away or choose another output");
    }
  }
}

// This rank's tensors: its experts of every grouped module in the per-expert layout, renumbered
// from range.begin; on rank 0 also the other entries and the dense tensors.
StateDict shard_tensors(const Module& module, ExpertRange range, const ParallelSaveOptions& o,
                        bool first_rank) {
  const ConversionPlan plan = plan_conversion(module.state_dict(o.prefix), ExpertLayout::PerExpert,
                                              {.rules = {builtin_rules("te")}});
  const int64_t experts = range.end - range.begin;
  std::vector<std::regex> expert_keys;
  for (const GroupedModule& m : plan.modules) {
    if (m.num_experts != experts) {
      throw Error(ErrorCode::ExpertCountMismatch,
                  "save_experts: module " + quote(m.prefix) + " holds " +
                      std::to_string(m.num_experts) + " experts, expected the range's " +
                      std::to_string(experts) + " (experts [" + std::to_string(range.begin) + ", " +
                      std::to_string(range.end) + "))");
    }
    // Keys are plain text: escape what a regular expression would read otherwise.
    const std::string literal =
        std::regex_replace(m.prefix, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
    expert_keys.emplace_back("^(" + literal + "(?:weight|bias))([0-9]+)(.*)$");
  }
  StateDict out;
  for (const PlannedTensor& t : plan.tensors) {
    std::string name = t.name;
    bool expert = false;
    for (const std::regex& re : expert_keys) {
      std::smatch m;
      if (std::regex_match(t.name, m, re)) {
        name = m[1].str() + std::to_string(std::stoll(m[2].str()) + range.begin) + m[3].str();
        expert = true;
        break;
      }
    }
    if (!expert && !first_rank) continue;
    Tensor value = Tensor::zeros(t.shape, t.dtype);
    t.copy_to(value);
    out.insert(std::move(name), std::move(value));
  }
  if (first_rank) {
    for (const auto& [name, t] : o.dense) out.insert(name, t);
  }
  return out;
}

// Every rank's names and bytes, gathered on rank 0 (others get nothing).
std::vector<std::string> gather_text(MPI_Comm comm, const std::string& mine) {
  const int ranks = comm_size(comm), rank = comm_rank(comm);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(ranks)), offsets(static_cast<size_t>(ranks), 0);
  check_mpi(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm), "MPI_Gather");
  for (int r = 1; r < ranks; ++r) offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::string all(rank == 0 ? static_cast<size_t>(offsets.back() + lengths.back()) : 0, '\0');
  char dummy = 0;
  check_mpi(MPI_Gatherv(mine.data(), length, MPI_CHAR, all.empty() ? &dummy : all.data(),
                        lengths.data(), offsets.data(), MPI_CHAR, 0, comm),
            "MPI_Gatherv");
  std::vector<std::string> texts;
  if (rank != 0) return texts;
  for (int r = 0; r < ranks; ++r) texts.push_back(all.substr(offsets[r], lengths[r]));
  return texts;
}

void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  const bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr && std::fclose(f) != 0)
    throw Error(ErrorCode::IoError, "closing " + quote(path));
  if (!ok) throw Error(ErrorCode::IoError, "writing " + quote(path));
}

}  // namespace

void save_experts(MPI_Comm comm, const Module& module, ExpertRange range, const std::string& dir,
                  const ParallelSaveOptions& options) {
  const int rank = comm_rank(comm), ranks = comm_size(comm);
  // 1. Rank 0 makes the directory's temporary sibling; everyone learns its path.
  std::unique_ptr<detail::AtomicDirectory> staging;
  std::string temp;
  distributed::raise_agreed(comm, failure_of([&] {
                              if (rank != 0) return;
                              check_output(dir, options);
                              staging = detail::AtomicDirectory::create(dir);
                              temp = staging->temp_path();
                            }));
  long long length = static_cast<long long>(temp.size());
  check_mpi(MPI_Bcast(&length, 1, MPI_LONG_LONG, 0, comm), "MPI_Bcast");
  temp.resize(static_cast<size_t>(length));
  check_mpi(MPI_Bcast(temp.data(), static_cast<int>(length), MPI_CHAR, 0, comm), "MPI_Bcast");

  // 2. Each rank writes its shard into it.
  const std::string shard = shard_file_name(CheckpointFormat::Safetensors,
                                            static_cast<size_t>(rank), static_cast<size_t>(ranks));
  nlohmann::json written = nlohmann::json::object();
  distributed::raise_agreed(
      comm, failure_of([&] {
        const StateDict tensors = shard_tensors(module, range, options, rank == 0);
        save_safetensors((fs::path(temp) / shard).string(), tensors, {{"format", "pt"}});
        for (const auto& [name, t] : tensors) written[name] = t.nbytes();
      }));

  // 3. Rank 0 writes the index and the copied files, then renames the directory into place.
  const std::vector<std::string> texts = gather_text(comm, written.dump());
  distributed::raise_agreed(
      comm, failure_of([&] {
        if (rank != 0) return;
        ShardIndex index;
        uint64_t total = 0;
        std::map<std::string, std::string> where;
        for (int r = 0; r < ranks; ++r) {
          const std::string file = shard_file_name(
              CheckpointFormat::Safetensors, static_cast<size_t>(r), static_cast<size_t>(ranks));
          const nlohmann::json names = nlohmann::json::parse(texts[static_cast<size_t>(r)]);
          for (const auto& [name, bytes] : names.items()) {
            if (!where.emplace(name, file).second) {
              throw Error(ErrorCode::DuplicateName,
                          "save_experts: " + quote(name) + " is written by two ranks (" +
                              quote(where[name]) + " and " + quote(file) +
                              "): do the ranks hold overlapping experts?");
            }
            total += bytes.get<uint64_t>();
          }
        }
        index.total_size = total;
        index.weight_map.assign(where.begin(), where.end());
        if (ranks > 1) {
          write_text(staging->file(shard_index_file_name(CheckpointFormat::Safetensors)),
                     shard_index_json(index));
        }
        for (const std::string& name : copied_files(options.copy_files_from)) {
          const fs::path from = fs::path(options.copy_files_from) / name;
          std::error_code ec;
          fs::copy_file(from, staging->file(name), ec);
          if (ec) {
            throw Error(ErrorCode::IoError,
                        "save_experts: copying " + quote(from.string()) + ": " + ec.message());
          }
        }
        staging->commit(options.overwrite);
      }));
}

}  // namespace grouplin
