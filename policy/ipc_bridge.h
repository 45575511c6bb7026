// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge without CUDA: the 64-byte handle, the broker's wire protocol, the export
// and import bookkeeping, the peer check, and the `ipc-vmm` diagnosis text. docs/ipc-bridge.md is
// the specification; the shim (shim/bridge.cpp) does the socket I/O and the driver calls.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "event.h"
#include "lock_within.h"
#include "options.h"
#include "torch_conf.h"

namespace cmg::ipc {

// CUmemAllocationHandleType bits (cuda.h; the shim checks them with static_asserts). The policy
// includes no CUDA header.
inline constexpr unsigned kTypePosixFd = 0x1;
inline constexpr unsigned kTypeWin32 = 0x2;
inline constexpr unsigned kTypeWin32Kmt = 0x4;
inline constexpr unsigned kTypeFabric = 0x8;
// "POSIX_FD|FABRIC", "none".
std::string handle_type_names(unsigned types);

using Nonce = std::array<std::uint8_t, 16>;

// ---- the handle (docs/ipc-bridge.md, "Handle layout") ------------------------------------------
inline constexpr std::size_t kHandleSize = 64;  // CU_IPC_HANDLE_SIZE == CUDA_IPC_HANDLE_SIZE
inline constexpr std::array<std::uint8_t, 8> kHandleMagic = {'C', 'M', 'G', 'B',
                                                             'R', 'I', 'D', 'G'};
inline constexpr std::uint16_t kVersion = 1;

struct Handle {
  std::uint32_t pid = 0;        // exporter
  std::uint64_t tag = 0;        // random per broker instance: names its socket
  std::uint64_t export_id = 0;  // per exporter, from 1
  Nonce nonce{};                // random per export (getrandom)
  std::uint64_t res_base = 0;   // the exporter's reservation base (informative, for logs)
  std::uint32_t pages = 0;      // pages in the export (informative)
  bool operator==(const Handle &) const = default;
};

// Every byte is written: the same export always gives the same 64 bytes (bug-patterns.md P14).
std::array<std::uint8_t, kHandleSize> encode_handle(const Handle &h);

enum class HandleStatus : std::uint8_t {
  Ok,
  NotOurs,     // no magic: a driver handle, to be passed to the driver untouched
  Truncated,   // fewer than 64 bytes
  BadCheck,    // magic present, checksum wrong: corrupted or cut off
  BadVersion,  // a layout this shim does not know
  BadFields,   // checksum right but a field out of range (pid 0, id 0, no pages, flags set)
};
std::string_view handle_status_text(HandleStatus s);
HandleStatus decode_handle(std::span<const std::uint8_t> bytes, Handle &out);

// ---- the broker's address ------------------------------------------------------------------
// An abstract-namespace Unix socket (no file to create or clean up; gone with the process).
// The returned string starts with the NUL byte of the abstract namespace.
// The user id is not part of the name, so that an importer of another user reaches the broker and
// is refused by it (SO_PEERCRED) rather than finding nothing; the random tag keeps the name from
// being taken in advance for a pid.
std::string socket_name(std::uint32_t pid, std::uint64_t tag);

// ---- the wire protocol (SOCK_SEQPACKET: one message per record) -------------------------------
enum class Op : std::uint16_t { Open = 1, Release = 2 };
inline constexpr std::size_t kRequestSize = 32;
inline constexpr std::size_t kReplySize = 64;
inline constexpr std::size_t kChunkHeader = 16;
inline constexpr std::size_t kPagesPerChunk = 64;  // fds per SCM_RIGHTS message (limit 253)
inline constexpr std::size_t kChunkMax = kChunkHeader + kPagesPerChunk * 16;
inline constexpr std::uint32_t kMaxPages = 1u << 17;  // 256 GiB of 2 MiB pages

struct Request {
  Op op = Op::Open;
  std::uint64_t export_id = 0;
  Nonce nonce{};
  bool operator==(const Request &) const = default;
};
std::array<std::uint8_t, kRequestSize> encode_request(const Request &r);

enum class ParseError : std::uint8_t { None, Size, Magic, Version, Op, Fields };
std::string_view parse_error_text(ParseError e);
// The broker's parser: anything but exactly one well-formed request is an error, never a crash.
ParseError parse_request(std::span<const std::uint8_t> bytes, Request &out);

enum class ReplyStatus : std::uint16_t {
  Ok = 0,
  Malformed = 1,      // the request did not parse
  UnknownExport = 2,  // no such export (never made, or dropped because the exporter freed it)
  BadNonce = 3,       // the export exists and the nonce is wrong
  Denied = 4,         // SO_PEERCRED: another user
  ExportFailed = 5,   // the exporter's driver refused to export a page (driver_error says how)
  Busy = 6,           // too many connections
};
std::string_view reply_status_text(ReplyStatus s);

struct Reply {
  ReplyStatus status = ReplyStatus::Ok;
  std::uint64_t export_id = 0;
  std::uint64_t res_base = 0, res_size = 0;
  std::uint32_t pages = 0;
  std::uint32_t driver_error = 0;
  std::uint64_t bytes = 0;
  // layout_for(pages), so that the importer reserves the span before the pages arrive
  std::uint64_t first_off = 0, span = 0;
  bool operator==(const Reply &) const = default;
};
std::array<std::uint8_t, kReplySize> encode_reply(const Reply &r);
ParseError parse_reply(std::span<const std::uint8_t> bytes, Reply &out);

struct PageRange {
  std::uint64_t off = 0, size = 0;  // within the exporter's reservation
  bool operator==(const PageRange &) const = default;
};
// One chunk of page records (the fds travel with it). first = index of its first page.
std::vector<std::uint8_t> encode_chunk(std::uint32_t first, std::span<const PageRange> pages);
ParseError parse_chunk(std::span<const std::uint8_t> bytes, std::uint32_t &first,
                       std::vector<PageRange> &pages);
// The page list of a reply must be sorted, non-empty pages, no overlap, inside the reservation.
bool pages_valid(std::span<const PageRange> pages, std::uint64_t res_size);

// ---- the peer check ------------------------------------------------------------------------
struct PeerCred {
  std::int32_t pid = 0;
  std::uint32_t uid = 0, gid = 0;
};
enum class PeerVerdict : std::uint8_t { Allowed, OtherUser };
// (The broker's side: a connecting importer must be of this user.)
// Same user id only (docs/ipc-bridge.md, "Security model"); root is no exception.
PeerVerdict check_peer(const PeerCred &peer, std::uint32_t self_uid);
// The importer's side: the socket it reached must belong to the exporter the handle names (no
// other process squatting the name) and to this user (no descriptors taken from another user).
enum class ServerVerdict : std::uint8_t { Exporter, NotExporter, OtherUser };
ServerVerdict check_server(const PeerCred &server, std::uint32_t handle_pid,
                           std::uint32_t self_uid);

bool nonce_equal(const Nonce &a, const Nonce &b);  // constant time

// ---- the exporter's table --------------------------------------------------------------------
struct ExportPage {
  std::uint64_t off = 0, size = 0;
  std::uint64_t alloc_id = 0;  // the model's physical allocation
  std::uint64_t map_seq = 0;   // the cuMemMap that made this mapping
  bool operator==(const ExportPage &) const = default;
};

struct Export {
  std::uint64_t id = 0;
  Nonce nonce{};
  std::uint64_t res_base = 0, res_size = 0;
  std::vector<ExportPage> pages;
  EventRef made;       // the cudaIpcGetMemHandle / cuIpcGetMemHandle call
  int dev = -1;        // device of the pages (for a context if the driver asks for one)
  bool dying = false;  // an unmap of one of its pages is in flight
  std::map<std::uint64_t, unsigned> importers;  // connection id -> open count
  // Requests for it from peers (under the shim: only there is a bridge handle opened), served or
  // not: none means its peer ran without the shim, or never tried.
  std::uint64_t requests = 0;
  unsigned importer_count() const;
  std::uint64_t bytes() const;
};

class ExportTable {
 public:
  using Random = std::function<bool(std::uint8_t *, std::size_t)>;
  struct Made {
    std::uint64_t id = 0;
    Nonce nonce{};
    bool reused = false;
  };
  // The export of exactly these mapped pages of this reservation: the existing one (same id, same
  // nonce, so the same handle bytes: P14) or a new one with a fresh nonce from `random`.
  // nullopt when `random` fails (no export without an unguessable nonce).
  std::optional<Made> find_or_add(std::uint64_t res_base, std::uint64_t res_size,
                                  const std::vector<ExportPage> &pages, const EventRef &made,
                                  int dev, const Random &random);

