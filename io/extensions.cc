#include "io/extensions.h"

#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/status.h"

namespace dcp {
namespace {

bool IsExtensionName(absl::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

bool ParseVersionNumber(absl::string_view text, int* out) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), absl::ascii_isdigit)) {
    return false;
  }
  return absl::SimpleAtoi(text, out);
}

// Blocks of at least kSampledBlockBytes are compressed only when
// kSampleSlices slices of kSampleBytes in all, spread over the block, shrink
// by at least 1/kMinSavingsFraction.
constexpr size_t kSampledBlockBytes = size_t{256} << 10;
constexpr size_t kSampleBytes = size_t{32} << 10;
constexpr size_t kSampleSlices = 4;
constexpr size_t kMinSavingsFraction = 50;

// The zstd extension. libzstd contexts are per thread (thread_local), so
// one instance serves every writer and reader thread.
class ZstdExtension final : public StreamExtension {
 public:
  explicit ZstdExtension(int level) : level_(level) {}

  absl::string_view name() const override { return "zstd"; }
  int major_version() const override { return 1; }

  absl::StatusOr<size_t> Encode(absl::Span<const std::byte> in,
                                absl::Span<std::byte> out) const override {
    if (in.empty()) return size_t{0};
    thread_local std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(
        ZSTD_createCCtx(), &ZSTD_freeCCtx);
    if (cctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createCCtx");
    ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
    if (in.size() >= kSampledBlockBytes) {
      // Incompressible blocks (random bytes, some optimizer state) cost a
      // full compression pass to find out; a few slices spread over the
      // block decide for a small fraction of that.
      const size_t slice = kSampleBytes / kSampleSlices;
      std::byte sample[kSampleBytes];
      for (size_t k = 0; k < kSampleSlices; ++k) {
        std::memcpy(sample + k * slice,
                    in.data() + (in.size() - slice) * k / (kSampleSlices - 1),
                    slice);
      }
      const size_t n = ZSTD_compress2(cctx.get(), out.data(),
                                      std::min(out.size(), kSampleBytes),
                                      sample, kSampleBytes);
      if (ZSTD_isError(n) ||
          n > kSampleBytes - kSampleBytes / kMinSavingsFraction) {
        return in.size();
      }
    }
    // Room for one byte less than the input: output that would not shrink
    // the block stops zstd with dstSize_tooSmall instead.
    const size_t capacity = std::min(out.size(), in.size() - 1);
    const size_t n =
        ZSTD_compress2(cctx.get(), out.data(), capacity, in.data(), in.size());
    if (ZSTD_isError(n)) {
      if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) {
        return in.size();
      }
      return absl::InternalError(
          absl::StrCat("zstd compression failed: ", ZSTD_getErrorName(n)));
    }
    return n;
  }

  absl::StatusOr<size_t> Decode(absl::Span<const std::byte> in,
                                absl::Span<std::byte> out) const override {
    thread_local std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(
        ZSTD_createDCtx(), &ZSTD_freeDCtx);
    if (dctx == nullptr) return absl::ResourceExhaustedError("ZSTD_createDCtx");
    // One frame exactly, declaring its size: trailing bytes or a second
    // frame are corruption, not more data.
    const size_t frame = ZSTD_findFrameCompressedSize(in.data(), in.size());
    if (ZSTD_isError(frame) || frame != in.size()) {
      return absl::DataLossError(
          absl::StrCat("not one zstd frame of ", in.size(), " bytes",
                       ZSTD_isError(frame)
                           ? absl::StrCat(" (", ZSTD_getErrorName(frame), ")")
                           : absl::StrCat(" (a frame of ", frame, ")")));
    }
    const unsigned long long content =
        ZSTD_getFrameContentSize(in.data(), in.size());
    if (content == ZSTD_CONTENTSIZE_UNKNOWN ||
        content == ZSTD_CONTENTSIZE_ERROR || content > out.size()) {
      return absl::DataLossError(absl::StrCat(
          "zstd frame declares content size ",
          content == ZSTD_CONTENTSIZE_UNKNOWN ? "unknown"
          : content == ZSTD_CONTENTSIZE_ERROR ? "invalid"
                                              : absl::StrCat(content),
          ", more than the ", out.size(), " bytes expected"));
    }
    const size_t n = ZSTD_decompressDCtx(dctx.get(), out.data(), out.size(),
                                         in.data(), in.size());
    if (ZSTD_isError(n)) {
      return absl::DataLossError(
          absl::StrCat("zstd frame does not decode: ", ZSTD_getErrorName(n)));
    }
    return n;
  }

