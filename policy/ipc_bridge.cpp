// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge without CUDA (see ipc_bridge.h and docs/ipc-bridge.md).
#include "ipc_bridge.h"

#include "lock_within.h"
#include "text.h"
#include "units.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace cmg::ipc {
namespace {

// Little-endian fields, written byte by byte: the layout is the same on every host and no
// padding byte of a struct ever reaches the wire or the handle.
template <class T>
void put(std::uint8_t *p, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
template <class T>
T get(const std::uint8_t *p) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i)
    v = static_cast<T>(v | (static_cast<T>(p[i]) << (8 * i)));
  return v;
}

// FNV-1a: catches corruption and truncation of a handle on the importer's side before any socket
// is opened. Authenticity comes from the nonce the broker checks, not from this.
std::uint32_t fnv1a(const std::uint8_t *p, std::size_t n) {
  std::uint32_t h = 2166136261u;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 16777619u;
  }
  return h;
}

constexpr std::array<std::uint8_t, 4> kReqMagic = {'C', 'M', 'G', 'Q'};
constexpr std::array<std::uint8_t, 4> kReplyMagic = {'C', 'M', 'G', 'R'};
constexpr std::array<std::uint8_t, 4> kChunkMagic = {'C', 'M', 'G', 'P'};

template <std::size_t N>
bool has_magic(const std::uint8_t *p, const std::array<std::uint8_t, N> &m) {
  return std::memcmp(p, m.data(), N) == 0;
}

}  // namespace

std::string handle_type_names(unsigned types) {
  std::string s;
  auto add = [&](unsigned bit, const char *name) {
    if (!(types & bit)) return;
    if (!s.empty()) s += '|';
    s += name;
  };
  add(kTypePosixFd, "POSIX_FD");
  add(kTypeWin32, "WIN32");
  add(kTypeWin32Kmt, "WIN32_KMT");
  add(kTypeFabric, "FABRIC");
  const unsigned rest = types & ~(kTypePosixFd | kTypeWin32 | kTypeWin32Kmt | kTypeFabric);
  if (rest) {
    if (!s.empty()) s += '|';
    s += hex(rest);
  }
  return s.empty() ? "none" : s;
}

// ---- handle ---------------------------------------------------------------------------------
std::array<std::uint8_t, kHandleSize> encode_handle(const Handle &h) {
  std::array<std::uint8_t, kHandleSize> b{};
  std::memcpy(b.data(), kHandleMagic.data(), kHandleMagic.size());
  put<std::uint16_t>(&b[8], kVersion);
  put<std::uint16_t>(&b[10], 0);  // flags
  put<std::uint32_t>(&b[12], h.pid);
  put<std::uint64_t>(&b[16], h.tag);
  put<std::uint64_t>(&b[24], h.export_id);
  std::memcpy(&b[32], h.nonce.data(), h.nonce.size());
  put<std::uint64_t>(&b[48], h.res_base);
  put<std::uint32_t>(&b[56], h.pages);
  put<std::uint32_t>(&b[60], fnv1a(b.data(), 60));
  return b;
}

std::string_view handle_status_text(HandleStatus s) {
  switch (s) {
    case HandleStatus::Ok:
      return "ok";
    case HandleStatus::NotOurs:
      return "not a bridge handle";
    case HandleStatus::Truncated:
      return "shorter than 64 bytes";
    case HandleStatus::BadCheck:
      return "checksum mismatch (corrupted or cut off)";
    case HandleStatus::BadVersion:
      return "unknown handle version";
    case HandleStatus::BadFields:
      return "a field is out of range";
  }
  return "?";
}