  enum class Lookup : std::uint8_t { Ok, Unknown, BadNonce, Dying };
  Lookup lookup(std::uint64_t id, const Nonce &nonce, Export *copy) const;
  // After the broker exported the pages' descriptors: counts one open for `conn`, unless the
  // export was dropped or began dying meanwhile (then the descriptors must not be sent).
  bool commit_open(std::uint64_t id, std::uint64_t conn);
  // A peer asked for export `id` with its right nonce (whatever the answer will be).
  void note_request(std::uint64_t id);
  void release(std::uint64_t id, std::uint64_t conn);
  void drop_connection(std::uint64_t conn);

  // Unmap of [va, va+size) by the program: every export with a page in it stops serving before the
  // driver is called (no descriptor of a page being unmapped is handed out), and is erased if the
  // driver unmapped (or restored if it refused).
  struct Dropped {
    std::uint64_t id = 0;
    unsigned importers = 0;  // opens still held by importers
    std::size_t pages = 0;
    std::uint64_t bytes = 0, res_base = 0;
    EventRef made;
  };
  struct UnmapToken {
    std::vector<Dropped> exports;
    bool empty() const { return exports.empty(); }
  };
  UnmapToken begin_unmap(std::uint64_t va, std::uint64_t size);
  // Returns the exports that were dropped (empty when the driver refused the unmap).
  std::vector<Dropped> end_unmap(const UnmapToken &t, bool unmapped);