 private:
  const int level_;
};

}  // namespace

std::string StreamExtension::descriptor() const {
  return absl::StrCat(name(), "/", major_version(), ".", minor_version());
}

absl::StatusOr<ExtensionDescriptor> ParseExtensionDescriptor(
    absl::string_view text) {
  const size_t slash = text.find('/');
  ExtensionDescriptor out;
  if (slash != absl::string_view::npos) {
    const absl::string_view name = text.substr(0, slash);
    const absl::string_view version = text.substr(slash + 1);
    const size_t dot = version.find('.');
    if (IsExtensionName(name) &&
        ParseVersionNumber(version.substr(0, dot), &out.major) &&
        (dot == absl::string_view::npos ||
         ParseVersionNumber(version.substr(dot + 1), &out.minor))) {
      out.name = std::string(name);
      return out;
    }
  }
  return absl::DataLossError(absl::StrCat(
      "extension descriptor \"", absl::CHexEscape(text),
      "\" is not name/MAJOR[.MINOR] (lowercase name, decimal versions)"));
}

const ExtensionRegistry& ExtensionRegistry::Default() {
  static const ExtensionRegistry* registry = [] {
    auto* r = new ExtensionRegistry();
    r->Register(NewZstdExtension()).IgnoreError();
    return r;
  }();
  return *registry;
}