HandleStatus decode_handle(std::span<const std::uint8_t> bytes, Handle &out) {
  // A shorter buffer that still starts with the magic is one of ours, cut off.
  const std::size_t m = std::min(bytes.size(), kHandleMagic.size());
  if (m == 0 || std::memcmp(bytes.data(), kHandleMagic.data(), m) != 0)
    return HandleStatus::NotOurs;
  if (bytes.size() < kHandleSize) return HandleStatus::Truncated;
  const std::uint8_t *b = bytes.data();
  if (get<std::uint32_t>(b + 60) != fnv1a(b, 60)) return HandleStatus::BadCheck;
  if (get<std::uint16_t>(b + 8) != kVersion) return HandleStatus::BadVersion;
  Handle h;
  h.pid = get<std::uint32_t>(b + 12);
  h.tag = get<std::uint64_t>(b + 16);
  h.export_id = get<std::uint64_t>(b + 24);
  std::memcpy(h.nonce.data(), b + 32, h.nonce.size());
  h.res_base = get<std::uint64_t>(b + 48);
  h.pages = get<std::uint32_t>(b + 56);
  if (get<std::uint16_t>(b + 10) != 0 || h.pid == 0 || h.pid > 0x3fffffff || h.tag == 0 ||
      h.export_id == 0 || h.pages == 0 || h.pages > kMaxPages)
    return HandleStatus::BadFields;
  out = h;
  return HandleStatus::Ok;
}

std::string socket_name(std::uint32_t pid, std::uint64_t tag) {
  char buf[80];
  int n = std::snprintf(buf, sizeof buf, "cumemguard-ipc.%" PRIu32 ".%016" PRIx64, pid, tag);
  std::string s(1, '\0');
  s.append(buf, static_cast<std::size_t>(n));
  return s;
}

// ---- wire --------------------------------------------------------------------------------------
std::array<std::uint8_t, kRequestSize> encode_request(const Request &r) {
  std::array<std::uint8_t, kRequestSize> b{};
  std::memcpy(b.data(), kReqMagic.data(), 4);
  put<std::uint16_t>(&b[4], kVersion);
  put<std::uint16_t>(&b[6], static_cast<std::uint16_t>(r.op));
  put<std::uint64_t>(&b[8], r.export_id);
  std::memcpy(&b[16], r.nonce.data(), r.nonce.size());
  return b;
}

std::string_view parse_error_text(ParseError e) {
  switch (e) {
    case ParseError::None:
      return "ok";
    case ParseError::Size:
      return "wrong message size";
    case ParseError::Magic:
      return "wrong magic";
    case ParseError::Version:
      return "unknown protocol version";
    case ParseError::Op:
      return "unknown operation";
    case ParseError::Fields:
      return "a field is out of range";
  }
  return "?";
}

ParseError parse_request(std::span<const std::uint8_t> bytes, Request &out) {
  if (bytes.size() != kRequestSize) return ParseError::Size;
  const std::uint8_t *b = bytes.data();
  if (!has_magic(b, kReqMagic)) return ParseError::Magic;
  if (get<std::uint16_t>(b + 4) != kVersion) return ParseError::Version;
  const auto op = get<std::uint16_t>(b + 6);
  if (op != static_cast<std::uint16_t>(Op::Open) && op != static_cast<std::uint16_t>(Op::Release))
    return ParseError::Op;
  Request r;
  r.op = static_cast<Op>(op);
  r.export_id = get<std::uint64_t>(b + 8);
  std::memcpy(r.nonce.data(), b + 16, r.nonce.size());
  if (r.export_id == 0) return ParseError::Fields;
  out = r;
  return ParseError::None;
}

std::string_view reply_status_text(ReplyStatus s) {
  switch (s) {
    case ReplyStatus::Ok:
      return "ok";
    case ReplyStatus::Malformed:
      return "malformed request";
    case ReplyStatus::UnknownExport:
      return "unknown export";
    case ReplyStatus::BadNonce:
      return "wrong nonce";
    case ReplyStatus::Denied:
      return "denied: another user";
    case ReplyStatus::ExportFailed:
      return "the exporter's driver refused to export a page";
    case ReplyStatus::Busy:
      return "too many connections";
  }
  return "?";
}