  // Exports made and exports no importer ever opened, live and dropped together: a bridge handle
  // opens only in a process under the shim (its bytes mean nothing to the driver), so a peer that
  // runs without it fails its open with the driver's error and tells nobody. nullopt when the lock
  // was not had within patience_ns (exit paths, lock_within.h).
  struct Unrequested {
    std::size_t made = 0, never_requested = 0;
    std::uint64_t never_requested_bytes = 0;
    EventRef first;  // the call that made the first export never requested
  };
  std::optional<Unrequested> unrequested_within(std::uint64_t patience_ns) const;

  std::size_t size() const;
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }
  void clear();
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child() {
    mu_.unlock();
    clear();
  }

 private:
  mutable MarkedMutex mu_;  // its holder is known (exit paths, lock_within.h)
  std::uint64_t next_id_ = 1;
  std::map<std::uint64_t, Export> exports_;  // by id
  std::atomic<std::size_t> count_{0};
  Unrequested dropped_;  // of the exports erased so far (made counts every export)
};

// ---- the importer's table ---------------------------------------------------------------------
// Address rule (docs/ipc-bridge.md): the importer reserves only the span from the first to the end
// of the last exported page and returns base = span_va - first_off, so that base + o is the byte at
// offset o of the exporter's reservation for every o inside an exported page. base itself is an
// address only when the first exported page is at offset 0.
struct Layout {
  std::uint64_t first_off = 0, span = 0;
};
Layout layout_for(std::span<const PageRange> pages);  // pages_valid() first
inline std::uint64_t import_base(std::uint64_t span_va, const Layout &l) {
  return span_va - l.first_off;  // modulo 2^64, like the caller's pointer arithmetic
}

struct ImportKey {
  std::uint32_t pid = 0;
  std::uint64_t tag = 0, export_id = 0;
  auto operator<=>(const ImportKey &) const = default;
};

struct Import {
  ImportKey key;
  std::uint64_t ptr = 0;  // what the caller got
  std::uint64_t span_va = 0, span = 0;
  std::uint64_t bytes = 0;
  std::vector<PageRange> maps;  // importer addresses (va, size) mapped in the span
  unsigned refs = 0;
  int dev = -1;
  EventRef opened;
};

