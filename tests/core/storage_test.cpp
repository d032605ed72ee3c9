// Storage's memory: large owned storages keep their memory for the next storage of their size,
// within bounds, until release_kept_memory.
#include "grouplin/storage.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace grouplin {
namespace {

constexpr size_t kLarge = (size_t{8} << 20) + 100;  // past the 2 MiB threshold, ragged

TEST(StorageMemory, LargeFreedMemoryIsTakenByTheNextStorageOfItsSize) {
  Storage::release_kept_memory();
  const std::byte* first = nullptr;
  {
    auto s = Storage::allocate_uninitialized(kLarge);
    first = s->data();
    std::memset(s->mutable_data(), 0x5a, kLarge);
  }
  // Another size does not take it; the same size does, its bytes as they were, the padding
  // past the size cleared again.
  auto other = Storage::allocate_uninitialized(kLarge + (size_t{4} << 20));
  EXPECT_NE(other->data(), first);
  auto again = Storage::allocate_uninitialized(kLarge);
  ASSERT_EQ(again->data(), first);
  EXPECT_EQ(again->data()[kLarge - 1], std::byte{0x5a});
  EXPECT_EQ(again->data()[kLarge], std::byte{0});  // padding: never anyone's output
  // allocate() clears what it takes.
  again.reset();
  auto zeroed = Storage::allocate(kLarge);
  ASSERT_EQ(zeroed->data(), first);
  for (size_t i = 0; i < kLarge; i += 4093) ASSERT_EQ(zeroed->data()[i], std::byte{0}) << i;
}

TEST(StorageMemory, ReleaseFreesWhatIsKeptAndSmallStoragesAreNotKept) {
  Storage::release_kept_memory();
  { auto s = Storage::allocate_uninitialized(kLarge); }
  { auto small = Storage::allocate_uninitialized(4096); }
  // The large one's 10 MiB (whole huge pages) are kept; the small one was freed at once.
  EXPECT_EQ(Storage::release_kept_memory(), size_t{10} << 20);
  EXPECT_EQ(Storage::release_kept_memory(), 0u);
}

}  // namespace
}  // namespace grouplin
