// inspect_checkpoint: the validated headers of a checkpoint and its grouped modules.
#include "grouplin/inspect.hpp"

#include "io/checkpoints/checkpoint_source.hpp"
#include "layout/dequantize_plan.hpp"
#include "layout/plan.hpp"

namespace grouplin {

CheckpointSummary inspect_checkpoint(const std::string& path, const std::vector<LayoutRules>& rules,
                                     std::string_view model_type, std::string_view state_dict_key) {
  PtReadOptions pt;
  pt.state_dict_key = state_dict_key;
  std::unique_ptr<detail::CheckpointSource> src = detail::CheckpointSource::open(path, pt);
  CheckpointSummary s;
  s.format = src->format();
  s.file_bytes = src->file_bytes();
  s.tensors = src->tensors();  // the views keep the mappings alive
  s.metadata = src->metadata();
  if (const detail::CheckpointDir* dir = src->directory()) {
    s.directory = true;
    s.snapshot = dir->snapshot;
    s.index_file = dir->index_file;
    s.shards = dir->shards;
    s.other_files = dir->other_files;
    s.skipped_files = dir->skipped;
    s.model_type = dir->model_type;
  }
  s.warnings = src->warnings();
  s.scan = layout::scan(s.tensors, {rules,
                                    model_type.empty() ? s.model_type : std::string(model_type),
                                    {},
                                    src->declared_modules()});
  for (Error& e : layout::scale_problems(s.tensors, s.scan))
    s.scan.problems.push_back(std::move(e));
  return s;
}

}  // namespace grouplin