std::array<std::uint8_t, kReplySize> encode_reply(const Reply &r) {
  std::array<std::uint8_t, kReplySize> b{};
  std::memcpy(b.data(), kReplyMagic.data(), 4);
  put<std::uint16_t>(&b[4], kVersion);
  put<std::uint16_t>(&b[6], static_cast<std::uint16_t>(r.status));
  put<std::uint64_t>(&b[8], r.export_id);
  put<std::uint64_t>(&b[16], r.res_base);
  put<std::uint64_t>(&b[24], r.res_size);
  put<std::uint32_t>(&b[32], r.pages);
  put<std::uint32_t>(&b[36], r.driver_error);
  put<std::uint64_t>(&b[40], r.bytes);
  put<std::uint64_t>(&b[48], r.first_off);
  put<std::uint64_t>(&b[56], r.span);
  return b;
}

ParseError parse_reply(std::span<const std::uint8_t> bytes, Reply &out) {
  if (bytes.size() != kReplySize) return ParseError::Size;
  const std::uint8_t *b = bytes.data();
  if (!has_magic(b, kReplyMagic)) return ParseError::Magic;
  if (get<std::uint16_t>(b + 4) != kVersion) return ParseError::Version;
  const auto st = get<std::uint16_t>(b + 6);
  if (st > static_cast<std::uint16_t>(ReplyStatus::Busy)) return ParseError::Op;
  Reply r;
  r.status = static_cast<ReplyStatus>(st);
  r.export_id = get<std::uint64_t>(b + 8);
  r.res_base = get<std::uint64_t>(b + 16);
  r.res_size = get<std::uint64_t>(b + 24);
  r.pages = get<std::uint32_t>(b + 32);
  r.driver_error = get<std::uint32_t>(b + 36);
  r.bytes = get<std::uint64_t>(b + 40);
  r.first_off = get<std::uint64_t>(b + 48);
  r.span = get<std::uint64_t>(b + 56);
  if (r.pages > kMaxPages) return ParseError::Fields;
  if (r.status != ReplyStatus::Ok && (r.pages || r.span || r.first_off || r.bytes))
    return ParseError::Fields;
  out = r;
  return ParseError::None;
}

std::vector<std::uint8_t> encode_chunk(std::uint32_t first, std::span<const PageRange> pages) {
  std::vector<std::uint8_t> b(kChunkHeader + pages.size() * 16, 0);
  std::memcpy(b.data(), kChunkMagic.data(), 4);
  put<std::uint16_t>(&b[4], kVersion);
  put<std::uint16_t>(&b[6], static_cast<std::uint16_t>(pages.size()));
  put<std::uint32_t>(&b[8], first);
  for (std::size_t i = 0; i < pages.size(); ++i) {
    put<std::uint64_t>(&b[kChunkHeader + 16 * i], pages[i].off);
    put<std::uint64_t>(&b[kChunkHeader + 16 * i + 8], pages[i].size);
  }
  return b;
}

ParseError parse_chunk(std::span<const std::uint8_t> bytes, std::uint32_t &first,
                       std::vector<PageRange> &pages) {
  if (bytes.size() < kChunkHeader || bytes.size() > kChunkMax) return ParseError::Size;
  const std::uint8_t *b = bytes.data();
  if (!has_magic(b, kChunkMagic)) return ParseError::Magic;
  if (get<std::uint16_t>(b + 4) != kVersion) return ParseError::Version;
  const std::size_t n = get<std::uint16_t>(b + 6);
  if (n == 0 || n > kPagesPerChunk || bytes.size() != kChunkHeader + 16 * n)
    return ParseError::Size;
  if (get<std::uint32_t>(b + 12) != 0) return ParseError::Fields;
  first = get<std::uint32_t>(b + 8);
  pages.clear();
  for (std::size_t i = 0; i < n; ++i)
    pages.push_back({get<std::uint64_t>(b + kChunkHeader + 16 * i),
                     get<std::uint64_t>(b + kChunkHeader + 16 * i + 8)});
  return ParseError::None;
}