// Not locked: the shim serializes opens and closes with one mutex (an open is a setup-time call).
class ImportTable {
 public:
  Import *find(const ImportKey &k);
  Import *by_ptr(std::uint64_t ptr);
  bool ptr_taken(std::uint64_t ptr) const { return by_ptr_.count(ptr) != 0; }
  Import &add(Import imp);
  // One close of ptr: nullopt when ptr is no bridge import; otherwise the import, erased from the
  // table when that was its last reference (refs == 0 in the returned copy).
  std::optional<Import> close(std::uint64_t ptr);
  std::size_t from_exporter(std::uint32_t pid, std::uint64_t tag) const;
  std::size_t size() const { return imports_.size(); }
  void clear();

 private:
  std::map<ImportKey, Import> imports_;
  std::map<std::uint64_t, ImportKey> by_ptr_;
};

// ---- the diagnosis -----------------------------------------------------------------------------
struct SubjectPage {
  std::uint64_t off = 0, size = 0;
  unsigned handle_types = 0;  // what the allocation really has
  bool device = true;         // device-located (host-located pages keep the program's types)
};
struct Subject {
  const char *api = "";
  std::uint64_t ptr = 0;
  std::uint64_t res_base = 0, res_size = 0;
  EventRef reserved;
  std::vector<SubjectPage> pages;
};

// PyTorch's effective expandable_segments and where it came from.
struct TorchHint {
  bool expandable = false;
  std::string var;    // "PYTORCH_CUDA_ALLOC_CONF"
  std::string token;  // the item as written: "expandable_segments:True"
  // TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC as PyTorch reads it: "unset", "'0'", "'1'", "'yes'".
  std::string ipc_var;
  bool ipc_off = false;  // "0": PyTorch's own sharing of these tensors (torch.multiprocessing)
                         // fails too, their segments have no shareable handle type
};
// What the release will use (torchconf::evaluate with its grammar; 2.11 by default).
TorchHint torch_hint(const torchconf::Env &env);
TorchHint torch_hint(const torchconf::Env &env, const torchconf::Grammar &g);

// Bridge mode adds POSIX_FD to a device-located cuMemCreate when the device supports it, so that
// the allocation can later be exported; everything else keeps the types the program asked for.
unsigned widened_types(unsigned requested, bool device_located, bool device_supports_fd);

// Why the bridge cannot export this reservation; empty when it can.
std::string bridge_blocker(const Subject &s);

// What cudaIpcGetMemHandle / cuIpcGetMemHandle of VMM memory does under CUMEMGUARD_IPC.
struct ExportPlan {
  enum class What : std::uint8_t {
    Bridge,            // export through the broker
    Report,            // forward to the driver, ipc-vmm finding if it refuses
    Deny,              // refuse without the driver, ipc-vmm finding
    BridgeImpossible,  // bridge mode, but `blocker` says why not: forward, ipc-vmm finding
  };
  What what = What::Report;
  std::string blocker;
};
// handle_given: the caller passed somewhere to write the handle (else the driver answers).
ExportPlan plan_export(IpcMode mode, const Subject &s, bool handle_given);

// The ipc-vmm finding at the export call (plan.what is not Bridge): the reservation, its mapped
// pages and handle types, PyTorch's variable and token when expandable segments are on, and the
// ways out.
Finding ipc_vmm_finding(const Subject &s, const TorchHint &torch, const ExportPlan &plan);

// The exporter freed (unmapped) pages of an export that importers still hold open (P16).
Finding free_exported_finding(const ExportTable::Dropped &d, const char *api, std::uint64_t va,
                              std::uint64_t size);

// Importer-side failures, one line each (class ipc-vmm).
enum class OpenFailure : std::uint8_t {
  CorruptHandle,  // decode_handle said so
  SameProcess,    // opened in the exporting process (legacy IPC: INVALID_CONTEXT, measured)
  ExporterGone,   // nothing listens at the handle's address
  NotExporter,    // something else listens there (SO_PEERCRED of the server)
  OtherUser,      // the broker refused: another user
  UnknownExport,  // the broker does not know the export (never made, or freed since)
  BadNonce,       // forged or altered handle
  ProtocolError,  // the broker's answer did not parse or timed out
  ExportFailed,   // the exporter's driver refused to export a page
  ImportFailed,   // this process's driver refused the import, reservation, map or access
  NoContext,      // no current context
};
Finding open_failure_finding(OpenFailure why, const char *api, const Handle &h,
                             std::string_view detail);

}  // namespace cmg::ipc
