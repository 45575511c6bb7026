// SPDX-License-Identifier: Apache-2.0
// The legacy-IPC bridge: the exporter's broker thread and the importer's client (see bridge.h and
// docs/ipc-bridge.md). Descriptors travel over a Unix socket with SCM_RIGHTS, so no ptrace right is
// needed (pidfd_getfd is refused in many containers: bug-patterns.md P13).
#include "bridge.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "diag.h"
#include "loader.h"
#include "state.h"

namespace cmg::shim::bridge {
namespace {

static_assert(ipc::kTypePosixFd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
static_assert(ipc::kTypeWin32 == CU_MEM_HANDLE_TYPE_WIN32);
static_assert(ipc::kTypeWin32Kmt == CU_MEM_HANDLE_TYPE_WIN32_KMT);
static_assert(ipc::kTypeFabric == CU_MEM_HANDLE_TYPE_FABRIC);
static_assert(ipc::kHandleSize == sizeof(CUipcMemHandle) &&
              ipc::kHandleSize == sizeof(cudaIpcMemHandle_t));

constexpr int kReplyTimeoutMs = 30000;   // an importer waits this long for each broker message
constexpr int kSendTimeoutMs = 5000;     // the broker gives a slow importer this long per message
constexpr int kReleaseTimeoutMs = 2000;  // a close waits this long for the broker to count it
constexpr std::size_t kMaxConns = 256;
constexpr int kLoudWarnings = 8;  // broker refusals printed; later ones go to the log only

// ---- small helpers ----------------------------------------------------------------------------
std::string errno_text(const char *what, int e) {
  return std::string(what) + ": " + std::strerror(e);
}

// Driver functions the shim does not wrap, each with a single ABI variant.
template <class F>
F unwrapped(std::atomic<void *> &slot, const char *name) {
  void *p = slot.load(std::memory_order_acquire);
  if (!p) {
    void *h = libcuda_handle();
    p = h ? real_dlsym(h, name) : nullptr;
    if (p) slot.store(p, std::memory_order_release);
  }
  return reinterpret_cast<F>(p);
}
std::atomic<void *> g_dev_attr{nullptr}, g_err_name{nullptr}, g_prim_retain{nullptr},
    g_prim_release{nullptr}, g_ctx_set{nullptr};

std::string cu_text(CUresult r) {
  const char *s = nullptr;
  auto f = unwrapped<PFN_cuGetErrorName_v6000>(g_err_name, "cuGetErrorName");
  if (f && f(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

#define CMG_REAL_OR(name, err)     \
  auto name##_fn = CMG_REAL(name); \
  if (!name##_fn) return (err)

bool random_bytes(std::uint8_t *p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  if (got == n) return true;
  // getrandom(2) can be filtered by seccomp; the device gives the same bytes.
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return got == n;
}

socklen_t make_addr(sockaddr_un &a, const std::string &name) {
  std::memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof a.sun_path);
  std::memcpy(a.sun_path, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
}

int remaining_ms(const timespec &deadline) {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long ms =
      (deadline.tv_sec - now.tv_sec) * 1000LL + (deadline.tv_nsec - now.tv_nsec) / 1000000;
  return ms < 0 ? 0 : static_cast<int>(ms);
}

timespec deadline_in(int ms) {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += static_cast<long>(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    ++t.tv_sec;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

// One SOCK_SEQPACKET message, with descriptors. Returns 0 or an errno value. Never raises SIGPIPE.
int send_msg(int fd, const void *data, std::size_t len, const int *fds, std::size_t nfds,
             int timeout_ms) {
  iovec iov{const_cast<void *>(data), len};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * ipc::kPagesPerChunk)];
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (nfds) {
    if (nfds > ipc::kPagesPerChunk) return EINVAL;
    std::memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  const timespec deadline = deadline_in(timeout_ms);
  for (;;) {
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r == static_cast<ssize_t>(len)) return 0;
    if (r >= 0) return EMSGSIZE;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    const int left = remaining_ms(deadline);
    if (left <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, left);
  }
}

struct Msg {
  std::vector<std::uint8_t> data;
  std::vector<int> fds;
  bool truncated = false;  // longer than expected, or descriptors cut off
  void close_fds() {
    for (int f : fds) ::close(f);
    fds.clear();
  }
};

// Receives one message of at most `max` bytes. Returns 0, -1 at end of stream, or an errno value
// (ETIMEDOUT after timeout_ms; 0 = do not wait). Descriptors are received close-on-exec.
int recv_msg(int fd, std::size_t max, Msg &out, int timeout_ms) {
  out = Msg{};
  out.data.assign(max, 0);
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 253)];
  const timespec deadline = deadline_in(timeout_ms);
  for (;;) {
    iovec iov{out.data.data(), out.data.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      const int left = remaining_ms(deadline);
      if (left <= 0) return ETIMEDOUT;
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, left);
      continue;
    }
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
        out.fds.push_back(f);
      }
    }
    out.truncated = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
    out.data.resize(static_cast<std::size_t>(r));
    if (r == 0 && out.fds.empty()) return -1;
    return 0;
  }
}

// ---- the broker (exporter side) -------------------------------------------------------------
struct Broker {
  std::mutex mu;    // the fields below; never held across socket I/O or a driver call
  pid_t owner = 0;  // the process this broker serves (0: none; a forked child has none)
  std::uint64_t tag = 0;
  int listen_fd = -1, wake_fd = -1;
  std::vector<int> conn_fds;  // closed by a forked child
  bool atexit_registered = false;
};
Broker &broker() {
  static auto *b = new Broker;  // leaked: used until exit
  return *b;
}
std::atomic<bool> g_stop{false};     // exit began: serve nothing more
std::atomic<bool> g_serving{false};  // the broker is inside the driver for a request
std::atomic<bool> g_thread_done{false};
std::atomic<int> g_refusals{0};

void refusal(const std::string &msg) {
  const int n = g_refusals.fetch_add(1, std::memory_order_relaxed);
  note(n < kLoudWarnings ? LogLevel::Warn : LogLevel::Info, "ipc bridge: " + msg);
}

struct Conn {
  int fd = -1;
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

CUresult export_one(std::uint64_t va, int &fd) {
  CMG_REAL_OR(cuMemRetainAllocationHandle, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemExportToShareableHandle, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
  // A handle from the address, not the program's: the program may have released its own already
  // (the mapping keeps the memory, D13), and this reference is ours to drop.
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemRetainAllocationHandle_fn(&h, reinterpret_cast<void *>(va));
  if (r != CUDA_SUCCESS) return r;
  r = cuMemExportToShareableHandle_fn(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cuMemRelease_fn(h);
  return r;
}

// The descriptors of every page, in order. VMM calls work on threads without a context on the
// H200 (bug-patterns.md P10, P27); should a driver ask for one, the broker borrows the device's
// primary context for this request.
CUresult export_fds(const ipc::Export &e, std::vector<int> &fds) {
  int borrowed = -1;
  CUresult r = CUDA_SUCCESS;
  for (const ipc::ExportPage &p : e.pages) {
    int fd = -1;
    r = export_one(e.res_base + p.off, fd);
    if (r == CUDA_ERROR_INVALID_CONTEXT && borrowed < 0 && e.dev >= 0) {
      auto retain =
          unwrapped<PFN_cuDevicePrimaryCtxRetain_v7000>(g_prim_retain, "cuDevicePrimaryCtxRetain");
      auto set = unwrapped<PFN_cuCtxSetCurrent_v4000>(g_ctx_set, "cuCtxSetCurrent");
      CUcontext ctx = nullptr;
      if (retain && set && retain(&ctx, e.dev) == CUDA_SUCCESS) {
        borrowed = e.dev;
        set(ctx);
        r = export_one(e.res_base + p.off, fd);
      }
    }
    if (r != CUDA_SUCCESS) break;
    fds.push_back(fd);
  }
  if (borrowed >= 0) {
    if (auto set = unwrapped<PFN_cuCtxSetCurrent_v4000>(g_ctx_set, "cuCtxSetCurrent")) set(nullptr);
    if (auto rel = unwrapped<PFN_cuDevicePrimaryCtxRelease_v11000>(g_prim_release,
                                                                   "cuDevicePrimaryCtxRelease_v2"))
      rel(borrowed);
  }
  if (r != CUDA_SUCCESS) {
    for (int f : fds) ::close(f);
    fds.clear();
  }
  return r;
}

// Serves one open. Returns false when the connection must be dropped.
bool serve_open(const Conn &c, const ipc::Request &req) {
  ipc::Export e;
  switch (exports().lookup(req.export_id, req.nonce, &e)) {
    case ipc::ExportTable::Lookup::Unknown:
    case ipc::ExportTable::Lookup::Dying:
      send_status(c.fd, ipc::ReplyStatus::UnknownExport, req.export_id);
      return true;
    case ipc::ExportTable::Lookup::BadNonce:
      send_status(c.fd, ipc::ReplyStatus::BadNonce, req.export_id);
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
    send_status(c.fd, ipc::ReplyStatus::ExportFailed, e.id, static_cast<std::uint32_t>(r));
    refusal("export " + std::to_string(e.id) + " could not be exported for pid " +
            std::to_string(c.cred.pid) + ": " + cu_text(r));
    return true;
  }
  auto close_all = [&] {
    for (int f : fds) ::close(f);
  };
  // Counted before sending: an unmap that begins now reports this importer (free-exported).
  if (!exports().commit_open(e.id, c.id)) {
    close_all();
    send_status(c.fd, ipc::ReplyStatus::UnknownExport, e.id);
    return true;
  }
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
  int err = send_msg(c.fd, head.data(), head.size(), nullptr, 0, kSendTimeoutMs);
  for (std::size_t i = 0; !err && i < pages.size(); i += ipc::kPagesPerChunk) {
    const std::size_t n = std::min(ipc::kPagesPerChunk, pages.size() - i);
    const auto chunk = ipc::encode_chunk(static_cast<std::uint32_t>(i),
                                         std::span<const ipc::PageRange>(pages).subspan(i, n));
    err = send_msg(c.fd, chunk.data(), chunk.size(), fds.data() + i, n, kSendTimeoutMs);
  }
  close_all();
  if (err) {
    exports().release(e.id, c.id);
    refusal("sending export " + std::to_string(e.id) + " to pid " + std::to_string(c.cred.pid) +
            " failed: " + std::strerror(err));
    return false;
  }
  note(LogLevel::Info, "ipc bridge: export " + std::to_string(e.id) + " (" +
                           std::to_string(pages.size()) + " page(s), " + std::to_string(rep.bytes) +
                           " bytes) opened by pid " + std::to_string(c.cred.pid));
  return true;
}

// One readable connection. Returns false when it must be dropped.
bool serve(const Conn &c) {
  Msg m;
  const int r = recv_msg(c.fd, ipc::kRequestSize, m, 0);
  if (r == ETIMEDOUT) return true;  // spurious wake-up
  if (r != 0) return false;         // closed by the importer (its imports are released), or error
  if (!m.fds.empty()) {
    m.close_fds();
    send_status(c.fd, ipc::ReplyStatus::Malformed);
    refusal("pid " + std::to_string(c.cred.pid) + " sent file descriptors; connection closed");
    return false;
  }
  ipc::Request req;
  const ipc::ParseError pe = m.truncated ? ipc::ParseError::Size : ipc::parse_request(m.data, req);
  if (pe != ipc::ParseError::None) {
    send_status(c.fd, ipc::ReplyStatus::Malformed);
    refusal("malformed request from pid " + std::to_string(c.cred.pid) + " (" +
            std::string(ipc::parse_error_text(pe)) + "); connection closed");
    return false;
  }
  if (req.op == ipc::Op::Release) {
    exports().release(req.export_id, c.id);
    send_status(c.fd, ipc::ReplyStatus::Ok, req.export_id);
    return true;
  }
  return serve_open(c, req);
}

void forget_fd(int fd) {
  Broker &b = broker();
  std::lock_guard lk(b.mu);
  std::erase(b.conn_fds, fd);
}

void drop(const Conn &c) {
  exports().drop_connection(c.id);
  forget_fd(c.fd);
  ::close(c.fd);
}

void accept_all(int ls, std::vector<Conn> &conns, std::uint64_t &next_id) {
  for (;;) {
    int fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    ucred uc{};
    socklen_t ul = sizeof uc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0) {
      ::close(fd);
      continue;
    }
    const ipc::PeerCred pc{uc.pid, uc.uid, uc.gid};
    if (ipc::check_peer(pc, static_cast<std::uint32_t>(geteuid())) != ipc::PeerVerdict::Allowed) {
      // Recorded before the answer, so that the refusal is in the log once the client knows.
      refusal("refused a connection from pid " + std::to_string(pc.pid) + " (uid " +
              std::to_string(pc.uid) + "): not this process's user (uid " +
              std::to_string(geteuid()) + ")");
      refuse(fd, ipc::ReplyStatus::Denied);
      continue;
    }
    if (conns.size() >= kMaxConns) {
      refuse(fd, ipc::ReplyStatus::Busy);
      refusal("refused a connection from pid " + std::to_string(pc.pid) + ": " +
              std::to_string(kMaxConns) + " connections are open");
      continue;
    }
    {
      Broker &b = broker();
      std::lock_guard lk(b.mu);
      b.conn_fds.push_back(fd);
    }
    conns.push_back(Conn{fd, next_id++, pc});
  }
}

void *broker_main(void *) {
  pthread_setname_np(pthread_self(), "cmg-ipc-broker");
  // Nothing this thread does is a call of the program: any wrapper it reached would only forward.
  ReentryGuard guard;
  int ls, wk;
  {
    Broker &b = broker();
    std::lock_guard lk(b.mu);
    ls = b.listen_fd;
    wk = b.wake_fd;
  }
  std::vector<Conn> conns;
  std::uint64_t next_id = 1;
  std::vector<pollfd> pfds;
  while (!g_stop.load()) {
    pfds.clear();
    pfds.push_back({wk, POLLIN, 0});
    pfds.push_back({ls, POLLIN, 0});
    for (const Conn &c : conns) pfds.push_back({c.fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (g_stop.load()) break;
    // Connections first (their indexes match pfds), then new ones.
    std::vector<Conn> keep;
    for (std::size_t i = 0; i < conns.size(); ++i) {
      const short ev = pfds[i + 2].revents;
      if (!ev) {
        keep.push_back(conns[i]);
        continue;
      }
      if ((ev & (POLLERR | POLLNVAL)) || !serve(conns[i]))
        drop(conns[i]);
      else
        keep.push_back(conns[i]);
    }
    conns.swap(keep);
    if (pfds[1].revents & POLLIN) accept_all(ls, conns, next_id);
  }
  for (const Conn &c : conns) drop(c);
  g_thread_done.store(true);
  return nullptr;
}

// Runs from exit() before the ELF destructors (libcuda's included): the broker stops serving and
// a request inside the driver is given a moment to leave it. The thread is detached and never
// keeps the process alive.
void stop_at_exit() {
  Broker &b = broker();
  int wk;
  {
    std::lock_guard lk(b.mu);
    if (b.owner != getpid() || b.wake_fd < 0) return;
    wk = b.wake_fd;
  }
  g_stop.store(true);
  const std::uint64_t one = 1;
  ssize_t n = ::write(wk, &one, sizeof one);
  (void)n;
  for (int i = 0; i < 500 && g_serving.load() && !g_thread_done.load(); ++i) {
    timespec ms{0, 1000000};
    nanosleep(&ms, nullptr);
  }
}

// The broker of this process, started on the first export. Returns its tag, 0 on failure.
std::uint64_t start_broker(std::string &err) {
  Broker &b = broker();
  std::lock_guard lk(b.mu);
  if (b.owner == getpid() && b.tag) return b.tag;
  std::uint64_t tag = 0;
  while (!tag)
    if (!random_bytes(reinterpret_cast<std::uint8_t *>(&tag), sizeof tag)) {
      err = "no random bytes (getrandom and /dev/urandom failed)";
      return 0;
    }
  int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (ls < 0) {
    err = errno_text("socket", errno);
    return 0;
  }
  sockaddr_un a;
  const socklen_t len = make_addr(a, ipc::socket_name(static_cast<std::uint32_t>(getpid()), tag));
  if (bind(ls, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(ls, 64) != 0) {
    err = errno_text("bind/listen on the abstract socket", errno);
    ::close(ls);
    return 0;
  }
  int wk = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wk < 0) {
    err = errno_text("eventfd", errno);
    ::close(ls);
    return 0;
  }
  g_stop.store(false);
  g_thread_done.store(false);
  b.listen_fd = ls;
  b.wake_fd = wk;
  // Every signal blocked in the broker: the program's handlers run on the program's threads.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, broker_main, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    err = errno_text("pthread_create", rc);
    ::close(ls);
    ::close(wk);
    b.listen_fd = b.wake_fd = -1;
    return 0;
  }
  b.owner = getpid();
  b.tag = tag;
  if (!b.atexit_registered) {
    b.atexit_registered = true;  // inherited by forked children, which check owner
    atexit(stop_at_exit);
  }
  return tag;
}

// ---- the importer ------------------------------------------------------------------------------
std::mutex g_imp_mu;  // opens and closes, whole (an open is a setup-time call)
ipc::ImportTable &imports() {
  static auto *t = new ipc::ImportTable;
  return *t;
}
using PeerKey = std::pair<std::uint32_t, std::uint64_t>;  // exporter pid, broker tag
std::map<PeerKey, int> &peers() {  // one connection per exporter, kept while imports from it live
  static auto *m = new std::map<PeerKey, int>;
  return *m;
}

void drop_peer(const PeerKey &k) {
  auto it = peers().find(k);
  if (it == peers().end()) return;
  ::close(it->second);
  peers().erase(it);
}

struct Failure {
  ipc::OpenFailure why;
  std::string detail;
};

int connect_peer(const ipc::Handle &h, Failure &f) {
  const PeerKey key{h.pid, h.tag};
  if (auto it = peers().find(key); it != peers().end()) return it->second;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    f = {ipc::OpenFailure::ProtocolError, errno_text("socket", errno)};
    return -1;
  }
  timeval tv{kSendTimeoutMs / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);  // bounds connect() too
  sockaddr_un a;
  const socklen_t len = make_addr(a, ipc::socket_name(h.pid, h.tag));
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), len) != 0) {
    const int e = errno;
    ::close(fd);
    const bool gone = e == ECONNREFUSED || e == ENOENT;
    f = {gone ? ipc::OpenFailure::ExporterGone : ipc::OpenFailure::ProtocolError,
         errno_text("connect", e)};
    if (gone && kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH)
      f.detail += "; no process " + std::to_string(h.pid) + " is running";
    return -1;
  }
  ucred uc{};
  socklen_t ul = sizeof uc;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0) uc = ucred{};
  switch (
      ipc::check_server({uc.pid, uc.uid, uc.gid}, h.pid, static_cast<std::uint32_t>(geteuid()))) {
    case ipc::ServerVerdict::Exporter:
      break;
    case ipc::ServerVerdict::NotExporter:
      ::close(fd);
      f = {ipc::OpenFailure::NotExporter,
           "pid " + std::to_string(uc.pid) + " (uid " + std::to_string(uc.uid) + ") listens there"};
      return -1;
    case ipc::ServerVerdict::OtherUser:
      ::close(fd);
      f = {ipc::OpenFailure::OtherUser, "exporter uid " + std::to_string(uc.uid) +
                                            ", this process uid " + std::to_string(geteuid())};
      return -1;
  }
  peers()[key] = fd;
  return fd;
}