bool pages_valid(std::span<const PageRange> pages, std::uint64_t res_size) {
  if (pages.empty() || pages.size() > kMaxPages) return false;
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < pages.size(); ++i) {
    const PageRange &p = pages[i];
    if (p.size == 0 || p.off > res_size || p.size > res_size - p.off) return false;
    if (i > 0 && p.off < end) return false;
    end = p.off + p.size;
  }
  return true;
}

// ---- peers -----------------------------------------------------------------------------------
PeerVerdict check_peer(const PeerCred &peer, std::uint32_t self_uid) {
  return peer.uid == self_uid ? PeerVerdict::Allowed : PeerVerdict::OtherUser;
}

ServerVerdict check_server(const PeerCred &server, std::uint32_t handle_pid,
                           std::uint32_t self_uid) {
  if (server.pid <= 0 || static_cast<std::uint32_t>(server.pid) != handle_pid)
    return ServerVerdict::NotExporter;
  return server.uid == self_uid ? ServerVerdict::Exporter : ServerVerdict::OtherUser;
}

bool nonce_equal(const Nonce &a, const Nonce &b) {
  std::uint8_t d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = static_cast<std::uint8_t>(d | (a[i] ^ b[i]));
  return d == 0;
}

// ---- exports -------------------------------------------------------------------------------
unsigned Export::importer_count() const {
  unsigned n = 0;
  for (const auto &[c, k] : importers) n += k;
  return n;
}

std::uint64_t Export::bytes() const {
  std::uint64_t b = 0;
  for (const auto &p : pages) b += p.size;
  return b;
}

std::optional<ExportTable::Made> ExportTable::find_or_add(std::uint64_t res_base,
                                                          std::uint64_t res_size,
                                                          const std::vector<ExportPage> &pages,
                                                          const EventRef &made, int dev,
                                                          const Random &random) {
  std::lock_guard lk(mu_);
  for (const auto &[id, e] : exports_)
    if (!e.dying && e.res_base == res_base && e.res_size == res_size && e.pages == pages)
      return Made{id, e.nonce, true};
  Export e;
  if (!random || !random(e.nonce.data(), e.nonce.size())) return std::nullopt;
  e.id = next_id_++;
  e.res_base = res_base;
  e.res_size = res_size;
  e.pages = pages;
  e.made = made;
  e.dev = dev;
  Made m{e.id, e.nonce, false};
  exports_.emplace(e.id, std::move(e));
  count_.store(exports_.size(), std::memory_order_relaxed);
  return m;
}

