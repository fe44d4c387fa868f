#include "comm/gloo_process_group.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "comm/internal/gloo_store.h"
#include "comm/internal/payload_limit.h"
#include "comm/internal/peer_probe.h"
#include "comm/store_process_group.h"
#include "core/status.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/address.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace dcp::comm {
using internal::DeadlineStore;
using internal::Millis;
using internal::NextInstance;
using internal::OpenStore;
using internal::Remaining;

class GlooProcessGroup::Impl {
 public:
  Impl(int rank, int size, uint64_t max_payload_bytes)
      : rank_(rank),
        size_(size),
        max_payload_(internal::MaxPayloadBytes(max_payload_bytes)) {}

  absl::Status Connect(const GlooOptions& options) {
    const std::string name =
        options.job_id.empty()
            ? options.group_name
            : absl::StrCat(options.group_name, "/job-", options.job_id);
    // Numbered before anything can fail: every attempt uses up its number
    // on every rank, so a rank whose attempt failed early meets the others
    // again at the next one.
    const std::string base = absl::StrCat(name, "/", NextInstance(name, rank_));
    DCP_ASSIGN_OR_RETURN(store_, OpenStore(options.store));
    const std::string where =
        absl::StrFormat("gloo rendezvous of rank %d of %d under \"%s\" in %s",
                        rank_, size_, base, options.store.ToString());
    const absl::Time deadline = absl::Now() + options.connect_timeout;
    // A fresh generation per group: keys a crashed job with the same job id
    // left under `base` belong to another generation and are never read.
    std::unique_ptr<KeyValueStore> keys = internal::AsKeyValueStore(*store_);
    if (keys == nullptr) {
      return absl::InternalError(absl::StrCat(where, ": unknown store type"));
    }
    absl::StatusOr<std::string> generation =
        JoinGeneration(*keys, base, rank_, size_, deadline);
    if (!generation.ok()) return Annotate(generation.status(), where);
    prefix_ = absl::StrCat(base, "/", *generation);
    absl::Status formed = FormMesh(options, where, deadline);
    if (!formed.ok()) {
      // Best effort, so a store that outlives many failed attempts does
      // not fill with their keys: the last rank to fail removes every
      // rank's address keys and abort and waiting records (it knows every
      // rank has read what it will: each leaves only once done). A rank's
      // own address keys stay until then: a peer still connecting reads
      // them, and without them would name this rank as one that never
      // joined.
      std::vector<std::string> every_rank_keys;
      for (int r = 0; r < size_; ++r) {
        for (const std::string& key :
             {AddressKey(r), HostKey(r), AbortKey(r), WaitingKey(r)}) {
          every_rank_keys.push_back(absl::StrCat(prefix_, "/", key));
        }
      }
      LeaveFailedGeneration(*keys, base, *generation, rank_, size_,
                            every_rank_keys);
      return formed;
    }
    if (rank_ == 0) {
      ForgetGeneration(*keys, base, *generation).IgnoreError();
    }
    return absl::OkStatus();
  }