// Sends a request and reads the reply header. A broker that refuses a connection answers before
// reading anything, so the reply is read even when the send failed.
int rpc(int fd, const ipc::Request &req, ipc::Reply &rep, std::string &detail,
        int timeout_ms = kReplyTimeoutMs) {
  const auto b = ipc::encode_request(req);
  const int se = send_msg(fd, b.data(), b.size(), nullptr, 0, kSendTimeoutMs);
  Msg m;
  const int re = recv_msg(fd, ipc::kReplySize, m, se ? 100 : timeout_ms);
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
    if (base != 0 && !imports().ptr_taken(base))
      va = v;
    else
      spare.push_back(v);  // kept until another range is found, so it is not handed out again
  }
  if (auto afree = CMG_REAL(cuMemAddressFree))
    for (CUdeviceptr v : spare) afree(v, l.span);
  if (!va && r == CUDA_SUCCESS) r = CUDA_ERROR_OUT_OF_MEMORY;
  return r;
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

bool device_supports_posix_fd(int dev) {
  static std::atomic<signed char> cache[64];  // 0 unknown, 1 yes, -1 no
  if (dev < 0 || dev >= 64) return false;
  const signed char v = cache[dev].load(std::memory_order_relaxed);
  if (v) return v > 0;
  auto f = unwrapped<PFN_cuDeviceGetAttribute_v2000>(g_dev_attr, "cuDeviceGetAttribute");
  int val = 0;
  const bool yes = f &&
                   f(&val, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) ==
                       CUDA_SUCCESS &&
                   val != 0;
  cache[dev].store(yes ? 1 : -1, std::memory_order_relaxed);
  return yes;
}