ExportTable::Lookup ExportTable::lookup(std::uint64_t id, const Nonce &nonce, Export *copy) const {
  std::lock_guard lk(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return Lookup::Unknown;
  if (!nonce_equal(it->second.nonce, nonce)) return Lookup::BadNonce;
  if (it->second.dying) return Lookup::Dying;
  if (copy) *copy = it->second;
  return Lookup::Ok;
}

bool ExportTable::commit_open(std::uint64_t id, std::uint64_t conn) {
  std::lock_guard lk(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end() || it->second.dying) return false;
  ++it->second.importers[conn];
  return true;
}

void ExportTable::note_request(std::uint64_t id) {
  std::lock_guard lk(mu_);
  if (auto it = exports_.find(id); it != exports_.end()) ++it->second.requests;
}

void ExportTable::release(std::uint64_t id, std::uint64_t conn) {
  std::lock_guard lk(mu_);
  auto it = exports_.find(id);
  if (it == exports_.end()) return;
  auto c = it->second.importers.find(conn);
  if (c == it->second.importers.end()) return;
  if (--c->second == 0) it->second.importers.erase(c);
}

void ExportTable::drop_connection(std::uint64_t conn) {
  std::lock_guard lk(mu_);
  for (auto &[id, e] : exports_) e.importers.erase(conn);
}

ExportTable::UnmapToken ExportTable::begin_unmap(std::uint64_t va, std::uint64_t size) {
  UnmapToken t;
  if (!any()) return t;
  std::lock_guard lk(mu_);
  const std::uint64_t end = va + size;
  for (auto &[id, e] : exports_) {
    if (e.dying) continue;
    bool hit = false;
    for (const auto &p : e.pages) {
      const std::uint64_t a = e.res_base + p.off;
      if (a < end && va < a + p.size) hit = true;
    }
    if (!hit) continue;
    e.dying = true;
    t.exports.push_back(
        Dropped{id, e.importer_count(), e.pages.size(), e.bytes(), e.res_base, e.made});
  }
  return t;
}

std::vector<ExportTable::Dropped> ExportTable::end_unmap(const UnmapToken &t, bool unmapped) {
  std::vector<Dropped> out;
  if (t.empty()) return out;
  std::lock_guard lk(mu_);
  for (const Dropped &d : t.exports) {
    auto it = exports_.find(d.id);
    if (it == exports_.end()) continue;
    if (!unmapped) {
      it->second.dying = false;
      continue;
    }
    Dropped now = d;
    now.importers = it->second.importer_count();  // opens that arrived before it began dying
    out.push_back(now);
    if (it->second.requests == 0) {
      if (!dropped_.never_requested || it->second.made.seq < dropped_.first.seq)
        dropped_.first = it->second.made;
      ++dropped_.never_requested;
      dropped_.never_requested_bytes += it->second.bytes();
    }
    exports_.erase(it);
  }
  count_.store(exports_.size(), std::memory_order_relaxed);
  return out;
}

std::optional<ExportTable::Unrequested> ExportTable::unrequested_within(
    std::uint64_t patience_ns) const {
  if (!lock_within(mu_, patience_ns)) return std::nullopt;
  std::lock_guard lk(mu_, std::adopt_lock);
  Unrequested u = dropped_;
  u.made = next_id_ - 1;
  for (const auto &[id, e] : exports_) {
    if (e.requests) continue;
    if (!u.never_requested || e.made.seq < u.first.seq) u.first = e.made;
    ++u.never_requested;
    u.never_requested_bytes += e.bytes();
  }
  return u;
}

std::size_t ExportTable::size() const {
  std::lock_guard lk(mu_);
  return exports_.size();
}

void ExportTable::clear() {
  std::lock_guard lk(mu_);
  exports_.clear();
  dropped_ = Unrequested{};
  next_id_ = 1;
  count_.store(0, std::memory_order_relaxed);
}

// ---- imports -------------------------------------------------------------------------------
Layout layout_for(std::span<const PageRange> pages) {
  Layout l;
  if (pages.empty()) return l;
  l.first_off = pages.front().off;
  l.span = pages.back().off + pages.back().size - l.first_off;
  return l;
}

Import *ImportTable::find(const ImportKey &k) {
  auto it = imports_.find(k);
  return it == imports_.end() ? nullptr : &it->second;
}

Import *ImportTable::by_ptr(std::uint64_t ptr) {
  auto it = by_ptr_.find(ptr);
  return it == by_ptr_.end() ? nullptr : find(it->second);
}

Import &ImportTable::add(Import imp) {
  by_ptr_[imp.ptr] = imp.key;
  auto [it, ok] = imports_.insert_or_assign(imp.key, std::move(imp));
  (void)ok;
  return it->second;
}

std::optional<Import> ImportTable::close(std::uint64_t ptr) {
  Import *imp = by_ptr(ptr);
  if (!imp) return std::nullopt;
  if (imp->refs) --imp->refs;
  Import copy = *imp;
  if (copy.refs == 0) {
    by_ptr_.erase(ptr);
    imports_.erase(copy.key);
  }
  return copy;
}

std::size_t ImportTable::from_exporter(std::uint32_t pid, std::uint64_t tag) const {
  std::size_t n = 0;
  for (const auto &[k, v] : imports_) n += k.pid == pid && k.tag == tag;
  return n;
}

void ImportTable::clear() {
  imports_.clear();
  by_ptr_.clear();
}

// ---- diagnosis --------------------------------------------------------------------------------
TorchHint torch_hint(const torchconf::Env &env) {
  return torch_hint(env, torchconf::default_grammar());
}

TorchHint torch_hint(const torchconf::Env &env, const torchconf::Grammar &g) {
  namespace tc = torchconf;
  TorchHint h;
  h.ipc_var = env.expandable_ipc ? "'" + *env.expandable_ipc + "'" : std::string("unset");
  h.ipc_off = env.expandable_ipc == std::optional<std::string>("0");
  const tc::Outcome o = tc::evaluate(env, g);
  if (o.cls != tc::OutcomeClass::Ok || !o.settings.expandable_segments) return h;
  h.expandable = true;
  const tc::Var v = o.source[static_cast<std::size_t>(tc::Key::ExpandableSegments)];
  h.var = std::string(tc::var_name(v));
  h.token = "expandable_segments:True";
  const auto &value = env.get(v);
  if (!value) return h;
  // The item as written, from the last occurrence of the key (the one PyTorch keeps).
  const auto toks = tc::tokenize_spans(*value);
  for (std::size_t i = 0; i + 2 < toks.size(); ++i)
    if (tc::find_key(toks[i].text) == tc::Key::ExpandableSegments && toks[i + 1].text == ":")
      h.token = value->substr(toks[i].begin, toks[i + 2].end - toks[i].begin);
  return h;
}

unsigned widened_types(unsigned requested, bool device_located, bool device_supports_fd) {
  if (!device_located || !device_supports_fd) return requested;
  return requested | kTypePosixFd;
}

std::string bridge_blocker(const Subject &s) {
  if (s.pages.empty()) return "nothing is mapped in the reservation, so there is nothing to share";
  if (s.pages.size() > kMaxPages)
    return std::to_string(s.pages.size()) + " mapped pages, more than one export carries (" +
           std::to_string(kMaxPages) + ")";
  for (const SubjectPage &p : s.pages) {
    if (p.handle_types & kTypePosixFd) continue;
    std::string why = "the page at +" + std::to_string(p.off) + " (" + human_bytes(p.size) +
                      ") has handle types " + handle_type_names(p.handle_types) +
                      ", without POSIX_FD, and cannot be exported as a file descriptor";
    why += p.device ? " (in bridge mode the shim adds POSIX_FD at cuMemCreate where the device "
                      "supports it; this device or driver did not accept it)"
                    : " (host-located allocations keep the handle types the program asked for)";
    return why;
  }
  return {};
}

ExportPlan plan_export(IpcMode mode, const Subject &s, bool handle_given) {
  using W = ExportPlan::What;
  if (mode == IpcMode::Deny) return {W::Deny, {}};
  if (mode != IpcMode::Bridge || !handle_given) return {W::Report, {}};
  std::string why = bridge_blocker(s);
  if (why.empty()) return {W::Bridge, {}};
  return {W::BridgeImpossible, std::move(why)};
}

Finding ipc_vmm_finding(const Subject &s, const TorchHint &torch, const ExportPlan &plan) {
  using W = ExportPlan::What;
  const std::string_view blocker = plan.blocker;
  Finding f;
  f.cls = FindingClass::IpcVmm;
  std::uint64_t mapped = 0;
  unsigned types = 0;
  bool first = true;
  for (const SubjectPage &p : s.pages) {
    mapped += p.size;
    types = first ? p.handle_types : (types & p.handle_types);
    first = false;
  }
  std::string list;
  for (std::size_t i = 0; i < s.pages.size() && i < 8; ++i)
    list += (i ? ", +" : "+") + std::to_string(s.pages[i].off) + " (" + human_bytes(s.pages[i].size) + ")";
  if (s.pages.size() > 8) list += ", and " + std::to_string(s.pages.size() - 8) + " more";
  f.msg = std::string(s.api) + " of " + hex(s.ptr) + ", which lies in the VMM reservation " +
          hex(s.res_base) + " (" + human_bytes(s.res_size) + ", reserved at " + at_seq(s.reserved) + "; " +
          std::to_string(s.pages.size()) + " mapped page(s)" +
          (list.empty() ? std::string() : ": " + list) + "; handle types " +
          (s.pages.empty() ? std::string("none mapped") : handle_type_names(types)) +
          "): legacy CUDA IPC cannot export memory made with cuMemCreate, and the driver answers "
          "invalid argument";
  if (torch.expandable)
    f.msg += ". PyTorch's " + torch.var + " has '" + torch.token +
             "', so its caching allocator makes every segment this way (" +
             std::string(torchconf::kExpandableIpcVar) + " " + torch.ipc_var +
             (torch.ipc_off ? ": off, so torch.multiprocessing cannot share these tensors either"
                            : ": torch.multiprocessing shares such tensors with POSIX file "
                              "descriptors, legacy CUDA IPC cannot") +
             ")";
  switch (plan.what) {
    case W::Bridge:
    case W::Report:
      break;
    case W::Deny:
      f.msg += "; refused without calling the driver (CUMEMGUARD_IPC=deny)";
      break;
    case W::BridgeImpossible:
      f.msg += "; CUMEMGUARD_IPC=bridge cannot export it either: " + std::string(blocker) +
               "; the call went to the driver";
      break;
  }
  if (plan.what != W::BridgeImpossible) {
    f.msg +=
        ". Ways out: run exporter and importer with CUMEMGUARD_IPC=bridge (the shim then "
        "returns a handle that cudaIpcOpenMemHandle opens in the other process), or ";
    f.msg += torch.expandable
                 ? "allocate this buffer with expandable segments off: "
                   "with cumemguard.expandable_segments(False) around the allocation (the "
                   "loaded release's setter, every other setting kept and restored), or "
                   "CUMEMGUARD_TORCH_ALLOC_CONF=expandable_segments:False for the whole process"
                 : "allocate the buffer with cudaMalloc, or share it with "
                   "cuMemExportToShareableHandle";
  }
  std::string pages_json;
  for (std::size_t i = 0; i < s.pages.size() && i < 16; ++i)
    pages_json += (i ? ",{" : "{") + std::string("\"off\":") + std::to_string(s.pages[i].off) +
                  ",\"size\":" + std::to_string(s.pages[i].size) + ",\"types\":\"" +
                  handle_type_names(s.pages[i].handle_types) + "\"}";
  const char *mode_name = plan.what == W::Deny     ? "deny"
                          : plan.what == W::Report ? "report"
                                                   : "bridge";
  f.state_json = "{\"reservation\":\"" + hex(s.res_base) +
                 "\",\"size\":" + std::to_string(s.res_size) +
                 ",\"mapped_pages\":" + std::to_string(s.pages.size()) +
                 ",\"mapped_bytes\":" + std::to_string(mapped) + ",\"handle_types\":\"" +
                 (s.pages.empty() ? "" : handle_type_names(types)) + "\",\"pages\":[" + pages_json +
                 "],\"mode\":\"" + mode_name + "\"";
  if (torch.expandable)
    f.state_json += ",\"torch_var\":\"" + json_escape(torch.var) + "\",\"torch_token\":\"" +
                    json_escape(torch.token) + "\",\"expandable_segments_ipc\":\"" +
                    json_escape(torch.ipc_var) + "\"";
  if (!blocker.empty()) f.state_json += ",\"bridge_blocker\":\"" + json_escape(blocker) + "\"";
  f.state_json += "}";
  f.related.push_back({"reservation", s.reserved});
  f.bytes = mapped;
  return f;
}

Finding free_exported_finding(const ExportTable::Dropped &d, const char *api, std::uint64_t va,
                              std::uint64_t size) {
  Finding f;
  f.cls = FindingClass::FreeExported;
  f.msg = std::string(api) + " of " + hex(va) + " (+" + std::to_string(size) +
          " bytes) frees pages of bridge export " + std::to_string(d.id) + " (reservation " +
          hex(d.res_base) + ", " + std::to_string(d.pages) + " page(s), " + human_bytes(d.bytes) +
          ", exported at " + at_seq(d.made) + ") while importers still hold " +
          std::to_string(d.importers) +
          " open(s) of it: they keep the pages they mapped (imported memory stays alive until "
          "they close it), but the two processes no longer share those bytes with this "
          "reservation, and new opens of the handle are refused";
  f.related.push_back({"export", d.made});
  f.state_json = "{\"export\":" + std::to_string(d.id) + ",\"reservation\":\"" + hex(d.res_base) +
                 "\",\"pages\":" + std::to_string(d.pages) +
                 ",\"bytes\":" + std::to_string(d.bytes) +
                 ",\"importer_opens\":" + std::to_string(d.importers) + "}";
  f.bytes = d.bytes;
  return f;
}

Finding open_failure_finding(OpenFailure why, const char *api, const Handle &h,
                             std::string_view detail) {
  Finding f;
  f.cls = FindingClass::IpcVmm;
  std::string what;
  switch (why) {
    case OpenFailure::CorruptHandle:
      what = "the handle carries the bridge's magic but is corrupt";
      break;
    case OpenFailure::SameProcess:
      what = "the handle was exported by this very process (legacy IPC refuses that too)";
      break;
    case OpenFailure::ExporterGone:
      what = "the exporter (pid " + std::to_string(h.pid) +
             ") is gone: nothing listens at its "
             "broker's address";
      break;
    case OpenFailure::NotExporter:
      what = "the socket at the broker's address does not belong to the exporter (pid " +
             std::to_string(h.pid) + ") of this user";
      break;
    case OpenFailure::OtherUser:
      what = "the exporter (pid " + std::to_string(h.pid) +
             ") runs as another user, and the "
             "bridge shares memory only between processes of one user";
      break;
    case OpenFailure::UnknownExport:
      what = "the exporter (pid " + std::to_string(h.pid) + ") has no export " +
             std::to_string(h.export_id) + ": it was never made, or the memory was freed since";
      break;
    case OpenFailure::BadNonce:
      what = "the exporter (pid " + std::to_string(h.pid) + ") has export " +
             std::to_string(h.export_id) + " but the handle's nonce is wrong (forged or altered)";
      break;
    case OpenFailure::ProtocolError:
      what = "the exporter's broker (pid " + std::to_string(h.pid) + ") did not answer properly";
      break;
    case OpenFailure::ExportFailed:
      what =
          "the exporter's driver refused to export a page of export " + std::to_string(h.export_id);
      break;
    case OpenFailure::ImportFailed:
      what = "this process could not import the exported pages";
      break;
    case OpenFailure::NoContext:
      what = "there is no current CUDA context on this thread";
      break;
  }
  f.msg = std::string(api) + " of a cumemguard bridge handle failed: " + what;
  if (!detail.empty()) f.msg += " (" + std::string(detail) + ")";
  f.state_json = "{\"exporter_pid\":" + std::to_string(h.pid) +
                 ",\"export\":" + std::to_string(h.export_id) + ",\"exporter_base\":\"" +
                 hex(h.res_base) + "\"}";
  return f;
}

}  // namespace cmg::ipc