  // Connects the mesh under prefix_ and passes the barrier that hands every
  // rank its peers' probe addresses; then removes this rank's address keys.
  absl::Status FormMesh(const GlooOptions& options, const std::string& where,
                        absl::Time deadline) {
    const std::string& prefix = prefix_;
    prefix_store_ =
        std::make_unique<gloo::rendezvous::PrefixStore>(prefix, *store_);
    DeadlineStore store(*prefix_store_, deadline);
    try {
      gloo::transport::tcp::attr attr;
      if (options.listen_interface.empty()) {
        attr.hostname = options.listen_address;
      } else {
        attr.iface = options.listen_interface;
      }
      device_ = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gloo: cannot listen on ",
          options.listen_interface.empty()
              ? options.listen_address
              : absl::StrCat("interface ", options.listen_interface),
          " (set DCP_COMM_ADDR to this host's address or DCP_SOCKET_IFNAME "
          "to its interface): ",
          e.what()));
    }
    try {
      context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context_->setTimeout(Millis(std::max<int64_t>(
          1, absl::ToInt64Milliseconds(options.connect_timeout))));
      context_->connectFullMesh(store, device_);
      context_->setTimeout(Millis(
          std::max<int64_t>(1, absl::ToInt64Milliseconds(options.timeout))));
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out =
          absl::StrContains(what, "Wait timeout") ||
          absl::StrContains(absl::AsciiStrToLower(what), "timed out") ||
          absl::StrContains(absl::AsciiStrToLower(what), "timeout");
      // Gloo connects to each peer right after reading its address: a
      // failure then is that peer's address not answering.
      if (const int peer = AddressKeyRank(store.last_key()); peer >= 0) {
        return absl::Status(
            timed_out ? absl::StatusCode::kDeadlineExceeded
                      : absl::StatusCode::kUnavailable,
            absl::StrFormat(
                "%s: no connection with rank %d at %s (the address it "
                "advertised) within the connect timeout of %s: is that "
                "address reachable from this host (DCP_COMM_ADDR / "
                "DCP_SOCKET_IFNAME on rank %d)? gloo: %s",
                where, peer, PeerAddress(store.last_value(), peer),
                absl::FormatDuration(options.connect_timeout), peer, what));
      }
      if (timed_out) {
        std::vector<int> missing = store.WaitingForRanks();
        return absl::DeadlineExceededError(absl::StrCat(
            where, ": not every rank joined within ",
            absl::FormatDuration(options.connect_timeout),
            missing.empty() ? std::string()
                            : absl::StrCat("; waiting for rank(s) ",
                                           absl::StrJoin(missing, ",")),
            ": ", what));
      }
      return absl::UnavailableError(absl::StrCat(where, ": ", what));
    }
    // Every rank has read every address once all have passed this barrier;
    // then each removes its own, leaving the prefix empty for the next job.
    // The barrier also hands every rank its peers' probe addresses.
    timeout_ = options.timeout;
    OpenProbeListener();
    const std::string probe_address = probe_ ? probe_->address() : "";
    std::vector<int> peers;
    std::vector<Send> sends;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      peers.push_back(r);
      sends.push_back({r, probe_address});
    }
    std::vector<std::string> received;
    DCP_RETURN_IF_ERROR(
        Exchange("joined", /*root=*/-1, sends, peers, &received, deadline));
    probe_addresses_.assign(size_, "");
    for (size_t i = 0; i < peers.size(); ++i) {
      probe_addresses_[peers[i]] = std::move(received[i]);
    }
    for (const std::string& key : {AddressKey(rank_), HostKey(rank_)}) {
      internal::RemoveKey(*store_, absl::StrCat(prefix, "/", key));
    }
    return absl::OkStatus();
  }

  // The rank whose address key `key` is ("<r>"); -1 for any other key.
  static int AddressKeyRank(const std::string& key) {
    int rank = -1;
    if (key.empty() || !absl::SimpleAtoi(key, &rank)) return -1;
    return rank;
  }

  // "host:port" of the address `peer` published for this rank, from the
  // value of its address key: one serialized tcp address per other rank,
  // in rank order.
  std::string PeerAddress(const std::vector<char>& all, int peer) const {
    const size_t each = all.size() / std::max(1, size_ - 1);
    const size_t index = rank_ > peer ? rank_ - 1 : rank_;
    if (each == 0 || (index + 1) * each > all.size()) {
      return "(an address gloo could not read)";
    }
    try {
      gloo::transport::tcp::Address address(std::vector<char>(
          all.begin() + index * each, all.begin() + (index + 1) * each));
      return internal::HostPortOf(address.getSockaddr());
    } catch (const std::exception&) {
      return "(an address gloo could not read)";
    }
  }

  // Listens for peers' probes on the address this rank's Gloo pairs use.
  // Without one (no address to be had) failures name no lost ranks.
  void OpenProbeListener() {
    for (int r = 0; r < size_ && probe_ == nullptr; ++r) {
      if (r == rank_) continue;
      try {
        const auto* address =
            dynamic_cast<const gloo::transport::tcp::Address*>(
                &context_->getPair(r)->address());
        if (address == nullptr) return;
        absl::StatusOr<std::unique_ptr<internal::ProbeListener>> listener =
            internal::ProbeListener::Open(
                internal::HostOf(address->getSockaddr()),
                size_ * (kMaxReprobes + 1) + 8);
        if (listener.ok()) probe_ = *std::move(listener);
      } catch (const std::exception&) {
      }
      return;
    }
  }

  // `status` with the peers this rank finds lost appended ("rank 2 at
  // 10.0.0.3 (unreachable: no answer within 500ms)"), probing every peer
  // at once; unchanged when every peer answers or none can be probed.
  absl::Status NameLostPeers(const absl::Status& status,
                             const std::vector<internal::ProbeResult>& probes) {
    std::vector<std::string> lost;
    for (int r = 0; r < static_cast<int>(probes.size()); ++r) {
      if (probes[r].state == internal::ProbeResult::State::kAnswers) continue;
      const std::string& address = probe_addresses_[r];
      lost.push_back(absl::StrFormat("rank %d at %s (%s)", r,
                                     address.substr(0, address.rfind(':')),
                                     probes[r].detail));
    }
    if (lost.empty()) return status;
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), "; lost as seen from rank ", rank_, ": ",
                     absl::StrJoin(lost, ", ")));
  }

  // The keys Gloo's connectFullMesh sets for a rank: its addresses ("<r>")
  // and its host name ("rank_<r>", set first).
  static std::string AddressKey(int rank) { return absl::StrCat(rank); }
  static std::string HostKey(int rank) { return absl::StrCat("rank_", rank); }

  struct Send {
    int peer;
    absl::string_view data;
  };

  // What precedes every payload: the collective the sender is in (so ranks
  // that called different collectives get told so) and the payload size.
  struct Header {
    char op[12] = {};
    int32_t root = -1;
    uint64_t size = 0;
  };

  // One step of point-to-point traffic in collective `op` (rooted at `root`,
  // -1 for none): sends `sends`, receives one payload from each rank of
  // `recv_from` into (*received)[i], and waits for all of it until
  // `deadline`. Errors name `op` and the peer.
  absl::Status Exchange(absl::string_view op, int root,
                        const std::vector<Send>& sends,
                        const std::vector<int>& recv_from,
                        std::vector<std::string>* received,
                        absl::Time deadline) {
    const uint64_t size_slot = kSlotBase + 2 * next_call_;
    const uint64_t data_slot = size_slot + 1;
    ++next_call_;

    struct Transfer {
      int peer = -1;
      Header header;
      std::unique_ptr<gloo::transport::UnboundBuffer> size_buf;
      std::unique_ptr<gloo::transport::UnboundBuffer> data_buf;
    };
    // Sized once: the buffers point into these elements.
    std::vector<Transfer> out(sends.size());
    std::vector<Transfer> in(recv_from.size());
    received->assign(recv_from.size(), std::string());

    int peer = -1;
    const char* doing = "";
    try {
      doing = "posting a send to";
      for (size_t i = 0; i < sends.size(); ++i) {
        Transfer& t = out[i];
        t.peer = peer = sends[i].peer;
        op.copy(t.header.op, sizeof(t.header.op) - 1);
        t.header.root = root;
        t.header.size = sends[i].data.size();
        t.size_buf = context_->createUnboundBuffer(&t.header, sizeof(Header));
        t.size_buf->send(t.peer, size_slot);
        if (t.header.size > 0) {
          t.data_buf = context_->createUnboundBuffer(
              const_cast<char*>(sends[i].data.data()), t.header.size);
          t.data_buf->send(t.peer, data_slot);
        }
      }
      doing = "posting a receive from";
      for (size_t i = 0; i < recv_from.size(); ++i) {
        Transfer& t = in[i];
        t.peer = peer = recv_from[i];
        t.size_buf = context_->createUnboundBuffer(&t.header, sizeof(Header));
        t.size_buf->recv(t.peer, size_slot);
      }
      doing = "waiting for a payload size from";
      for (size_t i = 0; i < in.size(); ++i) {
        Transfer& t = in[i];
        peer = t.peer;
        t.size_buf->waitRecv(nullptr, Remaining(deadline));
        if (absl::Status s = CheckHeader(op, root, t.peer, t.header); !s.ok()) {
          return GiveUp(op, t.peer, s);
        }
        if (t.header.size > 0) {
          std::string& dest = (*received)[i];
          dest.resize(t.header.size);
          t.data_buf =
              context_->createUnboundBuffer(dest.data(), t.header.size);
          t.data_buf->recv(t.peer, data_slot);
        }
      }
      doing = "waiting for a payload from";
      for (Transfer& t : in) {
        peer = t.peer;
        if (t.data_buf) t.data_buf->waitRecv(nullptr, Remaining(deadline));
      }
      doing = "waiting for a send to complete to";
      for (Transfer& t : out) {
        peer = t.peer;
        t.size_buf->waitSend(nullptr, Remaining(deadline));
        if (t.data_buf) t.data_buf->waitSend(nullptr, Remaining(deadline));
      }
    } catch (const std::exception& e) {
      return GiveUp(op, peer, PeerError(op, peer, doing, e.what(), deadline));
    }
    return absl::OkStatus();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  // kDataLoss when `peer` is not in the same collective as this rank, or
  // announces a payload larger than this rank accepts (max_payload_): a
  // corrupt stream must fail here, before the size is allocated.
  absl::Status CheckHeader(absl::string_view op, int root, int peer,
                           Header& header) const {
    header.op[sizeof(header.op) - 1] = '\0';
    const absl::string_view theirs(header.op);
    if (theirs != op || header.root != root) {
      return absl::DataLossError(absl::StrFormat(
          "%s (root %d) on rank %d of %d: rank %d is in %s (root %d): the "
          "ranks called different collectives; every rank must call the "
          "same collectives in the same order with the same root",
          op, root, rank_, size_, peer, theirs, header.root));
    }
    if (header.size > max_payload_) {
      return absl::DataLossError(absl::StrFormat(
          "%s on rank %d of %d: rank %d announced a payload of %d bytes, "
          "more than the %d this rank accepts (max_payload_bytes, by default "
          "this machine's physical memory); the stream is corrupt",
          op, rank_, size_, peer, header.size, max_payload_));
    }
    return absl::OkStatus();
  }

  // Slots below this are left to Gloo's own collectives on the context.
  static std::string AbortKey(int rank) { return absl::StrCat("abort/", rank); }
  // Whom a rank that gave up waits for, while it waits (GiveUp).
  static std::string WaitingKey(int rank) {
    return absl::StrCat("waiting/", rank);
  }

  // Called once when a collective failed on this rank. If `peer` gave up
  // first (its abort record is in the store) the result carries the peer's
  // reason, so the rank that was really lost is named on every rank. Then
  // this rank leaves its own record and closes its connections, so peers
  // blocked on it fail now instead of at their deadline.
  absl::Status GiveUp(absl::string_view op, int peer, absl::Status status) {
    // Which peers are lost, before anything else (see below).
    std::vector<internal::ProbeResult> probes;
    if (!probe_addresses_.empty()) {
      if (probe_ != nullptr) probe_->Drain();
      probes = internal::ProbePeers(
          probe_addresses_,
          std::clamp(timeout_ / 4, absl::Milliseconds(100), absl::Seconds(2)));
    }
    // A peer cut off from this rank may still reach the store, where its
    // record would call this rank's side lost: read records only of peers
    // that answer or whose process is gone (it may have left its reason).
    const bool peer_cut_off =
        peer >= 0 && peer < static_cast<int>(probes.size()) &&
        probes[peer].state == internal::ProbeResult::State::kUnreachable;
    if (peer >= 0 && peer != rank_ && !peer_cut_off) {
      // A peer closes its sockets right after writing its record, or Gloo
      // closes them first when one of the peer's own transfers fails, and
      // the record follows once the peer has looked for the records of
      // the ranks it gave up on and probed its peers. A live peer that
      // closed the connection is giving up: wait for its record up to
      // kRecordWaitLimit (bounded by the group's timeout); otherwise allow
      // it a moment to appear.
      bool peer_closed_alive =
          absl::IsUnavailable(status) &&
          peer < static_cast<int>(probes.size()) &&
          probes[peer].state == internal::ProbeResult::State::kAnswers;
      absl::Time wait_until =
          absl::Now() + (peer_closed_alive
                             ? std::min(timeout_, kRecordWaitLimit)
                             : absl::Milliseconds(250));
      const std::string key = absl::StrCat(prefix_, "/", AbortKey(peer));
      // Two live ranks whose connection broke under them (neither gave up
      // first) would each wait for the other: each says whom it waits for,
      // and stops once that rank waits for it.
      const std::string theirs_waiting =
          absl::StrCat(prefix_, "/", WaitingKey(peer));
      if (peer_closed_alive) {
        try {
          const std::string who = absl::StrCat(peer);
          prefix_store_->set(WaitingKey(rank_),
                             std::vector<char>(who.begin(), who.end()));
        } catch (const std::exception&) {
          // Best effort: without it a mutual wait ends at wait_until.
        }
      }
      auto waits_for_this_rank = [&] {
        if (!peer_closed_alive ||
            !internal::KeyExists(*store_, theirs_waiting)) {
          return false;
        }
        try {
          const std::vector<char> who = prefix_store_->get(WaitingKey(peer));
          return std::string(who.begin(), who.end()) == absl::StrCat(rank_);
        } catch (const std::exception&) {
          return false;
        }
      };
      // A killed process's connections may reset before its probe
      // listener closes, so a peer that answered may be gone a moment
      // later: probe it again, a few times with growing gaps (each probe
      // stays queued on a live peer's listener), and once it is gone wait
      // only as for a peer that did not answer.
      absl::Duration reprobe_gap = kFirstReprobe;
      absl::Time next_probe = absl::Now() + reprobe_gap;
      int reprobes = 0;
      while (!internal::KeyExists(*store_, key) && absl::Now() < wait_until &&
             !waits_for_this_rank()) {
        // Peers waiting on this rank probe it too; their probes queue here
        // until drained, and a full queue would drop the next peer's.
        if (probe_ != nullptr) probe_->Drain();
        if (peer_closed_alive && reprobes < kMaxReprobes &&
            absl::Now() >= next_probe) {
          ++reprobes;
          internal::ProbeResult again = internal::ProbePeers(
              {probe_addresses_[peer]}, absl::Milliseconds(100))[0];
          // A peer that wrote its record and then left is not lost.
          if (again.state == internal::ProbeResult::State::kGone &&
              !internal::KeyExists(*store_, key)) {
            probes[peer] = std::move(again);
            peer_closed_alive = false;
            wait_until =
                std::min(wait_until, absl::Now() + absl::Milliseconds(250));
          }
          reprobe_gap *= 3;
          next_probe = absl::Now() + reprobe_gap;
        }
        absl::SleepFor(absl::Milliseconds(10));
      }
      absl::Status theirs;
      try {
        if (internal::KeyExists(*store_, key)) {
          const std::vector<char> record = prefix_store_->get(AbortKey(peer));
          if (DecodeStatus(absl::string_view(record.data(), record.size()),
                           &theirs)
                  .ok() &&
              !theirs.ok()) {
            status = absl::Status(
                theirs.code(),
                absl::StrFormat(
                    "%s on rank %d of %d: rank %d gave up first: %s", op, rank_,
                    size_, peer, theirs.message()));
          }
        }
      } catch (const std::exception&) {
        // No record: the peer itself is what was lost.
      }
    }
    status = NameLostPeers(status, probes);
    try {
      const std::string record = EncodeStatus(status);
      prefix_store_->set(AbortKey(rank_),
                         std::vector<char>(record.begin(), record.end()));
    } catch (const std::exception&) {
      // Best effort: peers then report the lost connection to this rank.
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      try {
        if (auto& pair = context_->getPair(r)) pair->close();
      } catch (const std::exception&) {
      }
    }
    return status;
  }

  static constexpr uint64_t kSlotBase = uint64_t{1} << 40;
  // The longest GiveUp waits for the abort record of a live peer that
  // closed its connections.
  static constexpr absl::Duration kRecordWaitLimit = absl::Seconds(10);
  // While it waits, it probes that peer again after kFirstReprobe, then
  // after gaps three times longer, at most kMaxReprobes times (from 50 ms
  // to about 6 s in).
  static constexpr absl::Duration kFirstReprobe = absl::Milliseconds(50);
  static constexpr int kMaxReprobes = 5;

  absl::Status PeerError(absl::string_view op, int peer, const char* doing,
                         absl::string_view what, absl::Time deadline) const {
    const std::string lower = absl::AsciiStrToLower(what);
    if (absl::Now() >= deadline || absl::StrContains(lower, "timed out") ||
        absl::StrContains(lower, "timeout")) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s on rank %d of %d: deadline passed %s rank %d (rank %d may be "
          "lost, hung or behind; gloo: %s)",
          op, rank_, size_, doing, peer, peer, what));
    }
    return absl::UnavailableError(absl::StrFormat(
        "%s on rank %d of %d: lost connection to rank %d while %s it (gloo: "
        "%s)",
        op, rank_, size_, peer, doing, what));
  }

  const int rank_;
  const int size_;
  std::unique_ptr<gloo::rendezvous::Store> store_;
  std::string prefix_;
  std::unique_ptr<gloo::rendezvous::PrefixStore> prefix_store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint64_t next_call_ = 0;
  absl::Duration timeout_ = absl::Minutes(5);
  // The largest payload accepted from a peer (CheckHeader).
  const uint64_t max_payload_;
  // Peers' probe addresses by rank ("" for this rank), once the group
  // formed; empty before.
  std::vector<std::string> probe_addresses_;
  std::unique_ptr<internal::ProbeListener> probe_;
};

