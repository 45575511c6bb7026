// SPDX-License-Identifier: Apache-2.0
// The bridge's exporter side (docs/ipc-bridge.md): the export table, the broker thread that serves
// opens over an abstract Unix socket, and its driver calls. The broker owns its descriptors
// robustly (owned_fd.h): they sit above the host's range, and each is checked before every poll;
// when the host closed or replaced one (close_range before a daemon's fork, dup2 over it) the
// broker stops, never accepting on or answering through a descriptor that is the host's now.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <new>

#include "bridge.h"
#include "bridge_io.h"
#include "clock.h"
#include "lock_within.h"
#include "owned_fd.h"
#include "state.h"
#include "summary.h"
#include "textbuf.h"
#include "threads.h"

namespace cmg::shim::bridge {
namespace {

constexpr std::size_t kMaxConns = 256;
constexpr std::uint64_t kLoudRefusals = 8;  // refusals noted one by one; later ones are counted
constexpr std::uint64_t kRefusalNoteNs = 1'000'000'000;  // then one note a second at most

// ---- the broker's state ----------------------------------------------------------------------
struct Broker {
  MarkedMutex mu;   // the fields below; never held across socket I/O or a driver call
  pid_t owner = 0;  // the process this broker serves (0: none; a forked child has none)
  std::uint64_t tag = 0;
  uid_t uid = 0;  // the effective user it was started for: it serves that user only, ever
  // The listening socket and a pipe that wakes the thread (a pipe rather than an eventfd: every
  // eventfd shares one inode, so identity could not tell ours from the host's).
  OwnedFd listen, wake_r, wake_w;
  std::vector<OwnedFd> conns;  // accepted connections, closed by a forked child
  bool atexit_registered = false;
};
Broker &broker() {
  static auto *b = new Broker;  // leaked: used until exit
  return *b;
}
std::atomic<bool> g_stop{false};     // exit began: serve nothing more
std::atomic<bool> g_serving{false};  // the broker is inside the driver for a request
std::atomic<bool> g_thread_done{false};

// ---- refusals: each of the first eight is a note; then they are counted, one note a second at
// most (another user's connect loop made millions of lines and halved the host's throughput)
struct Refusals {
  MarkedMutex mu;  // its holder is known (exit paths, lock_within.h)
  std::uint64_t total = 0, unsaid = 0, last_note_ns = 0;
  std::string last;  // the last refusal not said yet
};
Refusals &refusals() {
  static auto *r = new Refusals;
  return *r;
}

std::string counted(const Refusals &r) {
  return std::to_string(r.unsaid) + " more connections refused (" + std::to_string(r.total) +
         " in all; the last: " + r.last + ")";
}

void refusal(const std::string &msg) {
  Refusals &r = refusals();
  std::string say;
  LogLevel level = LogLevel::Warn;
  {
    std::lock_guard lk(r.mu);
    const std::uint64_t now = mono_ns();
    if (++r.total <= kLoudRefusals) {
      say = msg;
      if (r.total == kLoudRefusals) {
        say += "; further refusals are counted, in one note a second at most";
        r.last_note_ns = now;
      }
    } else {
      ++r.unsaid;
      r.last = msg;
      if (now - r.last_note_ns >= kRefusalNoteNs) {
        say = counted(r);
        level = LogLevel::Info;
        r.unsaid = 0;
        r.last_note_ns = now;
      }
    }
  }
  if (!say.empty()) note(level, "ipc bridge: " + say);
}

// At exit: the refusals counted since the last note, said from a stack buffer (the exit path
// allocates nothing).
void say_refusals_at_exit() {
  Refusals &r = refusals();
  if (!lock_within(r.mu)) return;
  char say[1024];
  TextBuf t(say, sizeof say);
  if (r.unsaid)
    t.s("ipc bridge: ").u(r.unsaid).s(" more connections refused (").u(r.total)
        .s(" in all; the last: ").s(r.last).s(")");
  r.unsaid = 0;
  r.mu.unlock();
  if (t.size()) note(LogLevel::Warn, t.view());
}

void uid_changed(uid_t was, uid_t now) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  note(LogLevel::Warn, "ipc bridge: this process changed its effective user from uid " +
                           std::to_string(was) + " to uid " + std::to_string(now) +
                           " after its broker started; the broker refuses every connection from "
                           "now on (memory exported as one user is never handed to another)");
}

// ---- answers ---------------------------------------------------------------------------------
struct Conn {
  OwnedFd fd;
  std::uint64_t id = 0;
  ipc::PeerCred cred;
};

void send_status(int fd, ipc::ReplyStatus st, std::uint64_t id = 0,
                 std::uint32_t driver_error = 0) {
  ipc::Reply r;
  r.status = st;
  r.export_id = id;
  r.driver_error = driver_error;
  const auto b = ipc::encode_reply(r);
  send_msg(fd, b.data(), b.size(), nullptr, 0, kSendTimeoutMs);
}

// Refuses a connection: the answer, then close. Whatever the client sent already is read first: a
// Unix socket closed with unread data resets its peer, which would then never read the answer.
void refuse(int fd, ipc::ReplyStatus st) {
  send_status(fd, st);
  char sink[256];
  for (int i = 0; i < 64 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  ::close(fd);
}

// ---- serving -----------------------------------------------------------------------------------
// The reply header, then the page messages with their descriptors. Returns 0 or an errno value.
int send_export(int fd, const ipc::Export &e, const std::vector<int> &fds) {
  std::vector<ipc::PageRange> pages;
  for (const auto &p : e.pages) pages.push_back({p.off, p.size});
  const ipc::Layout l = ipc::layout_for(pages);
  ipc::Reply rep;
  rep.export_id = e.id;
  rep.res_base = e.res_base;
  rep.res_size = e.res_size;
  rep.pages = static_cast<std::uint32_t>(pages.size());
  rep.bytes = e.bytes();
  rep.first_off = l.first_off;
  rep.span = l.span;
  const auto head = ipc::encode_reply(rep);
  int err = send_msg(fd, head.data(), head.size(), nullptr, 0, kSendTimeoutMs);
  for (std::size_t i = 0; !err && i < pages.size(); i += ipc::kPagesPerChunk) {
    const std::size_t n = std::min(ipc::kPagesPerChunk, pages.size() - i);
    const auto chunk = ipc::encode_chunk(static_cast<std::uint32_t>(i),
                                         std::span<const ipc::PageRange>(pages).subspan(i, n));
    err = send_msg(fd, chunk.data(), chunk.size(), fds.data() + i, n, kSendTimeoutMs);
  }
  return err;
}

// Serves one open. Returns false when the connection must be dropped.
bool serve_open(const Conn &c, const ipc::Request &req) {
  ipc::Export e;
  const auto found = exports().lookup(req.export_id, req.nonce, &e);
  // A peer under the shim asked for it: the export is not one-sided, whatever the answer.
  if (found == ipc::ExportTable::Lookup::Ok || found == ipc::ExportTable::Lookup::Dying)
    exports().note_request(req.export_id);
  switch (found) {
    case ipc::ExportTable::Lookup::Unknown:
    case ipc::ExportTable::Lookup::Dying:
      send_status(c.fd.fd, ipc::ReplyStatus::UnknownExport, req.export_id);
      return true;
    case ipc::ExportTable::Lookup::BadNonce:
      send_status(c.fd.fd, ipc::ReplyStatus::BadNonce, req.export_id);
      refusal("pid " + std::to_string(c.cred.pid) + " asked for export " +
              std::to_string(req.export_id) + " with a wrong nonce; connection closed");
      return false;
    case ipc::ExportTable::Lookup::Ok:
      break;
  }
  std::vector<int> fds;
  g_serving.store(true);
  CUresult r = g_stop.load() ? CUDA_ERROR_DEINITIALIZED : export_fds(e, fds);
  g_serving.store(false);
  if (r != CUDA_SUCCESS) {
    send_status(c.fd.fd, ipc::ReplyStatus::ExportFailed, e.id, static_cast<std::uint32_t>(r));
    refusal("export " + std::to_string(e.id) + " could not be exported for pid " +
            std::to_string(c.cred.pid) + ": " + cu_text(r));
    return true;
  }
  // Counted before sending: an unmap that begins now reports this importer (free-exported).
  int err = 0;
  if (!exports().commit_open(e.id, c.id))
    send_status(c.fd.fd, ipc::ReplyStatus::UnknownExport, e.id);
  else
    err = send_export(c.fd.fd, e, fds);
  for (int f : fds) ::close(f);
  if (err) {
    exports().release(e.id, c.id);
    refusal("sending export " + std::to_string(e.id) + " to pid " + std::to_string(c.cred.pid) +
            " failed: " + std::strerror(err));
    return false;
  }
  note(LogLevel::Info, "ipc bridge: export " + std::to_string(e.id) + " (" +
                           std::to_string(e.pages.size()) + " page(s), " +
                           std::to_string(e.bytes()) + " bytes) opened by pid " +
                           std::to_string(c.cred.pid));
  return true;
}

// One readable connection. Returns false when it must be dropped.
bool serve(const Conn &c, uid_t uid) {
  Msg m;
  const int r = recv_msg(c.fd.fd, ipc::kRequestSize, m, 0);
  if (r == ETIMEDOUT) return true;  // spurious wake-up
  if (r != 0) return false;         // closed by the importer (its imports are released), or error
  ipc::Request req;
  const ipc::ParseError pe = m.truncated ? ipc::ParseError::Size : ipc::parse_request(m.data, req);
  const bool had_fds = !m.fds.empty();
  m.close_fds();
  if (geteuid() != uid) {  // the process changed its user since the connection was accepted
    uid_changed(uid, geteuid());
    send_status(c.fd.fd, ipc::ReplyStatus::Denied);
    return false;
  }
  if (had_fds || pe != ipc::ParseError::None) {
    send_status(c.fd.fd, ipc::ReplyStatus::Malformed);
    refusal(had_fds ? "pid " + std::to_string(c.cred.pid) +
                          " sent file descriptors; connection closed"
                    : "malformed request from pid " + std::to_string(c.cred.pid) + " (" +
                          std::string(ipc::parse_error_text(pe)) + "); connection closed");
    return false;
  }
  if (req.op == ipc::Op::Release) {
    exports().release(req.export_id, c.id);
    send_status(c.fd.fd, ipc::ReplyStatus::Ok, req.export_id);
    return true;
  }
  return serve_open(c, req);
}

void drop(const Conn &c) {
  exports().drop_connection(c.id);
  Broker &b = broker();
  {
    std::lock_guard lk(b.mu);
    std::erase_if(b.conns, [&](const OwnedFd &f) { return f.fd == c.fd.fd; });
  }
  OwnedFd fd = c.fd;
  fd.close();  // only if it is still ours
}

// Whether a connecting peer may have this broker's memory: an empty `why` admits it.
struct Admission {
  ipc::ReplyStatus status = ipc::ReplyStatus::Denied;
  std::string why;
};
Admission admit(const ipc::PeerCred &pc, uid_t uid, std::size_t open) {
  const std::string who = "refused a connection from pid " + std::to_string(pc.pid) + " (uid " +
                          std::to_string(pc.uid) + "): ";
  const uid_t self = geteuid();
  if (self != uid) {
    uid_changed(uid, self);
    return {ipc::ReplyStatus::Denied, who + "this process changed its user from uid " +
                                          std::to_string(uid) + " to uid " + std::to_string(self)};
  }
  if (ipc::check_peer(pc, static_cast<std::uint32_t>(uid)) != ipc::PeerVerdict::Allowed)
    return {ipc::ReplyStatus::Denied,
            who + "not this process's user (uid " + std::to_string(uid) + ")"};
  if (open >= kMaxConns)
    return {ipc::ReplyStatus::Busy, who + std::to_string(kMaxConns) + " connections are open"};
  return {ipc::ReplyStatus::Ok, {}};
}

void accept_all(int ls, uid_t uid, std::vector<Conn> &conns, std::uint64_t &next_id) {
  for (;;) {
    int raw = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (raw < 0) return;
    ipc::PeerCred pc;
    if (!peer_cred(raw, pc)) {  // not a Unix socket's peer: nothing of ours
      ::close(raw);
      continue;
    }
    const Admission a = admit(pc, uid, conns.size());
    if (!a.why.empty()) {
      // Recorded before the answer, so that the refusal is in the log once the client knows.
      refusal(a.why);
      refuse(raw, a.status);
      continue;
    }
    Conn c{OwnedFd::adopt(raw), next_id++, pc};
    if (!c.fd.valid()) continue;
    {
      Broker &b = broker();
      std::lock_guard lk(b.mu);
      b.conns.push_back(c.fd);
    }
    conns.push_back(c);
  }
}

// ---- the thread
// ----------------------------------------------------------------------------------
struct Own {
  OwnedFd listen, wake_r, wake_w;
  std::uint64_t tag = 0;
  uid_t uid = 0;
  bool all_ours() const {
    return listen.still_ours() && wake_r.still_ours() && wake_w.still_ours();
  }
};

// One wait and what it brought: go on, stop (exit began, or poll failed), or lost (the listening
// socket or the wake pipe reported an error or hang-up: closed under the broker, whether or not
// the number was reused by then; going on would wake at once, again and again).
enum class Round : std::uint8_t { Go, Stop, Lost };
Round serve_round(const Own &o, std::vector<Conn> &conns, std::uint64_t &next_id,
                  std::vector<pollfd> &pfds) {
  pfds.clear();
  pfds.push_back({o.wake_r.fd, POLLIN, 0});
  pfds.push_back({o.listen.fd, POLLIN, 0});
  for (const Conn &c : conns) pfds.push_back({c.fd.fd, POLLIN, 0});
  if (poll(pfds.data(), pfds.size(), -1) < 0) return errno == EINTR ? Round::Go : Round::Stop;
  if (g_stop.load()) return Round::Stop;
  constexpr short kBad = POLLERR | POLLHUP | POLLNVAL;
  if ((pfds[0].revents | pfds[1].revents) & kBad) return Round::Lost;
  // Connections first (their indexes match pfds), then new ones.
  std::vector<Conn> keep;
  for (std::size_t i = 0; i < conns.size(); ++i) {
    const short ev = pfds[i + 2].revents;
    if (!ev || (!(ev & (POLLERR | POLLNVAL)) && serve(conns[i], o.uid)))
      keep.push_back(conns[i]);
    else
      drop(conns[i]);
  }
  conns.swap(keep);
  if (pfds[1].revents & POLLIN) accept_all(o.listen.fd, o.uid, conns, next_id);
  return Round::Go;
}

// The host closed or replaced one of the broker's descriptors: what is still ours is closed, the
// rest forgotten, and the next export starts a new broker (with a new address).
void stop_lost(Own &o) {
  Broker &b = broker();
  {
    std::lock_guard lk(b.mu);
    if (b.tag == o.tag) {
      b.owner = 0;
      b.tag = 0;
      b.listen = b.wake_r = b.wake_w = OwnedFd{};
    }
  }
  const int lost = !o.listen.still_ours() ? o.listen.fd
                   : !o.wake_w.still_ours() ? o.wake_w.fd
                                            : o.wake_r.fd;
  o.listen.close();
  o.wake_r.close();
  o.wake_w.close();
  note(LogLevel::Warn, "ipc bridge: the program closed or replaced the broker's descriptors (" +
                           std::to_string(lost) + " among them); the broker stopped: handles "
                           "exported so far no longer open, and the next export starts a new "
                           "broker");
}

void *broker_main(void *) {
  // Nothing this thread does is a call of the program: any wrapper it reached would only forward.
  ReentryGuard guard;
  Own o;
  {
    Broker &b = broker();
    std::lock_guard lk(b.mu);
    o = Own{b.listen, b.wake_r, b.wake_w, b.tag, b.uid};
  }
  std::vector<Conn> conns;
  std::vector<pollfd> pfds;
  std::uint64_t next_id = 1;
  bool lost = false;
  while (!g_stop.load()) {
    // Before every wait: each descriptor is still the one the broker opened.
    if (!o.all_ours()) {
      lost = true;
      break;
    }
    std::erase_if(conns, [](const Conn &c) {
      if (c.fd.still_ours()) return false;
      exports().drop_connection(c.id);  // the number is the host's now: forgotten, not closed
      return true;
    });
    const Round r = serve_round(o, conns, next_id, pfds);
    if (r == Round::Stop) break;
    if (r == Round::Lost) {
      lost = true;
      break;
    }
  }
  for (const Conn &c : conns) drop(c);
  if (lost) stop_lost(o);
  g_thread_done.store(true);
  return nullptr;
}

// Runs from exit() before the ELF destructors (libcuda's included): the broker stops serving and
// a request inside the driver is given a moment to leave it. The thread is detached and never
// keeps the process alive.
void stop_at_exit() {
  exit_begun();
  Broker &b = broker();
  if (!lock_within(b.mu)) return;
  OwnedFd wk = b.wake_w;
  const bool ours = b.owner == getpid() && wk.valid();
  b.mu.unlock();
  say_refusals_at_exit();
  if (!ours) return;
  g_stop.store(true);
  if (wk.still_ours()) {
    ssize_t n = ::write(wk.fd, "x", 1);
    (void)n;
  }
  for (int i = 0; i < 500 && g_serving.load() && !g_thread_done.load(); ++i) {
    timespec ms{0, 1000000};
    nanosleep(&ms, nullptr);
  }
}

bool open_broker_fds(std::uint64_t tag, Own &o, std::string &err) {
  OwnedFd ls = OwnedFd::adopt(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!ls.valid()) {
    err = errno_text("socket", errno);
    return false;
  }
  sockaddr_un a;
  const socklen_t len = make_addr(a, ipc::socket_name(static_cast<std::uint32_t>(getpid()), tag));
  if (bind(ls.fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(ls.fd, 64) != 0) {
    err = errno_text("bind/listen on the abstract socket", errno);
    ls.close();
    return false;
  }
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    err = errno_text("pipe", errno);
    ls.close();
    return false;
  }
  o.listen = ls;
  o.wake_r = OwnedFd::adopt(p[0]);
  o.wake_w = OwnedFd::adopt(p[1]);
  o.tag = tag;
  return true;
}

// Every signal blocked in the broker: the program's handlers run on the program's threads.
int spawn_broker() { return start_detached_quiet(broker_main, nullptr, "cmg-ipc-broker"); }

// The broker of this process, started on the first export. Returns its tag, 0 on failure.
std::uint64_t start_broker(std::string &err) {
  Broker &b = broker();
  std::lock_guard lk(b.mu);
  if (b.owner == getpid() && b.tag) {
    if (b.uid == geteuid()) return b.tag;
    err = "this process changed its user from uid " + std::to_string(b.uid) + " to uid " +
          std::to_string(geteuid()) + " after its broker started";
    return 0;
  }
  std::uint64_t tag = 0;
  while (!tag)
    if (!random_bytes(reinterpret_cast<std::uint8_t *>(&tag), sizeof tag)) {
      err = "no random bytes (getrandom and /dev/urandom failed)";
      return 0;
    }
  Own o;
  if (!open_broker_fds(tag, o, err)) return 0;
  g_stop.store(false);
  g_thread_done.store(false);
  b.listen = o.listen;
  b.wake_r = o.wake_r;
  b.wake_w = o.wake_w;
  b.uid = geteuid();
  b.tag = tag;  // before the thread reads it
  if (const int rc = spawn_broker(); rc != 0) {
    err = errno_text("pthread_create", rc);
    o.listen.close();
    o.wake_r.close();
    o.wake_w.close();
    b.listen = b.wake_r = b.wake_w = OwnedFd{};
    b.tag = 0;
    return 0;
  }
  b.owner = getpid();
  if (!b.atexit_registered) {
    b.atexit_registered = true;  // inherited by forked children, which check owner
    atexit(stop_at_exit);
  }
  return tag;
}

}  // namespace

ipc::ExportTable &exports() {
  static auto *t = new ipc::ExportTable;  // leaked: used until exit
  return *t;
}

Exported export_pages(std::uint64_t res_base, std::uint64_t res_size,
                      const std::vector<ipc::ExportPage> &pages, int dev, const EventRef &made) {
  Exported x;
  std::string err;
  const std::uint64_t tag = start_broker(err);
  if (!tag) {
    x.blocker = "its broker could not start (" + err + ")";
    return x;
  }
  auto m = exports().find_or_add(res_base, res_size, pages, made, dev, random_bytes);
  if (!m) {
    x.blocker = "no random bytes for the export's nonce (getrandom and /dev/urandom failed)";
    return x;
  }
  ipc::Handle h;
  h.pid = static_cast<std::uint32_t>(getpid());
  h.tag = tag;
  h.export_id = m->id;
  h.nonce = m->nonce;
  h.res_base = res_base;
  h.pages = static_cast<std::uint32_t>(pages.size());
  x.handle = ipc::encode_handle(h);
  x.ok = true;
  x.id = m->id;
  x.reused = m->reused;
  for (const auto &p : pages) x.bytes += p.size;
  return x;
}

void broker_fork_prepare() {
  broker().mu.lock();
  exports().fork_prepare();
}

void broker_fork_parent() {
  exports().fork_parent();
  broker().mu.unlock();
}

void broker_fork_child() {
  exports().fork_child();
  Broker &b = broker();
  b.mu.unlock();
  // The broker thread does not exist here; its sockets would keep the parent's address reachable
  // through this process. Only what is still the shim's is closed.
  b.listen.close();
  b.wake_r.close();
  b.wake_w.close();
  for (OwnedFd &fd : b.conns) fd.close();
  b.conns.clear();
  b.owner = 0;
  b.tag = 0;
  g_stop.store(false);
  g_serving.store(false);
  g_thread_done.store(false);
  Refusals &r = refusals();  // its lock may have been held by the parent's broker thread
  r.mu.reset_in_child();
  r.total = r.unsaid = r.last_note_ns = 0;
  r.last.clear();
}

}  // namespace cmg::shim::bridge
