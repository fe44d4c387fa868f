// `dcp bench io --ceiling`: the software path alone, where no disk limits.
// On a tmpfs directory, in one process, per repetition (alternating which
// goes first) dcp's Save (FileSystemWriter defaults: checksums, sync) and
// Load into a preallocated, touched state, against a plain pwritev of the
// same tensors to one file plus fsync and a plain preadv of it into the
// same destination, both on one thread. Reports GB/s, the ratio dcp/plain
// per repetition (issue 19's bar: 0.8), and CPU seconds (user + system, all
// threads) per GB for each. Every read is checked byte for byte, untimed.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "bench/bench_env.h"
#include "bench/io_bench.h"
#include "core/state_dict.h"
#include "core/status.h"
#include "engine/checkpoint.h"
#include "io/file_system_storage.h"
#include "io/io_engine.h"
#include "tools/machine_info.h"
#include "tools/synthetic_state.h"

namespace dcp::io_bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Issue 19's bar: dcp's save and load at least this share of the plain path.
constexpr double kCeilingBar = 0.8;

// The tensor memory of `state`, in flattened-name order (a sharded tensor's
// local shards in their order); empty tensors are left out.
absl::StatusOr<std::vector<iovec>> TensorMemory(StateDict& state) {
  DCP_ASSIGN_OR_RETURN(auto leaves, FlattenStateDictInPlace(state));
  std::vector<iovec> memory;
  auto add = [&](const Tensor& t) {
    if (t.nbytes() > 0) memory.push_back({t.data(), t.nbytes()});
  };
  for (const auto& [name, value] : leaves) {
    if (value->is_tensor()) add(value->tensor());
    if (value->is_sharded_tensor()) {
      for (const Shard& shard : value->sharded_tensor().local_shards()) {
        add(shard.tensor);
      }
    }
  }
  return memory;
}

// The plain path: one file written from `memory` (pwritev, then fsync) or
// read into it (preadv), in order, IOV_MAX pieces per call, on this thread.
absl::Status PlainVectorIo(const std::string& path,
                           const std::vector<iovec>& memory, bool write) {
  const int fd = ::open(
      path.c_str(),
      write ? O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC,
      0644);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("open ", path));
  std::vector<iovec> left = memory;  // Advanced past what is transferred.
  size_t next = 0;
  off_t offset = 0;
  absl::Status status;
  while (next < left.size()) {
    const int count =
        static_cast<int>(std::min<size_t>(IOV_MAX, left.size() - next));
    const ssize_t n = write ? ::pwritev(fd, &left[next], count, offset)
                            : ::preadv(fd, &left[next], count, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = ErrnoError(
          errno, absl::StrFormat("%s %s offset=%d",
                                 write ? "pwritev" : "preadv", path, offset));
      break;
    }
    if (n == 0) {
      status = absl::DataLossError(
          absl::StrCat(path, " ends at ", offset, " bytes, before the state"));
      break;
    }
    offset += n;
    for (size_t done = n; done > 0;) {
      if (done >= left[next].iov_len) {
        done -= left[next].iov_len;
        ++next;
      } else {
        left[next].iov_base = static_cast<char*>(left[next].iov_base) + done;
        left[next].iov_len -= done;
        done = 0;
      }
    }
  }
  if (status.ok() && write && ::fsync(fd) != 0) {
    status = ErrnoError(errno, absl::StrCat("fsync ", path));
  }
  ::close(fd);
  return status;
}

// OK when every tensor byte of `actual` equals `expected`'s (same layout);
// then zeroes `actual`, so the next load into it is checked afresh (its
// pages stay touched).
absl::Status CheckAndZero(const std::vector<iovec>& expected,
                          const std::vector<iovec>& actual,
                          const std::string& what) {
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(expected[i].iov_base, actual[i].iov_base,
                    expected[i].iov_len) != 0) {
      return absl::DataLossError(
          absl::StrCat(what, ": tensor ", i, " differs after the read"));
    }
    std::memset(actual[i].iov_base, 0, actual[i].iov_len);
  }
  return absl::OkStatus();
}

