// libFuzzer target for the sharded-checkpoint index reader: any input must either parse (and
// then write back and parse again to the same index) or throw grouplin::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "grouplin/error.hpp"
#include "grouplin/sharded_checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const grouplin::ShardIndex index = grouplin::parse_shard_index(text, "fuzz.index.json");
    const grouplin::ShardIndex again =
        grouplin::parse_shard_index(grouplin::shard_index_json(index), "written back");
    if (again.weight_map != index.weight_map || again.total_size != index.total_size ||
        again.total_parameters != index.total_parameters) {
      std::abort();  // what the writer writes must read back as the same index
    }
  } catch (const grouplin::Error&) {
  }
  return 0;
}