Opened open(const char *api, const ipc::Handle &h, const Codes &codes, bool runtime,
            const EventRef &ev) {
  Opened o;
  auto fail = [&](ipc::OpenFailure why, int status, std::string_view detail) {
    o.status = status;
    o.finding = ipc::open_failure_finding(why, api, h, detail);
    return o;
  };
  if (h.pid == static_cast<std::uint32_t>(getpid()))
    return fail(ipc::OpenFailure::SameProcess, codes.invalid_context, "");
  std::lock_guard lk(g_imp_mu);
  const ipc::ImportKey key{h.pid, h.tag, h.export_id};
  auto fill = [&](const ipc::Import &imp) {
    o.status = codes.success;
    o.ptr = imp.ptr;
    o.span_va = imp.span_va;
    o.span = imp.span;
    o.bytes = imp.bytes;
    o.pages = static_cast<std::uint32_t>(imp.maps.size());
    o.refs = imp.refs;
    o.dev = imp.dev;
    return o;
  };
  // Legacy IPC semantics (real-driver.md section 2): the same export opened again gives the same
  // pointer and needs one more close.
  if (ipc::Import *imp = imports().find(key)) {
    ++imp->refs;
    return fill(*imp);
  }
  int dev = current_device();
  if (dev < 0 && runtime) {
    // cudart creates the primary context at its first call; so does this one.
    if (auto init = CMG_REAL(cudaFree)) init(nullptr);
    dev = current_device();
  }
  if (dev < 0) return fail(ipc::OpenFailure::NoContext, codes.invalid_context, "");
  Failure f;
  const int fd = connect_peer(h, f);
  if (fd < 0) return fail(f.why, codes.map_failed, f.detail);
  const PeerKey pk{h.pid, h.tag};
  auto forget_peer_if_unused = [&] {
    if (imports().from_exporter(h.pid, h.tag) == 0) drop_peer(pk);
  };
  ipc::Request req;
  req.op = ipc::Op::Open;
  req.export_id = h.export_id;
  req.nonce = h.nonce;
  ipc::Reply rep;
  std::string detail;
  if (rpc(fd, req, rep, detail) != 0) {
    drop_peer(pk);
    return fail(ipc::OpenFailure::ProtocolError, codes.map_failed, detail);
  }
  switch (rep.status) {
    case ipc::ReplyStatus::Ok:
      break;
    case ipc::ReplyStatus::UnknownExport:
      forget_peer_if_unused();
      return fail(ipc::OpenFailure::UnknownExport, codes.invalid_handle, "");
    case ipc::ReplyStatus::BadNonce:
      drop_peer(pk);  // the broker closes the connection too
      return fail(ipc::OpenFailure::BadNonce, codes.invalid_handle, "");
    case ipc::ReplyStatus::Denied:
      drop_peer(pk);
      return fail(ipc::OpenFailure::OtherUser, codes.map_failed,
                  "refused by the exporter's broker");
    case ipc::ReplyStatus::ExportFailed:
      forget_peer_if_unused();
      return fail(ipc::OpenFailure::ExportFailed, codes.map_failed,
                  "exporter's driver: " + cu_text(static_cast<CUresult>(rep.driver_error)));
    case ipc::ReplyStatus::Busy:
    case ipc::ReplyStatus::Malformed:
      drop_peer(pk);
      return fail(ipc::OpenFailure::ProtocolError, codes.map_failed,
                  ipc::reply_status_text(rep.status));
  }
  if (rep.export_id != h.export_id || rep.pages != h.pages || rep.span == 0 ||
      rep.first_off > rep.res_size || rep.span > rep.res_size - rep.first_off) {
    drop_peer(pk);
    return fail(ipc::OpenFailure::ProtocolError, codes.map_failed, "inconsistent reply header");
  }
  const ipc::Layout layout{rep.first_off, rep.span};
  CUdeviceptr va = 0;
  CUresult err = reserve_span(layout, va);
  std::string where = err != CUDA_SUCCESS ? "cuMemAddressReserve of the span" : "";
  // Every page is received even after a failure, so that the connection stays in step.
  std::vector<ipc::PageRange> pages, mapped;
  bool broken = false;
  std::string broken_why;
  while (pages.size() < rep.pages && !broken) {
    Msg m;
    const int re = recv_msg(fd, ipc::kChunkMax, m, kReplyTimeoutMs);
    std::uint32_t first = 0;
    std::vector<ipc::PageRange> chunk;
    if (re != 0) {
      broken = true;
      broken_why = re < 0 ? "the broker closed the connection" : errno_text("receiving pages", re);
    } else if (m.truncated || ipc::parse_chunk(m.data, first, chunk) != ipc::ParseError::None ||
               first != pages.size() || chunk.size() != m.fds.size() ||
               chunk.size() > rep.pages - pages.size()) {
      broken = true;
      broken_why = "malformed page message";
    }
    for (std::size_t i = 0; !broken && i < chunk.size(); ++i) {
      const ipc::PageRange &p = chunk[i];
      const std::uint64_t prev_end =
          pages.empty() ? layout.first_off : pages.back().off + pages.back().size;
      // Inside the span, in order: nothing is ever mapped outside the range reserved for it.
      if (p.size == 0 || p.off < prev_end || p.off - layout.first_off > layout.span ||
          p.size > layout.span - (p.off - layout.first_off)) {
        broken = true;
        broken_why = "a page outside the announced span";
        break;
      }
      pages.push_back(p);
      if (err == CUDA_SUCCESS)
        err = map_one(va + (p.off - layout.first_off), p.size, m.fds[i], dev, mapped, where);
    }
    m.close_fds();
  }
  if (broken) {
    undo(mapped, va, layout.span);
    drop_peer(pk);
    return fail(ipc::OpenFailure::ProtocolError, codes.map_failed, broken_why);
  }
  if (err != CUDA_SUCCESS) {
    undo(mapped, va, layout.span);
    // The broker counted this open: take it back (or drop the connection, which does the same).
    if (imports().from_exporter(h.pid, h.tag) == 0) {
      drop_peer(pk);
    } else {
      ipc::Request rel = req;
      rel.op = ipc::Op::Release;
      ipc::Reply ignored;
      std::string d;
      if (rpc(fd, rel, ignored, d) != 0) drop_peer(pk);
    }
    return fail(ipc::OpenFailure::ImportFailed, status_for(codes, err),
                where + ": " + cu_text(err));
  }
  ipc::Import imp;
  imp.key = key;
  imp.ptr = ipc::import_base(va, layout);
  imp.span_va = va;
  imp.span = layout.span;
  imp.bytes = rep.bytes;
  imp.maps = std::move(mapped);
  imp.refs = 1;
  imp.dev = dev;
  imp.opened = ev;
  return fill(imports().add(std::move(imp)));
}

