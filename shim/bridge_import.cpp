// SPDX-License-Identifier: Apache-2.0
// The bridge's importer side (docs/ipc-bridge.md): opens and closes of bridge handles, one
// connection per exporter, the pages mapped into a span of this process. Locks: the tables are
// guarded by g_imp_mu, held for bookkeeping only (a fork() takes it in the shim's prepare handler,
// so it is never held across a socket wait: an exporter that stops answering would stall every
// fork for the 30 s of the wait); each connection's requests are serialised by its own `io`
// mutex, which no fork handler takes. Order: io, then g_imp_mu.
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <set>

#include "bridge.h"
#include "bridge_io.h"
#include "owned_fd.h"
#include "state.h"

namespace cmg::shim::bridge {
namespace {

using PeerKey = std::pair<std::uint32_t, std::uint64_t>;  // exporter pid, broker tag

// One connection to an exporter's broker, kept while imports from it live.
struct Peer {
  std::mutex io;  // one request at a time; held across its socket waits
  OwnedFd fd;     // guarded by io; invalid when not connected
};

struct Tables {
  ipc::ImportTable imports;
  std::map<PeerKey, std::shared_ptr<Peer>> peers;
  std::set<ipc::ImportKey> opening;  // opens in flight: a second open of one export waits
  std::condition_variable opened;
};
std::mutex g_imp_mu;  // the tables; never held across socket I/O or a driver call
Tables *g_tables = new Tables;  // leaked: used until exit (a forked child starts a new one)

struct Failure {
  ipc::OpenFailure why = ipc::OpenFailure::ProtocolError;
  std::string detail;
};

std::shared_ptr<Peer> peer_for(const PeerKey &k) {  // g_imp_mu held
  auto &p = g_tables->peers[k];
  if (!p) p = std::make_shared<Peer>();
  return p;
}

// Closes the connection when no import from that exporter is left or on its way (io held).
void close_if_unused(const PeerKey &k, Peer &p) {
  std::lock_guard lk(g_imp_mu);
  if (g_tables->imports.from_exporter(k.first, k.second) != 0) return;
  for (const ipc::ImportKey &o : g_tables->opening)
    if (o.pid == k.first && o.tag == k.second) return;
  p.fd.close();
  auto it = g_tables->peers.find(k);
  if (it != g_tables->peers.end() && it->second.get() == &p) g_tables->peers.erase(it);
}

// The broker must be the exporter the handle names, and of this user: no other process squatting
// the address hands out descriptors of its own.
bool check_broker(int fd, const ipc::Handle &h, Failure &f) {
  ipc::PeerCred pc;
  if (!peer_cred(fd, pc)) pc = {};
  switch (ipc::check_server(pc, h.pid, static_cast<std::uint32_t>(geteuid()))) {
    case ipc::ServerVerdict::Exporter:
      return true;
    case ipc::ServerVerdict::NotExporter:
      f = {ipc::OpenFailure::NotExporter,
           "pid " + std::to_string(pc.pid) + " (uid " + std::to_string(pc.uid) + ") listens there"};
      return false;
    case ipc::ServerVerdict::OtherUser:
      f = {ipc::OpenFailure::OtherUser, "exporter uid " + std::to_string(pc.uid) +
                                            ", this process uid " + std::to_string(geteuid())};
      return false;
  }
  return false;
}

// The peer's connection (io held): the one kept, when it is still this shim's descriptor (the
// host may have closed or reused the number since), or a new one.
bool connect_peer(Peer &p, const ipc::Handle &h, Failure &f) {
  if (p.fd.still_ours()) return true;
  p.fd.forget();  // not ours any more: the number is the host's, never closed or used
  OwnedFd fd = OwnedFd::adopt(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    f = {ipc::OpenFailure::ProtocolError, errno_text("socket", errno)};
    return false;
  }
  timeval tv{kSendTimeoutMs / 1000, 0};
  setsockopt(fd.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect() too
  sockaddr_un a;
  const socklen_t len = make_addr(a, ipc::socket_name(h.pid, h.tag));
  if (connect(fd.fd, reinterpret_cast<sockaddr *>(&a), len) != 0) {
    const int e = errno;
    fd.close();
    const bool gone = e == ECONNREFUSED || e == ENOENT;
    f = {gone ? ipc::OpenFailure::ExporterGone : ipc::OpenFailure::ProtocolError,
         errno_text("connect", e)};
    if (gone && kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH)
      f.detail += "; no process " + std::to_string(h.pid) + " is running";
    return false;
  }
  if (!check_broker(fd.fd, h, f)) {
    fd.close();
    return false;
  }
  p.fd = fd;
  return true;
}

// Sends a request and reads the reply header (io held). A broker that refuses a connection
// answers before reading anything, so the reply is read even when the send failed.
int rpc(Peer &p, const ipc::Request &req, ipc::Reply &rep, std::string &detail,
        int timeout_ms = kReplyTimeoutMs) {
  if (!p.fd.still_ours()) {
    p.fd.forget();
    detail = "the connection's descriptor was closed or replaced by the program";
    return EBADF;
  }
  const auto b = ipc::encode_request(req);
  const int se = send_msg(p.fd.fd, b.data(), b.size(), nullptr, 0, kSendTimeoutMs);
  Msg m;
  const int re = recv_msg(p.fd.fd, ipc::kReplySize, m, se ? 100 : timeout_ms);
  if (re != 0) {
    detail = re < 0 ? "the broker closed the connection" : errno_text("receiving the reply", re);
    if (se) detail += " (" + errno_text("sending the request", se) + ")";
    return re < 0 ? EPIPE : re;
  }
  const bool fds = !m.fds.empty();
  m.close_fds();
  const ipc::ParseError pe = ipc::parse_reply(m.data, rep);
  if (fds || m.truncated || pe != ipc::ParseError::None) {
    detail = "unexpected reply (" +
             std::string(fds ? "with descriptors" : ipc::parse_error_text(pe)) + ")";
    return EPROTO;
  }
  return 0;
}

int status_for(const Codes &codes, CUresult r) {
  return r == CUDA_ERROR_OUT_OF_MEMORY ? codes.out_of_memory : codes.map_failed;
}

void undo(const std::vector<ipc::PageRange> &mapped, CUdeviceptr va, std::uint64_t span) {
  if (auto unmap = CMG_REAL(cuMemUnmap))
    for (const auto &m : mapped) unmap(m.off, m.size);
  if (auto afree = CMG_REAL(cuMemAddressFree); afree && va) afree(va, span);
}

// Imports one page into the span and makes it accessible from the importer's device.
CUresult map_one(CUdeviceptr at, std::uint64_t size, int fd, int dev,
                 std::vector<ipc::PageRange> &mapped, std::string &where) {
  CMG_REAL_OR(cuMemImportFromShareableHandle, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemMap, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemSetAccess, CUDA_ERROR_NOT_INITIALIZED);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemImportFromShareableHandle_fn(
      &h, reinterpret_cast<void *>(static_cast<std::intptr_t>(fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    where = "cuMemImportFromShareableHandle";
    return r;
  }
  r = cuMemMap_fn(at, size, 0, h, 0);
  // The mapping keeps the memory alive (real-driver.md D13): nothing else to release at close.
  cuMemRelease_fn(h);
  if (r != CUDA_SUCCESS) {
    where = "cuMemMap";
    return r;
  }
  mapped.push_back({at, size});
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = dev;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = cuMemSetAccess_fn(at, size, &d, 1);
  if (r != CUDA_SUCCESS) where = "cuMemSetAccess";
  return r;
}

bool base_taken(std::uint64_t base) {
  std::lock_guard lk(g_imp_mu);
  return g_tables->imports.ptr_taken(base);
}

// Reserves the span; the returned base (span - first_off) must not be another import's.
CUresult reserve_span(const ipc::Layout &l, CUdeviceptr &va) {
  CMG_REAL_OR(cuMemAddressReserve, CUDA_ERROR_NOT_INITIALIZED);
  std::vector<CUdeviceptr> spare;
  CUresult r = CUDA_SUCCESS;
  va = 0;
  for (int attempt = 0; attempt < 4 && !va; ++attempt) {
    CUdeviceptr v = 0;
    r = cuMemAddressReserve_fn(&v, l.span, 0, 0, 0);
    if (r != CUDA_SUCCESS) break;
    const std::uint64_t base = ipc::import_base(v, l);
    if (base != 0 && !base_taken(base))
      va = v;
    else
      spare.push_back(v);  // kept until another range is found, so it is not handed out again
  }
  if (auto afree = CMG_REAL(cuMemAddressFree))
    for (CUdeviceptr v : spare) afree(v, l.span);
  if (!va && r == CUDA_SUCCESS) r = CUDA_ERROR_OUT_OF_MEMORY;
  return r;
}

// ---- one open ----------------------------------------------------------------------------------
// What an open carries from step to step.
struct Attempt {
  const char *api;
  const ipc::Handle &h;
  const Codes &codes;
  int dev = -1;
  ipc::Reply rep;
  ipc::Layout layout;
  CUdeviceptr va = 0;
  std::vector<ipc::PageRange> mapped;
  int status = 0;
  std::optional<Finding> finding;
  bool drop_connection = false;  // the connection is out of step or refused: closed after
  void fail(ipc::OpenFailure why, int st, std::string_view detail) {
    status = st;
    finding = ipc::open_failure_finding(why, api, h, detail);
  }
};

// The reply to the open request, checked. False with a failure set.
bool ask(Peer &p, Attempt &a) {
  ipc::Request req;
  req.op = ipc::Op::Open;
  req.export_id = a.h.export_id;
  req.nonce = a.h.nonce;
  std::string detail;
  if (rpc(p, req, a.rep, detail) != 0) {
    a.drop_connection = true;
    a.fail(ipc::OpenFailure::ProtocolError, a.codes.map_failed, detail);
    return false;
  }
  const ipc::Reply &rep = a.rep;
  switch (rep.status) {
    case ipc::ReplyStatus::Ok:
      break;
    case ipc::ReplyStatus::UnknownExport:
      a.fail(ipc::OpenFailure::UnknownExport, a.codes.invalid_handle, "");
      return false;
    case ipc::ReplyStatus::BadNonce:
      a.drop_connection = true;  // the broker closes the connection too
      a.fail(ipc::OpenFailure::BadNonce, a.codes.invalid_handle, "");
      return false;
    case ipc::ReplyStatus::Denied:
      a.drop_connection = true;
      a.fail(ipc::OpenFailure::OtherUser, a.codes.map_failed, "refused by the exporter's broker");
      return false;
    case ipc::ReplyStatus::ExportFailed:
      a.fail(ipc::OpenFailure::ExportFailed, a.codes.map_failed,
             "exporter's driver: " + cu_text(static_cast<CUresult>(rep.driver_error)));
      return false;
    case ipc::ReplyStatus::Busy:
    case ipc::ReplyStatus::Malformed:
      a.drop_connection = true;
      a.fail(ipc::OpenFailure::ProtocolError, a.codes.map_failed,
             ipc::reply_status_text(rep.status));
      return false;
  }
  if (rep.export_id != a.h.export_id || rep.pages != a.h.pages || rep.span == 0 ||
      rep.first_off > rep.res_size || rep.span > rep.res_size - rep.first_off) {
    a.drop_connection = true;
    a.fail(ipc::OpenFailure::ProtocolError, a.codes.map_failed, "inconsistent reply header");
    return false;
  }
  a.layout = {rep.first_off, rep.span};
  return true;
}

// Checks one chunk's pages against the span (inside it, in order: nothing is ever mapped outside
// the range reserved for it) and maps them while nothing failed. Empty: fine; else why not.
std::string take_chunk(Attempt &a, const Msg &m, const std::vector<ipc::PageRange> &chunk,
                       std::vector<ipc::PageRange> &pages, CUresult &err, std::string &where) {
  const ipc::Layout &l = a.layout;
  for (std::size_t i = 0; i < chunk.size(); ++i) {
    const ipc::PageRange &p = chunk[i];
    const std::uint64_t prev_end =
        pages.empty() ? l.first_off : pages.back().off + pages.back().size;
    if (p.size == 0 || p.off < prev_end || p.off - l.first_off > l.span ||
        p.size > l.span - (p.off - l.first_off))
      return "a page outside the announced span";
    pages.push_back(p);
    if (err == CUDA_SUCCESS)
      err = map_one(a.va + (p.off - l.first_off), p.size, m.fds[i], a.dev, a.mapped, where);
  }
  return {};
}

// Receives every page message (even after a failure, so that the connection stays in step) and
// maps the pages. False with a failure set.
bool receive_pages(Peer &p, Attempt &a) {
  CUresult err = reserve_span(a.layout, a.va);
  std::string where = err != CUDA_SUCCESS ? "cuMemAddressReserve of the span" : "";
  std::vector<ipc::PageRange> pages;
  std::string broken;
  while (pages.size() < a.rep.pages && broken.empty()) {
    Msg m;
    const int re = recv_msg(p.fd.fd, ipc::kChunkMax, m, kReplyTimeoutMs);
    std::uint32_t first = 0;
    std::vector<ipc::PageRange> chunk;
    if (re != 0)
      broken = re < 0 ? "the broker closed the connection" : errno_text("receiving pages", re);
    else if (m.truncated || ipc::parse_chunk(m.data, first, chunk) != ipc::ParseError::None ||
             first != pages.size() || chunk.size() != m.fds.size() ||
             chunk.size() > a.rep.pages - pages.size())
      broken = "malformed page message";
    else
      broken = take_chunk(a, m, chunk, pages, err, where);
    m.close_fds();
  }
  if (broken.empty() && err == CUDA_SUCCESS) return true;
  undo(a.mapped, a.va, a.layout.span);
  a.mapped.clear();
  if (!broken.empty()) {
    a.drop_connection = true;
    a.fail(ipc::OpenFailure::ProtocolError, a.codes.map_failed, broken);
    return false;
  }
  // The broker counted this open: take it back (or drop the connection, which does the same).
  ipc::Request rel;
  rel.op = ipc::Op::Release;
  rel.export_id = a.h.export_id;
  ipc::Reply ignored;
  std::string d;
  if (rpc(p, rel, ignored, d) != 0) a.drop_connection = true;
  a.fail(ipc::OpenFailure::ImportFailed, status_for(a.codes, err), where + ": " + cu_text(err));
  return false;
}

Opened fill(const ipc::Import &imp, int success) {
  Opened o;
  o.status = success;
  o.ptr = imp.ptr;
  o.span_va = imp.span_va;
  o.span = imp.span;
  o.bytes = imp.bytes;
  o.pages = static_cast<std::uint32_t>(imp.maps.size());
  o.refs = imp.refs;
  o.dev = imp.dev;
  return o;
}

// Legacy IPC semantics (real-driver.md section 2): the same export opened again gives the same
// pointer and needs one more close. Returns it, or nullopt after claiming the open (`opening`).
std::optional<Opened> reopen_or_claim(const ipc::ImportKey &key, int success) {
  std::unique_lock lk(g_imp_mu);
  for (;;) {
    if (ipc::Import *imp = g_tables->imports.find(key)) {
      ++imp->refs;
      return fill(*imp, success);
    }
    if (!g_tables->opening.count(key)) break;
    g_tables->opened.wait(lk);  // another thread is opening it: the same pointer, once
  }
  g_tables->opening.insert(key);
  return std::nullopt;
}

// The end of a claimed open: the import added (on success) and the claim given up.
Opened settle(const ipc::ImportKey &key, Attempt &a, const EventRef &ev) {
  std::lock_guard lk(g_imp_mu);
  g_tables->opening.erase(key);
  g_tables->opened.notify_all();
  if (a.finding) {
    Opened o;
    o.status = a.status;
    o.finding = std::move(a.finding);
    return o;
  }
  ipc::Import imp;
  imp.key = key;
  imp.ptr = ipc::import_base(a.va, a.layout);
  imp.span_va = a.va;
  imp.span = a.layout.span;
  imp.bytes = a.rep.bytes;
  imp.maps = std::move(a.mapped);
  imp.refs = 1;
  imp.dev = a.dev;
  imp.opened = ev;
  return fill(g_tables->imports.add(std::move(imp)), a.codes.success);
}

}  // namespace

Opened open(const char *api, const ipc::Handle &h, const Codes &codes, bool runtime,
            const EventRef &ev) {
  Attempt a{api, h, codes};
  if (h.pid == static_cast<std::uint32_t>(getpid())) {
    a.fail(ipc::OpenFailure::SameProcess, codes.invalid_context, "");
    return Opened{a.status, std::move(a.finding)};
  }
  const ipc::ImportKey key{h.pid, h.tag, h.export_id};
  if (auto again = reopen_or_claim(key, codes.success)) return *again;
  a.dev = current_device();
  if (a.dev < 0 && runtime) {
    // cudart creates the primary context at its first call; so does this one.
    if (auto init = CMG_REAL(cudaFree)) init(nullptr);
    a.dev = current_device();
  }
  if (a.dev < 0) {
    a.fail(ipc::OpenFailure::NoContext, codes.invalid_context, "");
    return settle(key, a, ev);
  }
  const PeerKey pk{h.pid, h.tag};
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lk(g_imp_mu);
    peer = peer_for(pk);
  }
  {
    std::lock_guard io(peer->io);
    Failure f;
    if (!connect_peer(*peer, h, f))
      a.fail(f.why, codes.map_failed, f.detail);
    else if (ask(*peer, a))
      receive_pages(*peer, a);
    if (a.drop_connection) peer->fd.close();
  }
  Opened o = settle(key, a, ev);
  if (o.finding) {
    std::lock_guard io(peer->io);
    close_if_unused(pk, *peer);
  }
  return o;
}

Closed close(std::uint64_t ptr, const Codes &codes) {
  Closed c;
  std::optional<ipc::Import> imp;
  std::shared_ptr<Peer> peer;
  {
    std::lock_guard lk(g_imp_mu);
    imp = g_tables->imports.close(ptr);
    if (!imp) return c;
    c.ours = true;
    c.status = codes.success;
    c.refs_left = imp->refs;
    c.bytes = imp->bytes;
    c.dev = imp->dev;
    if (imp->refs) return c;
    peer = peer_for({imp->key.pid, imp->key.tag});
  }
  CUresult worst = CUDA_SUCCESS;
  if (auto unmap = CMG_REAL(cuMemUnmap))
    for (const auto &m : imp->maps)
      if (CUresult r = unmap(m.off, m.size); r != CUDA_SUCCESS && worst == CUDA_SUCCESS) worst = r;
  if (auto afree = CMG_REAL(cuMemAddressFree))
    if (CUresult r = afree(imp->span_va, imp->span); r != CUDA_SUCCESS && worst == CUDA_SUCCESS)
      worst = r;
  // The release is answered before the close returns: an exporter told "closed" by the importer
  // and freeing its memory then must not be reported as freeing memory still open (P16). Closing
  // the connection would release it too, but the broker learns that only later.
  {
    std::lock_guard io(peer->io);
    if (peer->fd.valid()) {
      ipc::Request rel;
      rel.op = ipc::Op::Release;
      rel.export_id = imp->key.export_id;
      ipc::Reply ignored;
      std::string d;
      if (rpc(*peer, rel, ignored, d, kReleaseTimeoutMs) != 0) peer->fd.close();
    }
    close_if_unused({imp->key.pid, imp->key.tag}, *peer);
  }
  if (worst != CUDA_SUCCESS) {
    note(LogLevel::Warn, "ipc bridge: closing the import at " + hex(ptr) + ": " + cu_text(worst));
    c.status = codes.invalid_value;
  }
  return c;
}

void import_fork_prepare() { g_imp_mu.lock(); }
void import_fork_parent() { g_imp_mu.unlock(); }

void import_fork_child() {
  g_imp_mu.unlock();
  // The child owns none of the parent's imports or connections; only the descriptors still the
  // shim's are closed. (A connection's lock another thread held at the fork goes with its entry.)
  for (auto &[k, p] : g_tables->peers) p->fd.close();
  g_tables->peers.clear();
  g_tables->imports.clear();
  g_tables->opening.clear();
  new (&g_tables->opened) std::condition_variable();  // waiters of the parent are not here
}

}  // namespace cmg::shim::bridge