// Times fn() on this thread and records a row of `variant` with its CPU
// time (all threads of this process) per GB moved.
template <typename Fn>
absl::StatusOr<json> TimeCeiling(const std::string& variant, int rep,
                                 int64_t bytes, Fn fn) {
  ::sync();  // Nothing pending elsewhere lands inside the clock.
  const ResourceMeter meter;
  const Clock::time_point start = Clock::now();
  DCP_RETURN_IF_ERROR(fn());
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  const ResourceMeter::Use use = meter.Elapsed();
  const double gb = bytes / 1e9;
  json row = {
      {"measurement", "ceiling"},
      {"variant", variant},
      {"rep", rep},
      {"bytes", bytes},
      {"seconds", seconds},
      {"gbps", gb / seconds},
      {"user_seconds", use.user_seconds},
      {"system_seconds", use.system_seconds},
      {"cpu_seconds_per_gb", (use.user_seconds + use.system_seconds) / gb},
      {"minor_faults", use.minor_faults}};
  Log(absl::StrFormat("  %-11s %6.3f GB/s  %.3f CPU s/GB", variant,
                      row.at("gbps").get<double>(),
                      row.at("cpu_seconds_per_gb").get<double>()));
  return row;
}

// Save and load of the synthetic state of `size` against the plain path,
// `repeat` times, alternating which goes first; returns the size's summary.
absl::StatusOr<json> CeilingSize(const BenchFlags& flags,
                                 const std::string& work,
                                 const std::string& size_text, int64_t size) {
  SyntheticStateOptions options;
  options.total_bytes = size;
  options.seed = flags.seed;
  StateDict source = MakeSyntheticState(options);
  options.fill = false;  // Zero-filled: the destination's pages are touched.
  StateDict dest = MakeSyntheticState(options);
  const int64_t bytes = StateTensorBytes(source);
  DCP_ASSIGN_OR_RETURN(std::vector<iovec> source_memory, TensorMemory(source));
  DCP_ASSIGN_OR_RETURN(std::vector<iovec> dest_memory, TensorMemory(dest));
  const std::string plain_file = absl::StrCat(work, "/plain.bin");
  const std::string dcp_dir = absl::StrCat(work, "/dcp");
  std::vector<json> rows;
  auto plain = [&](int rep) -> absl::Status {
    DCP_ASSIGN_OR_RETURN(json w, TimeCeiling("plain_write", rep, bytes, [&] {
                           return PlainVectorIo(plain_file, source_memory,
                                                /*write=*/true);
                         }));
    DCP_ASSIGN_OR_RETURN(json r, TimeCeiling("plain_readv", rep, bytes, [&] {
                           return PlainVectorIo(plain_file, dest_memory,
                                                /*write=*/false);
                         }));
    rows.push_back(w);
    rows.push_back(r);
    fs::remove(plain_file);
    return CheckAndZero(source_memory, dest_memory, "plain readv");
  };
  auto dcp = [&](int rep) -> absl::Status {
    FileSystemWriterOptions writer_options;
    FileSystemReaderOptions reader_options;
    if (flags.storage_threads > 0) {
      writer_options.thread_count = flags.storage_threads;
      reader_options.thread_count = flags.storage_threads;
    }
    FileSystemWriter writer(dcp_dir, writer_options);
    SaveOptions save_options;
    save_options.storage_writer = &writer;
    DCP_ASSIGN_OR_RETURN(json w, TimeCeiling("dcp_save", rep, bytes, [&] {
                           return Save(source, save_options).status();
                         }));
    FileSystemReader reader(dcp_dir, reader_options);
    LoadOptions load_options;
    load_options.storage_reader = &reader;
    DCP_ASSIGN_OR_RETURN(json r, TimeCeiling("dcp_load", rep, bytes, [&] {
                           return Load(dest, load_options);
                         }));
    rows.push_back(w);
    rows.push_back(r);
    fs::remove_all(dcp_dir);
    return CheckAndZero(source_memory, dest_memory, "dcp load");
  };
  std::vector<std::string> load_averages;
  for (int rep = 1; rep <= flags.repeat; ++rep) {
    load_averages.push_back(LoadAverage());
    Log(absl::StrCat(size_text, " repetition ", rep, "/", flags.repeat,
                     " (load average ", load_averages.back(), ", ", NowUtc(),
                     ")"));
    if (rep % 2 == 1) {
      DCP_RETURN_IF_ERROR(plain(rep));
      DCP_RETURN_IF_ERROR(dcp(rep));
    } else {
      DCP_RETURN_IF_ERROR(dcp(rep));
      DCP_RETURN_IF_ERROR(plain(rep));
    }
  }
  // Per phase: dcp against the plain path, per repetition, then the median.
  json summary = {{"size", size_text},
                  {"state_bytes", bytes},
                  {"tensors", source_memory.size()},
                  {"repetitions", flags.repeat},
                  {"load_averages", load_averages},
                  {"rows", rows}};
  auto variant = [&](const std::string& name) {
    std::map<int, const json*> by_rep;
    for (const json& r : rows) {
      if (r.at("variant") == name) by_rep[r.at("rep").get<int>()] = &r;
    }
    return by_rep;
  };
  auto stats = [](const std::map<int, const json*>& by_rep) {
    std::vector<double> gbps, cpu;
    for (const auto& [rep, r] : by_rep) {
      gbps.push_back(r->at("gbps").get<double>());
      cpu.push_back(r->at("cpu_seconds_per_gb").get<double>());
    }
    return json{{"median_gbps", Median(gbps)},
                {"all_gbps", gbps},
                {"median_cpu_seconds_per_gb", Median(cpu)},
                {"all_cpu_seconds_per_gb", cpu}};
  };
  for (const auto& [phase, dcp_name, plain_name] :
       {std::tuple<std::string, std::string, std::string>{"save", "dcp_save",
                                                          "plain_write"},
        {"load", "dcp_load", "plain_readv"}}) {
    const auto d = variant(dcp_name);
    const auto p = variant(plain_name);
    std::vector<double> ratios;
    int met = 0;
    for (const auto& [rep, r] : d) {
      ratios.push_back(r->at("gbps").get<double>() /
                       p.at(rep)->at("gbps").get<double>());
      if (ratios.back() >= kCeilingBar) ++met;
    }
    summary[phase] = {{"dcp", stats(d)},
                      {"plain", stats(p)},
                      {"plain_variant", plain_name},
                      {"vs_plain_median", Median(ratios)},
                      {"vs_plain_all", ratios},
                      {"bar", kCeilingBar},
                      {"met_in", met},
                      {"pass", 3 * met >= 2 * flags.repeat}};
  }
  return summary;
}