absl::Status ExtensionRegistry::Register(
    std::shared_ptr<const StreamExtension> extension) {
  if (extension == nullptr || !IsExtensionName(extension->name())) {
    return absl::InvalidArgumentError(
        "an extension needs a name of lowercase letters, digits, _ and -");
  }
  auto [it, inserted] =
      by_name_.try_emplace(std::string(extension->name()), extension);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat(
        "extension ", extension->name(), " is registered already (as ",
        it->second->descriptor(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<const StreamExtension*> ExtensionRegistry::Find(
    absl::string_view descriptor, absl::string_view item) const {
  absl::StatusOr<ExtensionDescriptor> parsed =
      ParseExtensionDescriptor(descriptor);
  if (!parsed.ok()) return Annotate(parsed.status(), item);
  auto it = by_name_.find(parsed->name);
  if (it == by_name_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        item, " is stored through extension ", descriptor,
        ", which this dcp does not know (known: ",
        by_name_.empty() ? "none" : absl::StrJoin(Descriptors(), ", "),
        "); load it with a dcp that has extension ", parsed->name));
  }
  if (it->second->major_version() != parsed->major) {
    return absl::FailedPreconditionError(absl::StrCat(
        item, " is stored through extension ", descriptor, ": this dcp reads ",
        parsed->name, " major version ", it->second->major_version(), " (",
        it->second->descriptor(), "), not ", parsed->major));
  }
  return it->second.get();
}

std::vector<std::string> ExtensionRegistry::Descriptors() const {
  std::vector<std::string> out;
  for (const auto& [name, extension] : by_name_) {
    out.push_back(extension->descriptor());
  }
  return out;
}

std::shared_ptr<const StreamExtension> NewZstdExtension(int level) {
  return std::make_shared<ZstdExtension>(level);
}

absl::StatusOr<ExtensionChain> ParseCompression(absl::string_view text) {
  if (text == "none" || text.empty()) return ExtensionChain{};
  if (text == "zstd") {
    return ExtensionChain{NewZstdExtension()};
  }
  if (absl::ConsumePrefix(&text, "zstd:")) {
    int level = 0;
    if (absl::SimpleAtoi(text, &level) && level >= ZSTD_minCLevel() &&
        level <= ZSTD_maxCLevel() && level != 0) {
      return ExtensionChain{NewZstdExtension(level)};
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "zstd level \"", text, "\" is not a number in [", ZSTD_minCLevel(),
        ", ", ZSTD_maxCLevel(), "] other than 0"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "compression \"", text, "\" is not none, zstd or zstd:LEVEL"));
}

absl::StatusOr<size_t> EncodeBlock(const ExtensionChain& chain,
                                   absl::Span<const std::byte> in,
                                   absl::Span<std::byte> out,
                                   std::vector<std::byte>& scratch) {
  auto stored_raw = [&]() -> size_t { return in.size(); };
  if (chain.empty() || in.empty()) return stored_raw();
  // Stage k reads `from` and writes the buffer the last stage writes `out`
  // into; earlier stages alternate between the two halves of `scratch`.
  if (chain.size() > 1 && scratch.size() < 2 * in.size()) {
    scratch.resize(2 * in.size());
  }
  absl::Span<const std::byte> from = in;
  for (size_t k = 0; k < chain.size(); ++k) {
    absl::Span<std::byte> to =
        k + 1 == chain.size()
            ? out
            : absl::Span<std::byte>(scratch.data() + (k % 2) * in.size(),
                                    in.size());
    DCP_ASSIGN_OR_RETURN(size_t n, chain[k]->Encode(from, to));
    if (n >= from.size()) return stored_raw();
    from = absl::Span<const std::byte>(to.data(), n);
  }
  return from.size();
}

absl::StatusOr<std::vector<const StreamExtension*>> ResolveExtensions(
    const ExtensionRegistry& registry,
    const std::vector<std::string>& descriptors, absl::string_view item) {
  std::vector<const StreamExtension*> out;
  out.reserve(descriptors.size());
  for (const std::string& descriptor : descriptors) {
    DCP_ASSIGN_OR_RETURN(const StreamExtension* extension,
                         registry.Find(descriptor, item));
    out.push_back(extension);
  }
  return out;
}

absl::Status DecodeBlock(const std::vector<const StreamExtension*>& chain,
                         absl::Span<const std::byte> in,
                         absl::Span<std::byte> raw,
                         std::vector<std::byte>& scratch) {
  if (in.size() > raw.size()) {
    return absl::DataLossError(absl::StrCat("a stored block of ", in.size(),
                                            " bytes is larger than its ",
                                            raw.size(), " raw bytes"));
  }
  if (in.size() == raw.size() || chain.empty()) {
    if (in.size() != raw.size()) {
      return absl::DataLossError(absl::StrCat("a stored block of ", in.size(),
                                              " bytes without extensions has ",
                                              raw.size(), " raw bytes"));
    }
    std::memcpy(raw.data(), in.data(), in.size());
    return absl::OkStatus();
  }
  if (chain.size() > 1 && scratch.size() < 2 * raw.size()) {
    scratch.resize(2 * raw.size());
  }
  absl::Span<const std::byte> from = in;
  for (size_t k = chain.size(); k-- > 0;) {
    absl::Span<std::byte> to =
        k == 0 ? raw
               : absl::Span<std::byte>(scratch.data() + (k % 2) * raw.size(),
                                       raw.size());
    absl::StatusOr<size_t> n = chain[k]->Decode(from, to);
    if (!n.ok()) {
      return Annotate(n.status(),
                      absl::StrCat("extension ", chain[k]->descriptor()));
    }
    from = absl::Span<const std::byte>(to.data(), *n);
  }
  if (from.size() != raw.size()) {
    return absl::DataLossError(absl::StrCat("a stored block decodes to ",
                                            from.size(), " bytes, not its ",
                                            raw.size(), " raw bytes"));
  }
  return absl::OkStatus();
}

}  // namespace dcp