namespace {

// Gloo's tcp transport (and the redis client) write to sockets without
// MSG_NOSIGNAL: a write to a rank that has gone raises SIGPIPE, whose
// default action ends the process, so the surviving ranks died (signal 13)
// instead of reporting the lost rank. The first group a process creates
// sets SIGPIPE to ignored, unless the program handles or ignores it
// already; the write then fails with EPIPE, reported as kUnavailable.
void IgnoreSigpipeUnlessHandled() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    const bool default_action =
        (current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL;
    if (!default_action) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooProcessGroup>> GlooProcessGroup::Create(
    const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 ||
      options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("gloo: rank %d outside a world of %d ranks",
                        options.rank, options.world_size));
  }
  IgnoreSigpipeUnlessHandled();
  auto impl = std::make_unique<Impl>(options.rank, options.world_size,
                                     options.max_payload_bytes);
  if (options.world_size > 1) {
    absl::Status status = impl->Connect(options);
    if (!status.ok()) return status;
  }
  return std::unique_ptr<GlooProcessGroup>(new GlooProcessGroup(
      options.rank, options.world_size, options.timeout, std::move(impl)));
}

GlooProcessGroup::GlooProcessGroup(int rank, int size, absl::Duration timeout,
                                   std::unique_ptr<Impl> impl)
    : ProcessGroup(rank, size, timeout), impl_(std::move(impl)) {}

