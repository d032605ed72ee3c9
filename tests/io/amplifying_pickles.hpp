// Pickles that ask for far more memory or work than their own size: each builds many values out
// of references to a few (the memo makes any value reusable for two bytes). A reader that copies
// what it is handed, instead of sharing it, grows with the product of the two. Used by the
// pickle machine's budget tests, the .pt reader's round trip and the CLI's resident-set test.
// They are not in the fuzz corpora: their cost grows with their size, which made the fuzzers
// spend seconds on each (fuzz/CMakeLists.txt, GROUPLIN_FUZZ_MAX_LEN).
//
//   for (const Amplifier& a : kAmplifiers) run_pickle(bytes(a.make(4 << 20)));  // ~4 MiB each
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "io/formats/zip.hpp"
#include "io/memory_sink.hpp"
#include "io/pickle_builder.hpp"

namespace grouplin::test_pickle {

struct Amplifier {
  const char* name;
  // A pickle of about `bytes` bytes (at least a few hundred).
  std::string (*make)(size_t bytes);
};

// The report that started it: one 64 KiB dict key memoized once, then thousands of small dicts
// that reuse it ("}h\0Nsa": a dict, the key, None, SETITEM, appended to the list). A machine
// that copies keys into per-dict sets holds 64 KiB per 6 bytes of pickle.
inline std::string shared_key_dicts(size_t bytes) {
  using namespace std::string_literals;
  std::string p = "\x80\x02]" + U(std::string(64 << 10, 'k')) + "q\x00"s + "a";
  while (p.size() + 8 < bytes) p += "}h\x00Nsa"s;
  return p + ".";
}

// A list of tensors rebuilt from one memoized function and one memoized argument tuple whose
// size and stride have 64 dimensions: each 6-byte "h\1h\2Ra" asks for a ~1 KiB tensor record.
inline std::string rebuilt_tensors(size_t bytes) {
  using namespace std::string_literals;
  const std::vector<int64_t> ones(64, 1);
  std::string p = "\x80\x02]" + G("torch._utils", "_rebuild_tensor_v2") + "q\x01" + "(" + "(" +
                  U("storage") + G("torch", "FloatStorage") + U("0") + U("cpu") + I(1) + "tQ" +
                  I(0) + T(ones) + T(ones) + "\x89" + kOrderedDict + "tq\x02" + "Ra";
  while (p.size() + 8 < bytes) p += "h\x01h\x02Ra";
  return p + ".";
}

// A state dict whose many short keys all name one memoized rank-64 tensor.
inline std::string aliased_entries(size_t bytes) {
  const std::vector<int64_t> ones(64, 1);
  TensorSpec t;
  t.numel = 1;
  t.size = ones;
  t.stride = ones;
  std::string p = "\x80\x02" + kOrderedDict + "(" + U("w") + tensor(t) + "q\x03";
  for (size_t i = 0; p.size() + 24 < bytes; ++i) {
    std::string key = "w";
    key += std::to_string(i);
    p += U(key);
    p += "h\x03";
  }
  return p + "u.";
}

// Distinct memo keys for one value: a hash-map entry per 5 bytes.
inline std::string memo_flood(size_t bytes) {
  std::string p = "\x80\x02N";
  for (uint32_t k = 0; p.size() + 8 < bytes; ++k) {
    p += 'r';
    p += le(k, 4);
  }
  return p + ".";
}

// One list of Nones: a value and a list slot per 2 bytes.
inline std::string long_list(size_t bytes) {
  std::string p = "\x80\x02]";
  while (p.size() + 4 < bytes) p += "Na";
  return p + ".";
}

// Tuples of references to one memoized value: 24 slots per 50 bytes.
inline std::string tuple_refs(size_t bytes) {
  using namespace std::string_literals;
  std::string p = "\x80\x02]Nq\x00"s + "a";
  while (p.size() + 64 < bytes) {
    p += "(";
    for (int i = 0; i < 24; ++i) p += "h\x00"s;
    p += "ta";
  }
  return p + ".";
}

// Storages with distinct 64-character keys: a storage record and an index entry per ~90 bytes.
inline std::string many_storages(size_t bytes) {
  using namespace std::string_literals;
  std::string p = "\x80\x02]" + U("storage") + "q\x00"s + "a" + G("torch", "FloatStorage") +
                  "q\x01" + "a" + U("cpu") + "q\x02" + "a";
  for (size_t i = 0; p.size() + 100 < bytes; ++i) {
    std::string key = std::to_string(i);
    key = std::string(64 - key.size(), 'k') + key;
    p += "(h\x00h\x01"s + U(key) + "h\x02" + I(1) + "tQa";
  }
  return p + ".";
}

// A .pt archive as torch.save lays it out, around `pickle`, with one 4-byte storage "0".
inline std::string pt_archive(const std::string& pickle) {
  test_io::MemorySink sink;
  zip::ZipWriter w(sink);
  auto add = [&](const std::string& name, const std::string& data) {
    w.add_record(name, {reinterpret_cast<const std::byte*>(data.data()), data.size()});
  };
  add("archive/data.pkl", pickle);
  add("archive/byteorder", "little");
  add("archive/data/0", std::string(4, '\0'));
  add("archive/version", "3\n");
  w.finish();
  return {reinterpret_cast<const char*>(sink.bytes.data()), sink.bytes.size()};
}

inline const std::vector<Amplifier> kAmplifiers = {
    {"shared_key_dicts", shared_key_dicts},
    {"rebuilt_tensors", rebuilt_tensors},
    {"aliased_entries", aliased_entries},
    {"memo_flood", memo_flood},
    {"long_list", long_list},
    {"tuple_refs", tuple_refs},
    {"many_storages", many_storages},
};

}  // namespace grouplin::test_pickle