void PrintCeiling(std::FILE* out, const json& s) {
  std::fprintf(
      out,
      "\n%s (%.0f bytes in %d tensors), %d repetitions (load average "
      "at their start: %s)\n",
      s.at("size").get<std::string>().c_str(),
      s.at("state_bytes").get<double>(), s.at("tensors").get<int>(),
      s.at("repetitions").get<int>(),
      absl::StrJoin(s.at("load_averages").get<std::vector<std::string>>(), "; ")
          .c_str());
  std::fprintf(out, "  %-5s %10s %10s %14s %14s %8s   %s\n", "phase",
               "dcp GB/s", "plain GB/s", "dcp CPU s/GB", "plain CPU s/GB",
               "x plain", "met (bar 0.8x)");
  for (const char* phase : {"save", "load"}) {
    const json& p = s.at(phase);
    std::vector<std::string> all;
    for (double r : p.at("vs_plain_all")) {
      all.push_back(absl::StrFormat("%.2f", r));
    }
    std::fprintf(
        out, "  %-5s %10.3f %10.3f %14.3f %14.3f %8.2f   %d of %zu (%s)\n",
        phase, p.at("dcp").at("median_gbps").get<double>(),
        p.at("plain").at("median_gbps").get<double>(),
        p.at("dcp").at("median_cpu_seconds_per_gb").get<double>(),
        p.at("plain").at("median_cpu_seconds_per_gb").get<double>(),
        p.at("vs_plain_median").get<double>(), p.at("met_in").get<int>(),
        all.size(), absl::StrJoin(all, " ").c_str());
  }
  std::fprintf(out,
               "  (plain: one thread, pwritev of the tensors + fsync / preadv "
               "into the preallocated, touched destination; x plain: dcp "
               "GB/s over plain GB/s per repetition, median)\n");
}

}  // namespace

