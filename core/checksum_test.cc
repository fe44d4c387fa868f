#include "core/checksum.h"

#include <string>

#include "gtest/gtest.h"

namespace dcp {
namespace {

TEST(Checksum, KnownValueAndStreamingAgrees) {
  // XXH3-64 of the empty input with seed 0 (xxHash reference value).
  EXPECT_EQ(Checksum("", 0), 0x2D06800538D394C2ULL);
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  StreamingChecksum stream;
  stream.Update(data.data(), 1);
  stream.Update(data.data() + 1, 4095);
  stream.Update(data.data() + 4096, data.size() - 4096);
  EXPECT_EQ(stream.Digest(), Checksum(data.data(), data.size()));
  data[500] ^= 1;
  EXPECT_NE(stream.Digest(), Checksum(data.data(), data.size()));
}

}  // namespace
}  // namespace dcp