Closed close(std::uint64_t ptr, const Codes &codes) {
  Closed c;
  std::lock_guard lk(g_imp_mu);
  std::optional<ipc::Import> imp = imports().close(ptr);
  if (!imp) return c;
  c.ours = true;
  c.status = codes.success;
  c.refs_left = imp->refs;
  c.bytes = imp->bytes;
  c.dev = imp->dev;
  if (imp->refs) return c;
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
  const PeerKey pk{imp->key.pid, imp->key.tag};
  if (auto it = peers().find(pk); it != peers().end()) {
    ipc::Request rel;
    rel.op = ipc::Op::Release;
    rel.export_id = imp->key.export_id;
    ipc::Reply ignored;
    std::string d;
    if (rpc(it->second, rel, ignored, d, kReleaseTimeoutMs) != 0) drop_peer(pk);
  }
  if (imports().from_exporter(pk.first, pk.second) == 0) drop_peer(pk);
  if (worst != CUDA_SUCCESS) {
    note(LogLevel::Warn, "ipc bridge: closing the import at " + hex(ptr) + ": " + cu_text(worst));
    c.status = codes.invalid_value;
  }
  return c;
}

void fork_prepare() {
  broker().mu.lock();
  exports().fork_prepare();
  g_imp_mu.lock();
}

void fork_parent() {
  g_imp_mu.unlock();
  exports().fork_parent();
  broker().mu.unlock();
}

void fork_child() {
  g_imp_mu.unlock();
  exports().fork_child();
  Broker &b = broker();
  b.mu.unlock();
  // The broker thread does not exist here; its sockets would keep the parent's address reachable
  // through this process.
  if (b.listen_fd >= 0) ::close(b.listen_fd);
  if (b.wake_fd >= 0) ::close(b.wake_fd);
  for (int fd : b.conn_fds) ::close(fd);
  b.conn_fds.clear();
  b.listen_fd = b.wake_fd = -1;
  b.owner = 0;
  b.tag = 0;
  g_stop.store(false);
  g_serving.store(false);
  g_thread_done.store(false);
  for (auto &[k, fd] : peers()) ::close(fd);
  peers().clear();
  imports().clear();
}

}  // namespace cmg::shim::bridge