// `dcp bench io --ceiling`: see the file comment.
absl::Status RunCeiling(const BenchFlags& flags) {
  DCP_ASSIGN_OR_RETURN(auto sizes, ParseSizes(flags.sizes));
  DCP_ASSIGN_OR_RETURN(const std::string work,
                       MakeWorkDir(flags.dir, "dcp-bench-ceiling."));
  const MachineInfo machine = DescribeMachine(work);
  absl::StatusOr<std::unique_ptr<IoEngine>> engine = NewIoEngine({});
  json report = {
      {"mode", "ceiling"},
      {"started", NowUtc()},
      {"dir", work},
      {"file_system", machine.file_system},
      {"repeat", flags.repeat},
      {"seed", flags.seed},
      {"checksums", true},  // Always on: every block is hashed and checked.
      {"checksum_block_size", FileSystemWriterOptions{}.checksum_block_size},
      {"writer_threads", flags.storage_threads > 0
                             ? flags.storage_threads
                             : FileSystemWriterOptions{}.thread_count},
      {"reader_threads", flags.storage_threads > 0
                             ? flags.storage_threads
                             : FileSystemReaderOptions{}.thread_count},
      {"io_engine", engine.ok() ? std::string((*engine)->name()) : ""},
      {"load_average_start", LoadAverage()},
      {"machine", MachineJson(machine)},
      {"sizes", json::array()}};
  report.update(SourceCommit());
  Log(absl::StrCat("ceiling: started ", NowUtc(), " in ", work, " (",
                   machine.file_system, "), load average ", LoadAverage(),
                   ", commit ", report.value("commit", "?")));
  if (machine.file_system != "tmpfs") {
    Log(absl::StrCat("warning: ", work, " is on ", machine.file_system,
                     ", not tmpfs: the storage is in the measurement"));
  }
  absl::Status status;
  for (const auto& [text, size] : sizes) {
    absl::StatusOr<json> summary = CeilingSize(flags, work, text, size);
    if (!summary.ok()) {
      status = summary.status();
      break;
    }
    report["sizes"].push_back(*std::move(summary));
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  DCP_RETURN_IF_ERROR(status);
  report["finished"] = NowUtc();
  report["load_average_end"] = LoadAverage();
  std::FILE* table = flags.json ? stderr : stdout;
  std::fprintf(table,
               "dcp bench io --ceiling, %s - %s, %s (%s), checksums on, "
               "writer/reader threads %d/%d, engine %s\n",
               report.at("started").get<std::string>().c_str(),
               report.at("finished").get<std::string>().c_str(), work.c_str(),
               machine.file_system.c_str(),
               report.at("writer_threads").get<int>(),
               report.at("reader_threads").get<int>(),
               report.at("io_engine").get<std::string>().c_str());
  for (const json& s : report.at("sizes")) PrintCeiling(table, s);
  if (flags.json) std::printf("%s\n", report.dump().c_str());
  return absl::OkStatus();
}

}  // namespace dcp::io_bench
