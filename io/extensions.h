// Stream extensions: transforms of the stored bytes of a checkpoint item
// (compression), applied block by block on write and undone on read, and
// recorded per item in the metadata so that a reader finds them through an
// ExtensionRegistry. docs/FORMAT.md, "Extensions", specifies the record.
//
// An item stored through extensions is cut into blocks of the checkpoint's
// checksum_block_size raw bytes (the last may be shorter). Each block is
// encoded on its own (an independent zstd frame, say), so a reader that needs
// a slice decodes only the blocks it touches; a block whose encoding does not
// shrink it is stored as is. The stored blocks follow each other without gaps,
// and each carries the checksum of its stored bytes.
//
// Thread safety: StreamExtension's methods, ExtensionRegistry's const
// methods, and the free functions are thread-safe.
#ifndef DCP_IO_EXTENSIONS_H_
#define DCP_IO_EXTENSIONS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dcp {

// One transform of a block of stored bytes, identified by a descriptor
// "name/MAJOR.MINOR" recorded in the metadata. A reader decodes a block
// written by any version of the same name and major version (a new minor
// version may only add what older decoders ignore); a different major
// version is a different format.
class StreamExtension {
 public:
  virtual ~StreamExtension() = default;

  // Lowercase letters, digits, '_' and '-'; not empty.
  virtual absl::string_view name() const = 0;
  virtual int major_version() const = 0;
  virtual int minor_version() const { return 0; }
  // "name/MAJOR.MINOR", as the metadata records it.
  std::string descriptor() const;

  // Encodes the block `in` (not empty) into `out`, which holds at least
  // in.size() bytes, and returns the encoded size. A result of in.size() or
  // more means "does not shrink" (an extension may also decline a block it
  // would shrink too little to be worth decoding): the block is then stored
  // as is, and what `out` holds is unspecified. Errors are internal failures
  // of the codec.
  virtual absl::StatusOr<size_t> Encode(absl::Span<const std::byte> in,
                                        absl::Span<std::byte> out) const = 0;

  // Decodes the encoded block `in` into `out` and returns the decoded size.
  // kDataLoss when `in` is not a valid encoding or decodes to more than
  // out.size() bytes: the bytes are untrusted, and a decoder never writes
  // outside `out`.
  virtual absl::StatusOr<size_t> Decode(absl::Span<const std::byte> in,
                                        absl::Span<std::byte> out) const = 0;
};

// A descriptor split into its parts.
struct ExtensionDescriptor {
  std::string name;
  int major = 0;
  int minor = 0;
};

// Parses "name/MAJOR" or "name/MAJOR.MINOR" (name as StreamExtension::name;
// versions decimal, at most 9 digits). kDataLoss quoting `text` otherwise.
absl::StatusOr<ExtensionDescriptor> ParseExtensionDescriptor(
    absl::string_view text);

// The extensions a reader knows, by name. Register them explicitly; Default()
// holds the ones dcp ships (zstd).
class ExtensionRegistry {
 public:
  ExtensionRegistry() = default;

  // The registry readers use unless given another: zstd/1. Never destroyed.
  static const ExtensionRegistry& Default();

  // Adds `extension`. kAlreadyExists when its name is registered.
  absl::Status Register(std::shared_ptr<const StreamExtension> extension);

  // The extension that decodes what `descriptor` encoded. `item` names the
  // stored item (tensor and chunk) in messages. kFailedPrecondition naming
  // the item, the descriptor and the known extensions for a name this
  // registry does not know or a major version it does not read; kDataLoss
  // for a malformed descriptor.
  absl::StatusOr<const StreamExtension*> Find(absl::string_view descriptor,
                                              absl::string_view item) const;

  // The registered descriptors, sorted ("zstd/1.0").
  std::vector<std::string> Descriptors() const;

 private:
  std::map<std::string, std::shared_ptr<const StreamExtension>> by_name_;
};

// Extensions applied in order to each block of an item (the descriptors a
// StorageInfo records). Empty: items are stored as they are.
using ExtensionChain = std::vector<std::shared_ptr<const StreamExtension>>;

// The zstd extension ("zstd/1.0", libzstd): each block one zstd frame with
// its content size. `level` is zstd's compression level (ZSTD_minCLevel()..
// ZSTD_maxCLevel(); negative levels are faster). Decoding ignores it. Blocks
// of 256 KiB or more are first sampled (32 KiB from four places): when the
// sample shrinks by less than 2% the block is declined (stored as is)
// without compressing it, so incompressible state costs little.
inline constexpr int kDefaultZstdLevel = 1;
std::shared_ptr<const StreamExtension> NewZstdExtension(
    int level = kDefaultZstdLevel);

// Parses a compression setting for command lines and options: "none" (an
// empty chain), "zstd" (kDefaultZstdLevel) or "zstd:LEVEL". kInvalidArgument
// quoting `text` otherwise.
absl::StatusOr<ExtensionChain> ParseCompression(absl::string_view text);

// Encodes one block through `chain` (each extension applied to the previous
// one's output) into `out` (at least in.size() bytes) with `scratch` for
// intermediate results, and returns the stored size: in.size() when the
// block is stored as is (some extension did not shrink its input; what
// `out` holds is unspecified: the stored bytes are `in`), less when
// encoded.
absl::StatusOr<size_t> EncodeBlock(const ExtensionChain& chain,
                                   absl::Span<const std::byte> in,
                                   absl::Span<std::byte> out,
                                   std::vector<std::byte>& scratch);

// The extensions that decode the item whose StorageInfo records
// `descriptors`, in the order they were applied; errors as
// ExtensionRegistry::Find.
absl::StatusOr<std::vector<const StreamExtension*>> ResolveExtensions(
    const ExtensionRegistry& registry,
    const std::vector<std::string>& descriptors, absl::string_view item);

// Decodes one stored block of `raw.size()` raw bytes: a copy when it was
// stored as is (in.size() == raw.size()), otherwise the chain undone in
// reverse order (`scratch` holds intermediate results, each at most
// raw.size() bytes since every extension shrank its input). kDataLoss when
// the stored block is larger than its raw size or does not decode to
// exactly raw.size() bytes.
absl::Status DecodeBlock(const std::vector<const StreamExtension*>& chain,
                         absl::Span<const std::byte> in,
                         absl::Span<std::byte> raw,
                         std::vector<std::byte>& scratch);

}  // namespace dcp

#endif  // DCP_IO_EXTENSIONS_H_
