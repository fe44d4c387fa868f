// `dcp demo`'s flags: sizes and seeds are parsed with overflow checks and
// out-of-range values are refused (never wrapped, saturated or allocated);
// --mode load takes the state's size from the checkpoint.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/testing/sample_state.h"
#include "tools/commands.h"

namespace dcp {
namespace {

using ::dcp::testing::NewTestDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(ParseSizeTest, TakesUnitsAndFractions) {
  EXPECT_EQ(*ParseSize("1000000"), 1000000);
  EXPECT_EQ(*ParseSize("0"), 0);
  EXPECT_EQ(*ParseSize("17B"), 17);
  EXPECT_EQ(*ParseSize("1.5KiB"), 1536);
  EXPECT_EQ(*ParseSize("256MiB"), 256 << 20);
  EXPECT_EQ(*ParseSize("256mb"), 256 << 20);
  EXPECT_EQ(*ParseSize("1GiB"), kGiB);
  EXPECT_EQ(*ParseSize("4G"), 4 * kGiB);
  EXPECT_EQ(*ParseSize(".5G"), kGiB / 2);
  EXPECT_EQ(*ParseSize("2TiB"), 2048 * kGiB);
  // The largest sizes that fit in int64, whole and with a fraction.
  EXPECT_EQ(*ParseSize("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(*ParseSize("8589934591GiB"), INT64_MAX - kGiB + 1);
  EXPECT_EQ(*ParseSize("8589934591.9999999999GiB"), INT64_MAX);
}

TEST(ParseSizeTest, RefusesWhatDoesNotFitInsteadOfWrapping) {
  // 99999999999999GiB once wrapped to a 147 KB state.
  for (const char* text :
       {"99999999999999GiB", "8589934592GiB", "9223372036854775808",
        "99999999999999999999999", "8388608TiB"}) {
    absl::StatusOr<int64_t> size = ParseSize(text);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(size.status().message(),
                AllOf(HasSubstr(text), HasSubstr("too large")));
  }
}

TEST(ParseSizeTest, RefusesWhatIsNotASize) {
  for (const char* text : {"", "GiB", "-1GiB", "1.2.3GiB", "1XB", "1 GiB",
                           "1e9", "0x10", "1GiBs"}) {
    EXPECT_EQ(ParseSize(text).status().code(),
              absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(ParseSeedTest, TakesTheWholeUint64RangeAndNothingElse) {
  EXPECT_EQ(*ParseSeed("0"), 0u);
  EXPECT_EQ(*ParseSeed("1"), 1u);
  EXPECT_EQ(*ParseSeed("18446744073709551615"), UINT64_MAX);
  for (const char* text : {"18446744073709551616", "99999999999999999999999",
                           "-1", "", "+1", " 1", "1e3", "0x10", "seed"}) {
    absl::StatusOr<uint64_t> seed = ParseSeed(text);
    EXPECT_EQ(seed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(seed.status().message(),
                HasSubstr("from 0 to 18446744073709551615"));
  }
}

DemoFlags Flags(const std::string& dir, const std::string& mode,
                const std::string& size) {
  DemoFlags flags;
  flags.dir = dir;
  flags.mode = mode;
  flags.size = size;
  flags.cold_load = false;
  return flags;
}

TEST(RunDemoTest, RefusesOutOfRangeFlagsBeforeAllocating) {
  const std::string dir = NewTestDir("demo_flags");
  // 100000GiB once ended in std::bad_alloc; no machine here has that much.
  absl::Status status = RunDemo(Flags(dir, "save", "100000GiB"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("100000GiB"), HasSubstr("memory")));
  status = RunDemo(Flags(dir, "roundtrip", "99999999999999GiB"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // Without --dir the demo works in a temporary directory: a refused size
  // creates none.
  const std::string tmp = NewTestDir("demo_tmp");
  ASSERT_EQ(::setenv("TMPDIR", tmp.c_str(), 1), 0);
  status = RunDemo(Flags("", "roundtrip", "100000GiB"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(::dcp::testing::ListNames(tmp), ::testing::IsEmpty());

  DemoFlags flags = Flags(dir, "save", "1MiB");
  flags.seed = "99999999999999999999999";
  status = RunDemo(flags);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("99999999999999999999999"));
  EXPECT_THAT(::dcp::testing::ListNames(dir), ::testing::IsEmpty());
}

TEST(RunDemoTest, LoadTakesTheSizeFromTheCheckpoint) {
  const std::string dir = NewTestDir("demo_load_size");
  DemoFlags save = Flags(dir, "save", "3MiB");
  save.seed = "18446744073709551615";
  ASSERT_TRUE(RunDemo(save).ok());

  DemoFlags load = Flags(dir, "load", "");
  load.seed = save.seed;
  absl::Status status = RunDemo(load);
  EXPECT_TRUE(status.ok()) << status;
  // The same size is fine; another is refused naming both shapes.
  load.size = "3MiB";
  status = RunDemo(load);
  EXPECT_TRUE(status.ok()) << status;
  load.size = "64MiB";
  status = RunDemo(load);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("[585, 1024]"), HasSubstr("holds [27, 1024]"),
                    HasSubstr("leave --size out")));
  // The values are still checked: another seed does not verify.
  load.size = "";
  load.seed = "2";
  EXPECT_EQ(RunDemo(load).code(), absl::StatusCode::kDataLoss);
}

TEST(RunDemoTest, CompressionRoundTripsAndInspectShowsTheExtension) {
  const std::string dir = NewTestDir("demo_zstd");
  DemoFlags flags = Flags(dir, "roundtrip", "3MiB");
  flags.compression = "zstd:1";
  ASSERT_TRUE(RunDemo(flags).ok());  // Loads and checks every byte.
  ::testing::internal::CaptureStdout();
  absl::Status inspected = RunInspect(dir);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(inspected.ok()) << inspected;
  EXPECT_THAT(out, HasSubstr("format dcp-2"));
  EXPECT_THAT(out, HasSubstr("zstd/1.0 ratio "));
  EXPECT_TRUE(RunVerify(dir).ok());

  flags.compression = "zstd:99";
  absl::Status status = RunDemo(flags);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("zstd level"));
}

TEST(RunDemoTest, LoadWithoutSizeNeedsADemoCheckpoint) {
  const std::string dir = NewTestDir("demo_load_other");
  ASSERT_TRUE(
      ::dcp::testing::SaveSample(dir, ::dcp::testing::SampleState::Make(1))
          .ok());
  absl::Status status = RunDemo(Flags(dir, "load", ""));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("holds no dcp demo state"));
  status = RunDemo(Flags(NewTestDir("demo_load_empty"), "load", ""));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

}  // namespace
}  // namespace dcp
