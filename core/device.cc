#include "core/device.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dcp {

std::string Device::ToString() const {
  if (is_cpu()) return "cpu";
  return absl::StrCat("cuda:", index);
}

absl::StatusOr<Device> Device::Parse(absl::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  int index = 0;
  absl::string_view ordinal = text;
  if (absl::ConsumePrefix(&ordinal, "cuda:") &&
      absl::SimpleAtoi(ordinal, &index) && index >= 0) {
    return Device::Cuda(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad device \"", text, "\"; expected cpu, cuda or cuda:N"));
}

}  // namespace dcp
