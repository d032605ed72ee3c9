// libFuzzer target for the checkpoint scan and the layout rules: a text input describes a state
// dict (names, dtypes, shapes; dims from 0 to 2^40) and the rules to read it with (auto with a
// model type, built-in sets, or a rule file). The scan must never throw; planning every target
// must either succeed with consistent tensors (bytes = numel x dtype size, names unique) or throw
// grouplin::Error; small plans are then copied out, rearranged experts included.
//
//   model_type gpt_oss
//   rules gpt_oss,te
//   rulefile {"name": "r", "tensors": [...]}
//   T model.layers.0.mlp.experts.gate_up_proj BF16 4x32x48
//
// Tensors are views of one large read-only anonymous mapping that nothing writes: shapes of
// terabytes cost no memory, and reading one (a copy of a small plan) reads zeros.
#include <sys/mman.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "grouplin/checkpoint_layout.hpp"
#include "grouplin/error.hpp"
#include "grouplin/layout_rules.hpp"
#include "grouplin/storage.hpp"
#include "layout/plan.hpp"

namespace {

using namespace grouplin;

constexpr uint64_t kRegion = uint64_t{1} << 40;  // virtual only
// Plans copied out when this small: past the copier's 256 KiB staging chunk (planned_tensor.cpp),
// so chunked conversions run too, yet a copy costs no more than the planning around it.
constexpr uint64_t kCopyLimit = uint64_t{512} << 10;

std::shared_ptr<Storage> region() {
  static std::shared_ptr<Storage> s = [] {
    void* p =
        ::mmap(nullptr, kRegion, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    return Storage::wrap(static_cast<const std::byte*>(p), kRegion, nullptr);
  }();
  return s;
}

std::optional<DType> dtype_of(std::string_view name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2, DType::U8,
                  DType::I8, DType::I32, DType::I64, DType::BOOL, DType::F64}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

// "4x32x48" (or "-" for rank 0) -> shape; nullopt for anything else or more than 5 dims.
std::optional<Shape> shape_of(std::string_view text) {
  Shape shape;
  if (text == "-") return shape;
  while (!text.empty() && shape.size() < 5) {
    const size_t x = text.find('x');
    const std::string_view dim = text.substr(0, x);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(dim.data(), dim.data() + dim.size(), v);
    if (ec != std::errc() || p != dim.data() + dim.size() || v < 0 || v > (int64_t{1} << 40)) {
      return std::nullopt;
    }
    shape.push_back(v);
    if (x == std::string_view::npos) return shape;
    text = text.substr(x + 1);
  }
  return std::nullopt;
}

void check_plan(const ConversionPlan& plan) {
  uint64_t total = 0;
  for (const PlannedTensor& t : plan.tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) std::abort();
    }
    if (numel * dtype_size(t.dtype) != t.nbytes()) std::abort();  // bytes match the shape
    total += t.nbytes();
  }
  PlannedDict names(plan.tensors);  // throws DuplicateName: a planner bug, not an input's
  if (total > kCopyLimit) return;
  for (const PlannedTensor& t : plan.tensors) {
    Tensor out = Tensor::zeros(t.shape, t.dtype);
    t.copy_to(out);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // a dict of a few hundred entries says all a scan can
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StateDict dict;
  PlanOptions options;
  uint64_t used = 0;
  size_t begin = 0;
  try {
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) end = text.size();
      const std::string_view line = text.substr(begin, end - begin);
      begin = end + 1;
      if (line.starts_with("model_type ")) {
        options.model_type = std::string(line.substr(11));
      } else if (line.starts_with("rules ")) {
        std::string_view names = line.substr(6);
        while (!names.empty()) {
          const size_t comma = names.find(',');
          options.rules.push_back(builtin_rules(names.substr(0, comma)));
          names = comma == std::string_view::npos ? "" : names.substr(comma + 1);
        }
      } else if (line.starts_with("rulefile ")) {
        options.rules.push_back(parse_rules(line.substr(9), "fuzz rules"));
      } else if (line.starts_with("T ")) {
        const std::string_view rest = line.substr(2);
        const size_t a = rest.find(' ');
        const size_t b = a == std::string_view::npos ? a : rest.find(' ', a + 1);
        if (b == std::string_view::npos) continue;
        const std::optional<DType> dtype = dtype_of(rest.substr(a + 1, b - a - 1));
        const std::optional<Shape> shape = shape_of(rest.substr(b + 1));
        if (!dtype || !shape) continue;
        uint64_t bytes = dtype_size(*dtype);
        bool fits = true;
        for (int64_t d : *shape) fits = fits && !__builtin_mul_overflow(bytes, d, &bytes);
        if (!fits || bytes > kRegion) continue;
        const std::string name(rest.substr(0, a));
        if (name.empty() || dict.contains(name)) continue;
        // Each entry its own range of the region (as in a file), wrapping around: only shapes
        // and positions matter to the scan.
        if (used + bytes > kRegion) used = 0;
        dict.insert(name, Tensor::view_of(region(), used, *shape, *dtype));
        used += bytes;
      }
    }
  } catch (const Error&) {
    return 0;  // an unknown built-in name or a broken rule file: refused, as it must be
  }
  const GroupedScan scan = layout::scan(dict, options);  // never throws for what the dict holds
  for (const GroupedModule& m : scan.modules) {
    if (m.num_experts < 1 || m.keys.empty() || m.tensors.empty()) std::abort();
  }
  for (layout::Target target : {layout::Target::Single, layout::Target::PerExpert,
                                layout::Target::Compare, layout::Target::Load}) {
    try {
      check_plan(layout::plan(dict, target, options));
    } catch (const Error&) {
    }
  }
  return 0;
}