GlooProcessGroup::~GlooProcessGroup() = default;

absl::StatusOr<std::vector<std::string>> GlooProcessGroup::DoGather(
    absl::string_view payload, int root, absl::Time deadline) {
  std::vector<std::string> received;
  if (rank() != root) {
    DCP_RETURN_IF_ERROR(impl_->Exchange("gather", root, {{root, payload}}, {},
                                        &received, deadline));
    return std::vector<std::string>();
  }
  std::vector<int> from;
  for (int r = 0; r < size(); ++r) {
    if (r != root) from.push_back(r);
  }
  DCP_RETURN_IF_ERROR(
      impl_->Exchange("gather", root, {}, from, &received, deadline));
  std::vector<std::string> all(size());
  for (size_t i = 0; i < from.size(); ++i)
    all[from[i]] = std::move(received[i]);
  all[root] = std::string(payload);
  return all;
}

absl::StatusOr<std::string> GlooProcessGroup::FromRoot(
    absl::string_view op, int root,
    const std::vector<absl::string_view>& per_rank, absl::Time deadline) {
  std::vector<std::string> received;
  if (rank() != root) {
    DCP_RETURN_IF_ERROR(
        impl_->Exchange(op, root, {}, {root}, &received, deadline));
    return std::move(received[0]);
  }
  std::vector<Impl::Send> sends;
  for (int r = 0; r < size(); ++r) {
    if (r != root) sends.push_back({r, per_rank[r]});
  }
  DCP_RETURN_IF_ERROR(
      impl_->Exchange(op, root, sends, {}, &received, deadline));
  return std::string(per_rank[root]);
}

