#include "core/status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace dcp {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  DCP_ASSIGN_OR_RETURN(int half, Half(x));
  DCP_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  DCP_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusMacros, PropagateErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_EQ(CheckEven(3).message(), "odd");
}

TEST(ErrnoError, MapsCodesAndKeepsContext) {
  absl::Status full = ErrnoError(ENOSPC, "pwrite /d/f offset=4096");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("pwrite /d/f offset=4096"),
            absl::string_view::npos);
  EXPECT_EQ(ErrnoError(EIO, "read").code(), absl::StatusCode::kDataLoss);
  // A file-size limit: the disk's kind of failure, not a bad argument.
  EXPECT_EQ(ErrnoError(EFBIG, "fallocate").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError(ENOENT, "open").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError(EACCES, "open").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Annotate, PrefixesMessageKeepsCodeAndPayload) {
  absl::Status s = absl::DataLossError("bad");
  s.SetPayload("dcp/x", absl::Cord("y"));
  absl::Status a = Annotate(s, "rank 2");
  EXPECT_EQ(a.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.message(), "rank 2: bad");
  EXPECT_EQ(a.GetPayload("dcp/x").value(), absl::Cord("y"));
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace dcp