absl::StatusOr<std::string> GlooProcessGroup::DoScatter(
    absl::Span<const std::string> payloads, int root, absl::Time deadline) {
  std::vector<absl::string_view> per_rank;
  if (rank() == root) per_rank.assign(payloads.begin(), payloads.end());
  return FromRoot("scatter", root, per_rank, deadline);
}

absl::StatusOr<std::string> GlooProcessGroup::DoBroadcast(
    absl::string_view payload, int root, absl::Time deadline) {
  return FromRoot("broadcast", root,
                  std::vector<absl::string_view>(size(), payload), deadline);
}

absl::StatusOr<std::vector<std::string>> GlooProcessGroup::AllToAll(
    absl::string_view op, absl::string_view payload, absl::Time deadline) {
  std::vector<Impl::Send> sends;
  std::vector<int> from;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    sends.push_back({r, payload});
    from.push_back(r);
  }
  std::vector<std::string> received;
  DCP_RETURN_IF_ERROR(
      impl_->Exchange(op, /*root=*/-1, sends, from, &received, deadline));
  std::vector<std::string> all(size());
  for (size_t i = 0; i < from.size(); ++i)
    all[from[i]] = std::move(received[i]);
  all[rank()] = std::string(payload);
  return all;
}

absl::StatusOr<std::vector<std::string>> GlooProcessGroup::DoAllGather(
    absl::string_view payload, absl::Time deadline) {
  return AllToAll("allgather", payload, deadline);
}

absl::Status GlooProcessGroup::DoBarrier(absl::Time deadline) {
  return AllToAll("barrier", "", deadline).status();
}

}  // namespace dcp::comm
