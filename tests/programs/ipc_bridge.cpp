// SPDX-License-Identifier: Apache-2.0
// Legacy IPC on VMM memory between two processes (bug-patterns.md P11-P16): an exporter fills VMM
// pages with a pattern and exports them with cudaIpcGetMemHandle / cuIpcGetMemHandle; an importer
// (this program again, exec'd with the handle on a pipe) opens the handle and reads the pattern
// back. Without the shim the export fails (real-driver.md section 2); with CUMEMGUARD_IPC=bridge
// the bytes arrive. Each process prints one "step VALUE" line per result that matters (importer
// lines start with "imp."). Handles are forged here from the layout in docs/ipc-bridge.md,
// independently of the shim's own encoder.
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "fakecuda.h"
#include "fork_gate.h"

namespace {

size_t G = 0;  // granularity, read from the driver

void out(const char *step, CUresult r) {
  std::printf("%s %s\n", step, cu_name(r));
}
void out_rt(const char *step, cudaError_t r) {
  std::printf("%s %s\n", step, cudaGetErrorName(r));
}
void out_n(const char *step, long long v) {
  std::printf("%s %lld\n", step, v);
}
// Observations only the fake driver can make print "n/a" on the real one.
void out_fake(const char *step, long long v) {
  if (on_fake_driver())
    out_n(step, v);
  else
    std::printf("%s n/a\n", step);
}

// ---- the pattern: word w of the exporter's reservation holds w * 2654435761 ^ seed -------------
void fill(std::vector<unsigned> &buf, unsigned long long off, size_t len, unsigned seed) {
  buf.resize(len / 4);
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<unsigned>((off / 4 + i) * 2654435761ull) ^ seed;
}

bool write_pattern(CUdeviceptr v, unsigned long long off, size_t len, unsigned seed) {
  std::vector<unsigned> buf;
  fill(buf, off, len, seed);
  return cuMemcpyHtoD(v + off, buf.data(), len) == CUDA_SUCCESS;
}

// Reads [q + off, +len) and compares it with the pattern; prints the copy status and the verdict.
void check_pattern(const std::string &tag, CUdeviceptr q, unsigned long long off, size_t len,
                   unsigned seed) {
  std::vector<unsigned> want, got(len / 4, 0);
  fill(want, off, len, seed);
  CUresult r = cuMemcpyDtoH(got.data(), q + off, len);
  out((tag + "read").c_str(), r);
  out_n((tag + "pattern_ok").c_str(), r == CUDA_SUCCESS && got == want ? 1 : 0);
}

// ---- VMM memory as expandable segments make it ------------------------------------------------
CUmemAllocationProp prop_for(unsigned types, CUmemLocationType loc = CU_MEM_LOCATION_TYPE_DEVICE) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = loc;
  p.location.id = 0;
  p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
  return p;
}

struct Segment {
  CUdeviceptr v = 0;
  size_t size = 0;
  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> pages;  // granule index, handle
};

CUresult map_page(Segment &s, size_t granule, unsigned types,
                  CUmemLocationType loc = CU_MEM_LOCATION_TYPE_DEVICE) {
  CUmemAllocationProp p = prop_for(types, loc);
  CUmemGenericAllocationHandle h;
  CUresult r = cuMemCreate(&h, G, &p, 0);
  if (r != CUDA_SUCCESS) return r;
  CHECK_CU(cuMemMap(s.v + granule * G, G, 0, h, 0));
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(s.v + granule * G, G, &a, 1));
  s.pages.emplace_back(granule, h);
  return CUDA_SUCCESS;
}

Segment segment(size_t granules, std::initializer_list<size_t> mapped, unsigned seed,
                unsigned types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
  Segment s;
  s.size = granules * G;
  CHECK_CU(cuMemAddressReserve(&s.v, s.size, 0, 0, 0));
  for (size_t g : mapped) {
    CHECK_CU(map_page(s, g, types));
    if (!write_pattern(s.v, g * G, G, seed)) std::exit(3);
  }
  return s;
}

void release(Segment &s) {
  for (auto &[g, h] : s.pages) {
    CHECK_CU(cuMemUnmap(s.v + g * G, G));
    CHECK_CU(cuMemRelease(h));
  }
  s.pages.clear();
  CHECK_CU(cuMemAddressFree(s.v, s.size));
}

CUdeviceptr range_start(CUdeviceptr p) {
  CUdeviceptr base = 0;
  CHECK_CU(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p));
  return base;
}

// ---- two processes -----------------------------------------------------------------------------
// What the exporter sends: the handle and, as vLLM's custom all-reduce does, the offset of the
// buffer from the base the handle stands for.
struct Job {
  unsigned char handle[64];
  unsigned long long off, len;
  unsigned seed;
  unsigned runtime;  // open with cudaIpcOpenMemHandle (1) or cuIpcOpenMemHandle_v2 (0)
  unsigned index;    // 0: steps print as "imp.x"; n: "imp.jn.x"
};

struct Peer {
  pid_t pid = -1;
  int to = -1, from = -1;  // our ends
};

bool write_all(int fd, const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void *p, size_t n) {
  char *c = static_cast<char *>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void ack(int fd) {
  char c = 'k';
  write_all(fd, &c, 1);
}
bool wait_ack(int fd) {
  char c;
  return read_all(fd, &c, 1);
}

// Starts this program as `role` with two pipes; uid_to_drop >= 0 runs it as that user.
Peer spawn(const char *role, const char *cas, int uid_to_drop = -1) {
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) std::exit(4);
  std::fflush(stdout);
  Peer p;
  p.pid = fork_when_blocked("cmg-ipc-broker");
  if (p.pid == 0) {
    close(a[1]);
    close(b[0]);
    if (uid_to_drop >= 0) {
      if (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(uid_to_drop)) != 0 ||
          setuid(static_cast<uid_t>(uid_to_drop)) != 0)
        _exit(5);
    }
    // A one-sided bridge: the peer runs without the shim (its driver sees the bridge's bytes).
    if (std::strcmp(cas, "one-sided") == 0) unsetenv("LD_PRELOAD");
    std::string rfd = std::to_string(a[0]), wfd = std::to_string(b[1]);
    execl("/proc/self/exe", "ipc_bridge", role, cas, rfd.c_str(), wfd.c_str(), nullptr);
    if (uid_to_drop >= 0) {
      // The build tree is not reachable for that user here: nothing to observe.
      std::printf("imp.open n/a\nimp.raw_status n/a\n");
      std::fflush(stdout);
      _exit(77);
    }
    _exit(6);
  }
  close(a[0]);
  close(b[1]);
  p.to = a[1];
  p.from = b[0];
  return p;
}

int finish(Peer &p) {
  close(p.to);
  close(p.from);
  int st = 0;
  waitpid(p.pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int count_fds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent *e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own descriptor
}

unsigned long long calls(const char *api) {
  auto f = reinterpret_cast<fakecuda_calls_fn>(dlsym(RTLD_DEFAULT, "fakecuda_calls"));
  return f ? f(api) : 0;
}

// The importer's own reservations and mappings, from the fake driver (absent on the real one).
bool fake_state(unsigned long long &reserved, unsigned long long &mappings) {
  auto f = reinterpret_cast<fakecuda_get_state_fn>(dlsym(RTLD_DEFAULT, "fakecuda_get_state"));
  fakecuda_state st{};
  if (!f || f(&st) != 0) return false;
  reserved = st.reserved_bytes;
  mappings = st.mappings;
  return true;
}

CUresult export_drv(CUipcMemHandle &h, CUdeviceptr p) {
  return cuIpcGetMemHandle(&h, p);
}

// ---- handles from the documented layout (docs/ipc-bridge.md) -----------------------------------
unsigned fnv1a(const unsigned char *p, size_t n) {
  unsigned h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}
void reseal(unsigned char *h) {
  const unsigned c = fnv1a(h, 60);
  for (int i = 0; i < 4; ++i) h[60 + i] = static_cast<unsigned char>(c >> (8 * i));
}
bool is_bridge_handle(const unsigned char *h) {
  return std::memcmp(h, "CMGBRIDG", 8) == 0;
}
unsigned le32(const unsigned char *p) {
  return p[0] | p[1] << 8 | p[2] << 16 | static_cast<unsigned>(p[3]) << 24;
}
unsigned long long le64(const unsigned char *p) {
  return le32(p) | static_cast<unsigned long long>(le32(p + 4)) << 32;
}

// A raw client of the exporter's broker: sends `msg` (optionally with a descriptor; nothing when
// len is 0) and returns the status of the reply, or -1.
int raw_request(const unsigned char *handle, const void *msg, size_t len, bool with_fd) {
  char name[80];
  int n = std::snprintf(name, sizeof name, "%ccumemguard-ipc.%u.%016llx", 0, le32(handle + 12),
                        le64(handle + 16));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, name, static_cast<size_t>(n));
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{5, 0};  // a broker that never answers is a failure, not a hang
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, reinterpret_cast<sockaddr *>(&a),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n)) != 0) {
    close(fd);
    return -1;
  }
  iovec iov{const_cast<void *>(msg), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  int passed = with_fd ? open("/dev/null", O_RDONLY) : -1;
  if (with_fd) {
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &passed, sizeof passed);
  }
  if (len) sendmsg(fd, &m, MSG_NOSIGNAL);
  if (passed >= 0) close(passed);
  unsigned char rep[64] = {};
  ssize_t r = recv(fd, rep, sizeof rep, 0);
  close(fd);
  if (r != 64 || std::memcmp(rep, "CMGR", 4) != 0) return -1;
  return rep[6] | rep[7] << 8;
}

// ---- the importer ------------------------------------------------------------------------------
CUresult open_handle(const Job &j, const unsigned char *handle, CUdeviceptr &q) {
  if (j.runtime) {
    cudaIpcMemHandle_t h;
    std::memcpy(h.reserved, handle, 64);
    void *p = nullptr;
    cudaError_t r = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    q = reinterpret_cast<CUdeviceptr>(p);
    // Runtime statuses are printed under their own names by the caller through out_rt.
    return static_cast<CUresult>(r);
  }
  CUipcMemHandle h;
  std::memcpy(h.reserved, handle, 64);
  return cuIpcOpenMemHandle_v2(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

void print_open(const Job &j, const char *step, CUresult r) {
  if (j.runtime)
    out_rt(step, static_cast<cudaError_t>(r));
  else
    out(step, r);
}

CUresult close_handle(const Job &j, CUdeviceptr q) {
  if (j.runtime) return static_cast<CUresult>(cudaIpcCloseMemHandle(reinterpret_cast<void *>(q)));
  return cuIpcCloseMemHandle(q);
}

// Blocks pidfd_open and pidfd_getfd with EPERM, as unprivileged containers do (P13).
bool block_pidfd() {
  sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 434 /* pidfd_open */, 2, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 438 /* pidfd_getfd */, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof f / sizeof f[0]), f};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

int importer(const std::string &cas, int rfd, int wfd) {
  if (cas == "P13") {
    out_n("imp.seccomp_installed", block_pidfd() ? 1 : 0);
    long r = syscall(434, getppid(), 0);
    out_n("imp.pidfd_open_blocked", r < 0 && errno == EPERM ? 1 : 0);
    r = syscall(438, 3, 3, 0);
    out_n("imp.pidfd_getfd_blocked", r < 0 && errno == EPERM ? 1 : 0);
  }
  init_primary();
  CUmemAllocationProp prop = prop_for(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK_CU(cuMemGetAllocationGranularity(&G, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  // One intercepted call first, so that the shim's own log descriptor is open before any count.
  (void)cudaFree(nullptr);
  Job j;
  while (read_all(rfd, &j, sizeof j)) {
    const std::string pre = j.index ? "imp.j" + std::to_string(j.index) + "." : "imp.";
    auto step = [&](const char *s) { return pre + s; };
    const int fds_before = count_fds();
    unsigned long long res0 = 0, maps0 = 0;
    fake_state(res0, maps0);
    if (cas == "forged") {
      // Each forgery is one change to a genuine handle, resealed where the checksum should pass.
      unsigned char h[64];
      auto with = [&](const char *name, bool seal, auto change) {
        std::memcpy(h, j.handle, 64);
        change();
        if (seal) reseal(h);
        CUdeviceptr x = 0;
        CUresult r = open_handle(j, h, x);
        print_open(j, step(name).c_str(), r);
        if (r == CUDA_SUCCESS) close_handle(j, x);
      };
      with("bad_check", false, [&] { h[40] ^= 1; });
      with("truncated", false, [&] { std::memset(h + 32, 0, 32); });
      with("bad_nonce", true, [&] { h[40] ^= 1; });
      with("unknown_export", true, [&] { h[24] = 99; });
      with("wrong_tag", true, [&] { h[16] ^= 0x55; });
      with("same_process", true, [&] {
        const unsigned me = static_cast<unsigned>(getpid());
        for (int i = 0; i < 4; ++i) h[12 + i] = static_cast<unsigned char>(me >> (8 * i));
      });
      with("not_ours", false, [&] {
        for (int i = 0; i < 64; ++i) h[i] = static_cast<unsigned char>(i * 37 + 1);
      });
      // A hostile client at the broker's address: each is answered "malformed" (status 1).
      const unsigned char shortmsg[5] = {1, 2, 3, 4, 5};
      out_n(step("hostile_short").c_str(), raw_request(j.handle, shortmsg, sizeof shortmsg, false));
      unsigned char req[32] = {'C', 'M', 'G', 'Q', 1, 0, 1, 0};
      std::memcpy(req + 8, j.handle + 24, 8);
      std::memcpy(req + 16, j.handle + 32, 16);
      out_n(step("hostile_with_fd").c_str(), raw_request(j.handle, req, sizeof req, true));
      unsigned char bad[32];
      std::memcpy(bad, req, 32);
      bad[0] = 'X';
      out_n(step("hostile_magic").c_str(), raw_request(j.handle, bad, sizeof bad, false));
      std::memcpy(bad, req, 32);
      bad[6] = 7;
      out_n(step("hostile_op").c_str(), raw_request(j.handle, bad, sizeof bad, false));
      std::vector<unsigned char> big(4096, 0xab);
      out_n(step("hostile_big").c_str(), raw_request(j.handle, big.data(), big.size(), false));
    }
    CUdeviceptr q = 0;
    CUresult r = open_handle(j, j.handle, q);
    print_open(j, step("open").c_str(), r);
    if (cas == "P16" && r != CUDA_SUCCESS) {  // keep the exporter's sequence
      ack(wfd);
      wait_ack(rfd);
    }
    if (cas == "peer-uid")  // the broker itself refuses this user (status 4) as it accepts
      out_n(step("raw_status").c_str(), raw_request(j.handle, nullptr, 0, false));
    if (r == CUDA_SUCCESS) {
      unsigned long long res = 0, maps = 0;
      fake_state(res, maps);
      out_fake(step("reserved_bytes").c_str(), static_cast<long long>(res - res0));
      check_pattern(pre, q, j.off, j.len, j.seed);
      if (cas == "multi") {
        // Granule 3 was not mapped at export: inside the span, but nothing is there. (Not tried
        // on the real driver: a device fault there would end the context.)
        unsigned v;
        if (on_fake_driver())
          out(step("gap_read").c_str(), cuMemcpyDtoH(&v, q + 3 * G, sizeof v));
        else
          std::printf("%s n/a\n", step("gap_read").c_str());
        check_pattern(pre + "page4.", q, 4 * G, G, j.seed);
      }
      if (cas == "P14") {
        // The second handle of the same export (P14): same bytes, same pointer, counted.
        Job j2;
        read_all(rfd, &j2, sizeof j2);
        out_n(step("handles_equal").c_str(), std::memcmp(j.handle, j2.handle, 64) == 0 ? 1 : 0);
        CUdeviceptr q2 = 0;
        print_open(j, step("open2").c_str(), open_handle(j, j2.handle, q2));
        out_n(step("same_ptr").c_str(), q2 == q ? 1 : 0);
        print_open(j, step("close1").c_str(), close_handle(j, q));
        check_pattern(pre + "after_close1.", q, j.off, j.len, j.seed);
      }
      if (cas == "P16") {
        ack(wfd);       // opened
        wait_ack(rfd);  // the exporter freed it
        check_pattern(pre + "after_free.", q, j.off, j.len, j.seed);
      }
      print_open(j, step("close").c_str(), close_handle(j, q));
      if (cas == "P14") print_open(j, step("close_again").c_str(), close_handle(j, q));
      fake_state(res, maps);
      out_fake(step("reserved_after").c_str(), static_cast<long long>(res - res0));
      out_fake(step("mappings_after").c_str(), static_cast<long long>(maps - maps0));
      // The real driver opens descriptors of its own on first use; the fake opens none.
      out_fake(step("fd_delta").c_str(), count_fds() - fds_before);
    }
    ack(wfd);
  }
  return 0;
}

// ---- the exporters ---------------------------------------------------------------------------
Job job_for(const unsigned char *h, unsigned long long off, unsigned long long len, unsigned seed,
            bool runtime, unsigned index = 0) {
  Job j{};
  j.index = index;
  std::memcpy(j.handle, h, 64);
  j.off = off;
  j.len = len;
  j.seed = seed;
  j.runtime = runtime ? 1 : 0;
  return j;
}

// One importer process for one job: it opens, checks and closes; its exit status is printed.
void import_in_child(const char *cas, const void *handle, unsigned long long off,
                     unsigned long long len, unsigned seed, bool runtime, int uid_to_drop = -1) {
  Peer p = spawn("importer", cas, uid_to_drop);
  Job j = job_for(static_cast<const unsigned char *>(handle), off, len, seed, runtime);
  write_all(p.to, &j, sizeof j);
  wait_ack(p.from);
  const int rc = finish(p);
  if (rc == 77)  // the child could not run as the other user (peer-uid)
    std::printf("importer_exit n/a\n");
  else
    out_n("importer_exit", rc);
}

// P11/P12 and the vLLM custom all-reduce flow: base = RANGE_START_ADDR of the buffer,
// cudaIpcGetMemHandle(base), the importer adds the buffer's offset to what it opens.
int vllm_flow(const std::string &cas) {
  const unsigned seed = 0x11u;
  Segment s = segment(4, {0, 1}, seed);
  const CUdeviceptr buf = s.v + G - 4096;  // 8 KiB straddling the two pages
  const CUdeviceptr base = cas == "P12" ? buf : range_start(buf + 100);
  out_n("base_is_reservation", base == s.v ? 1 : 0);
  cudaIpcMemHandle_t h{};
  const unsigned long long before = calls("cuIpcGetMemHandle");
  cudaError_t r = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(base));
  out_rt("export", r);
  out_fake("driver_export_calls", static_cast<long long>(calls("cuIpcGetMemHandle") - before));
  out_n("bridge_handle", is_bridge_handle(reinterpret_cast<unsigned char *>(h.reserved)) ? 1 : 0);
  // P12: a handle for an interior pointer stands for its reservation, like legacy IPC's for its
  // allocation: the importer's pointer is the base.
  if (r == cudaSuccess) import_in_child(cas.c_str(), h.reserved, buf - s.v, 8192, seed, true);
  release(s);
  return 0;
}

int multi() {
  const unsigned seed = 0x2222u;
  Segment s = segment(6, {1, 2, 4}, seed);
  CUipcMemHandle h{};
  CUresult r = export_drv(h, s.v + 2 * G);
  out("export", r);
  if (r == CUDA_SUCCESS) import_in_child("multi", h.reserved, G + G / 2, G, seed, false);
  release(s);
  return 0;
}

int p14() {
  const unsigned seed = 0x1414u;
  Segment s = segment(2, {0, 1}, seed);
  CUipcMemHandle h1{}, h2{};
  CUresult r = export_drv(h1, s.v);
  out("export1", r);
  const int fds_after_first = count_fds();  // the broker's sockets exist from here on
  out("export2", export_drv(h2, s.v + G + 12345));
  out_n("handles_equal", std::memcmp(h1.reserved, h2.reserved, 64) == 0 ? 1 : 0);
  if (r != CUDA_SUCCESS) {
    release(s);
    return 0;
  }
  Peer p = spawn("importer", "P14");
  Job j1 =
      job_for(reinterpret_cast<unsigned char *>(h1.reserved), 100 * 4, 2 * G - 800, seed, false);
  Job j2 = job_for(reinterpret_cast<unsigned char *>(h2.reserved), 0, 0, seed, false);
  write_all(p.to, &j1, sizeof j1);
  write_all(p.to, &j2, sizeof j2);
  wait_ack(p.from);
  out_n("importer_exit", finish(p));
  // The broker closes its end of the importer's connection when it sees it closed, on its own
  // thread: a leak stays, a late close does not.
  int delta = count_fds() - fds_after_first;
  for (int i = 0; i < 100 && delta > 0; ++i) {
    usleep(10000);
    delta = count_fds() - fds_after_first;
  }
  out_fake("exp.fd_delta", delta);
  release(s);
  return 0;
}

int forged() {
  const unsigned seed = 0xf0f0u;
  Segment s = segment(2, {0}, seed);
  CUipcMemHandle h{};
  CUresult r = export_drv(h, s.v);
  out("export", r);
  if (r == CUDA_SUCCESS) import_in_child("forged", h.reserved, 0, G, seed, false);
  release(s);
  return 0;
}

int p13() {
  const unsigned seed = 0x1313u;
  Segment s = segment(3, {0, 2}, seed);
  cudaIpcMemHandle_t h{};
  cudaError_t r = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(s.v));
  out_rt("export", r);
  if (r == cudaSuccess) import_in_child("P13", h.reserved, 2 * G, G, seed, true);
  release(s);
  return 0;
}

// P15: FABRIC refused then POSIX_FD (PyTorch's order, real-driver.md section 6), FABRIC accepted
// (FAKECUDA_FABRIC=accept: the create succeeds, the FABRIC export fails), and a host-located
// allocation without POSIX_FD, which the bridge cannot export.
int p15(const std::string &cas) {
  const unsigned seed = 0x1515u;
  Segment s;
  s.size = 2 * G;
  CHECK_CU(cuMemAddressReserve(&s.v, s.size, 0, 0, 0));
  CUresult r;
  if (cas == "P15-host") {
    r = map_page(s, 0, 0, CU_MEM_LOCATION_TYPE_HOST_NUMA);
    out("create_host", r);
  } else {
    r = map_page(s, 0, CU_MEM_HANDLE_TYPE_FABRIC);
    out("create_fabric", r);
    if (r != CUDA_SUCCESS) {
      r = map_page(s, 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      out("create_posix", r);
    } else {
      int fd = -1;
      out("export_fabric_fd",
          cuMemExportToShareableHandle(&fd, s.pages[0].second, CU_MEM_HANDLE_TYPE_FABRIC, 0));
    }
  }
  if (r != CUDA_SUCCESS) return 3;
  if (!write_pattern(s.v, 0, G, seed)) return 3;
  cudaIpcMemHandle_t h{};
  cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(s.v));
  out_rt("export", e);
  if (e == cudaSuccess) import_in_child(cas.c_str(), h.reserved, 0, G, seed, true);
  release(s);
  return 0;
}

// P16: the exporter frees what an importer still has open; then the same with cudaMalloc memory
// and legacy IPC, where the shim makes no claim.
int p16() {
  const unsigned seed = 0x1616u;
  Segment s = segment(2, {0, 1}, seed);
  cudaIpcMemHandle_t h{};
  cudaError_t r = cudaIpcGetMemHandle(&h, reinterpret_cast<void *>(s.v));
  out_rt("export", r);
  Peer p = spawn("importer", "P16");
  if (r == cudaSuccess) {
    Job j = job_for(reinterpret_cast<unsigned char *>(h.reserved), 0, 2 * G, seed, true);
    write_all(p.to, &j, sizeof j);
    wait_ack(p.from);  // the importer has it open
    for (auto &[g, hh] : s.pages) {
      out((std::string("free.unmap") + std::to_string(g)).c_str(), cuMemUnmap(s.v + g * G, G));
      out((std::string("free.release") + std::to_string(g)).c_str(), cuMemRelease(hh));
    }
    s.pages.clear();
    ack(p.to);
    wait_ack(p.from);  // the importer is done with it
  }
  // Legacy IPC of cudaMalloc memory, freed while open: no finding.
  void *lin = nullptr;
  if (cudaMalloc(&lin, G) != cudaSuccess ||
      !write_pattern(reinterpret_cast<CUdeviceptr>(lin), 0, G, seed ^ 1))
    return 3;
  cudaIpcMemHandle_t lh{};
  out_rt("legacy.export", cudaIpcGetMemHandle(&lh, lin));
  Job lj = job_for(reinterpret_cast<unsigned char *>(lh.reserved), 0, G, seed ^ 1, true, 1);
  write_all(p.to, &lj, sizeof lj);
  wait_ack(p.from);
  out_rt("legacy.free", cudaFree(lin));
  ack(p.to);
  wait_ack(p.from);
  out_n("importer_exit", finish(p));
  release(s);
  return 0;
}

// The exporter in its own process; the test's main process imports (exited-exporter case).
int exporter_exit(int rfd, int wfd) {
  init_primary();
  CUmemAllocationProp p = prop_for(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const unsigned seed = 0xe1e1u;
  Segment a = segment(1, {0}, seed), b = segment(1, {0}, seed);
  CUipcMemHandle ha{}, hb{};  // zero when the driver refuses (without the bridge)
  export_drv(ha, a.v);
  export_drv(hb, b.v);
  Job ja = job_for(reinterpret_cast<unsigned char *>(ha.reserved), 0, G, seed, false);
  Job jb = job_for(reinterpret_cast<unsigned char *>(hb.reserved), 0, G, seed, false);
  write_all(wfd, &ja, sizeof ja);
  write_all(wfd, &jb, sizeof jb);
  wait_ack(rfd);  // the importer has `a` open; exit without freeing anything
  return 0;
}

int exited() {
  // Roles swapped: the exporter is the child, this process imports.
  Peer p = spawn("exporter-exit", "exited");
  Job ja, jb;
  if (!read_all(p.from, &ja, sizeof ja) || !read_all(p.from, &jb, sizeof jb)) return 3;
  CUdeviceptr q = 0;
  out("open", open_handle(ja, ja.handle, q));
  check_pattern("", q, 0, G, ja.seed);
  ack(p.to);
  out_n("exporter_exit", finish(p));
  check_pattern("after_exit.", q, 0, G, ja.seed);  // imported memory outlives its exporter
  out("close", cuIpcCloseMemHandle(q));
  CUdeviceptr x = 0;
  out("open_after_exit_drv", open_handle(jb, jb.handle, x));
  jb.runtime = 1;
  print_open(jb, "open_after_exit_rt", open_handle(jb, jb.handle, x));
  return 0;
}

// A child of another user opens the handle: the exporter's broker refuses it (SO_PEERCRED).
int peer_uid() {
  if (geteuid() != 0) {
    std::fprintf(stderr, "peer-uid needs root to run a child as another user\n");
    return 77;
  }
  const unsigned seed = 0x9a9au;
  Segment s = segment(1, {0}, seed);
  CUipcMemHandle h{};
  CUresult r = export_drv(h, s.v);
  out("export", r);
  if (r == CUDA_SUCCESS) import_in_child("peer-uid", h.reserved, 0, G, seed, true, 65534);
  release(s);
  return 0;
}

// The broker across fork: a forked child holds none of the parent's broker sockets, and the parent
// keeps serving.
int forked() {
  const unsigned seed = 0xf00du;
  Segment s = segment(1, {0}, seed);
  CUipcMemHandle h{};
  out("export", export_drv(h, s.v));
  std::fflush(stdout);
  pid_t c = fork_when_blocked("cmg-ipc-broker");
  if (c == 0) {
    // Our abstract name in /proc/net/unix gives the listener's inode; no descriptor of ours may
    // point at it.
    char want[64];
    std::snprintf(want, sizeof want, "@cumemguard-ipc.%u.", static_cast<unsigned>(getppid()));
    std::string inode;
    if (FILE *f = std::fopen("/proc/net/unix", "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, f))
        if (std::strstr(line, want)) {
          char path[256];
          unsigned long long ino = 0;
          if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %llu %255s", &ino, path) == 2)
            inode = "socket:[" + std::to_string(ino) + "]";
        }
      std::fclose(f);
    }
    int holds = 0;
    if (DIR *d = opendir("/proc/self/fd")) {
      while (dirent *e = readdir(d)) {
        const std::string link = std::string("/proc/self/fd/") + e->d_name;
        char target[128];
        ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
        if (n > 0) {
          target[n] = 0;
          if (inode == target) holds = 1;
        }
      }
      closedir(d);
    }
    std::printf("child.listener_found %d\nchild.holds_listener %d\n", inode.empty() ? 0 : 1, holds);
    std::fflush(stdout);
    _exit(0);
  }
  int st = 0;
  waitpid(c, &st, 0);
  out_n("child_exit", WIFEXITED(st) ? WEXITSTATUS(st) : 128);
  if (!is_bridge_handle(reinterpret_cast<unsigned char *>(h.reserved))) {
    release(s);
    return 0;
  }
  import_in_child("fork", h.reserved, 0, G, seed, false);
  release(s);
  return 0;
}

// ---- a hostile host (tests/reliability run_edges.py, docs/reliability.md) ----------------------
// The kernel id of the calling thread, and the threads of this process named `comm`.
long tid_now() { return syscall(SYS_gettid); }
int threads_named(const char *comm) {
  int n = 0;
  if (DIR *d = opendir("/proc/self/task")) {
    while (dirent *e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char name[32] = {};
      const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
      if (FILE *f = std::fopen(path.c_str(), "r")) {
        if (!std::fgets(name, sizeof name, f)) name[0] = 0;
        std::fclose(f);
      }
      name[std::strcspn(name, "\n")] = 0;
      if (std::strcmp(name, comm) == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

std::string fd_target(int fd) {
  char link[64], target[512];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

std::vector<int> open_fds() {
  std::vector<int> out;
  if (DIR *d = opendir("/proc/self/fd")) {
    const int self = dirfd(d);
    while (dirent *e = readdir(d))
      if (e->d_name[0] != '.' && std::atoi(e->d_name) != self) out.push_back(std::atoi(e->d_name));
    closedir(d);
  }
  return out;
}

// "socket:[N]" of this process's broker: its abstract name in /proc/net/unix gives the inode.
std::string broker_socket() {
  char want[64];
  std::snprintf(want, sizeof want, "@cumemguard-ipc.%u.", static_cast<unsigned>(getpid()));
  std::string inode;
  if (FILE *f = std::fopen("/proc/net/unix", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::strstr(line, want)) {
        char path[256];
        unsigned long long ino = 0;
        if (std::sscanf(line, "%*s %*s %*s %*s %*s %*s %llu %255s", &ino, path) == 2)
          inode = "socket:[" + std::to_string(ino) + "]";
      }
    std::fclose(f);
  }
  return inode;
}

// The host closing and reusing numbers the shim's threads use is the hostile act under test:
// ThreadSanitizer would report it as the race it is, so its accesses are hidden from it (weak: no-ops
// without ThreadSanitizer).
extern "C" void __tsan_ignore_thread_begin() __attribute__((weak));
extern "C" void __tsan_ignore_thread_end() __attribute__((weak));
struct HostileRegion {
  HostileRegion() {
    if (__tsan_ignore_thread_begin) __tsan_ignore_thread_begin();
  }
  ~HostileRegion() {
    if (__tsan_ignore_thread_end) __tsan_ignore_thread_end();
  }
};

bool same_file(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// A daemon-like host: after one export it closes every descriptor it did not open (all but the
// fake driver's: a real daemon detaches before it loads CUDA), reuses the numbers the shim had for
// a TCP listener and a file of its own (and dup2s that file over the low numbers), and serves 20
// TCP clients. Every client must reach the host, the host's file must keep its bytes, the broker
// must stop instead of spinning, the log must go on, and a later export must work again.
int fd_reuse() {
  const unsigned seed = 0xfd00u;
  Segment s = segment(1, {0}, seed);
  CUipcMemHandle h{};
  out("export", export_drv(h, s.v));
  if (!is_bridge_handle(reinterpret_cast<unsigned char *>(h.reserved))) return 3;
  const std::string broker = broker_socket();
  int log_fd = -1, listen_fd = -1;
  for (int fd : open_fds()) {
    const std::string t = fd_target(fd);
    if (t == broker) listen_fd = fd;
    if (t.find("/log.") != std::string::npos) log_fd = fd;
  }
  out_n("found_shim_fds", log_fd >= 0 && listen_fd >= 0 ? 1 : 0);
  out_n("shim_fds_high", log_fd >= 64 && listen_fd >= 64 ? 1 : 0);
  HostileRegion *hostile = new HostileRegion;
  for (int fd : open_fds())
    if (fd > 2 && fd_target(fd).rfind("/memfd:fakecuda", 0) != 0) close(fd);
  // The host's own objects, at the numbers the shim had.
  int tcp = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (tcp < 0 || bind(tcp, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      listen(tcp, 64) != 0 || getsockname(tcp, reinterpret_cast<sockaddr *>(&a), &al) != 0)
    return 4;
  if (listen_fd >= 0 && dup2(tcp, listen_fd) < 0) return 4;
  const char host_bytes[] = "the host's own file\n";
  int file = open("host-file", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (file < 0 || !write_all(file, host_bytes, sizeof host_bytes - 1)) return 4;
  if (log_fd >= 0) dup2(file, log_fd);
  // Under AddressSanitizer (CMG_TEST_FORK_GATE, tests/meson.build) the runtime makes and closes
  // pipes of its own on the broker's thread as it stops (its memory-range probe: pipe, write,
  // close), at whatever numbers are free: one made between the look below and the dup2 lost the
  // dup2 to its close, and the host's number was gone (1 run in 12-16, with or without this
  // change of the shim). There the numbers are filled once the broker has stopped.
  if (std::getenv("CMG_TEST_FORK_GATE"))
    for (int i = 0; i < 1000 && threads_named("cmg-ipc-broker"); ++i) usleep(10000);
  std::vector<int> low;
  for (int fd = 3; fd < 40; ++fd)
    if (fcntl(fd, F_GETFD) < 0 && dup2(file, fd) == fd) low.push_back(fd);
  delete hostile;
  // A client at the broker's old address: the broker must not wake up on the host's objects.
  out_n("old_address_refused",
        raw_request(reinterpret_cast<unsigned char *>(h.reserved), nullptr, 0, false) < 0 ? 1 : 0);
  int broker_threads = threads_named("cmg-ipc-broker");
  for (int i = 0; i < 1000 && broker_threads; ++i) {
    usleep(10000);
    broker_threads = threads_named("cmg-ipc-broker");
  }
  out_n("broker_threads_after_close", broker_threads);
  // 20 TCP clients; the host accepts on the number it chose.
  const int served_on = listen_fd >= 0 ? listen_fd : tcp;
  std::thread clients([&] {
    for (int i = 0; i < 20; ++i) {
      int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        char byte;
        (void)!read(c, &byte, 1);  // until the host closes it
      }
      close(c);
    }
  });
  int accepted = 0;
  for (int i = 0; i < 20; ++i) {
    pollfd p{served_on, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) break;
    int c = accept4(served_on, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) break;
    ++accepted;
    close(c);
  }
  clients.join();
  out_n("host_accepted", accepted);
  // Calls after the close: their records go to the log, never into the host's file.
  int bad = 0;
  for (int i = 0; i < 200; ++i) {
    void *p = nullptr;
    if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) ++bad;
  }
  void *p = nullptr;
  cudaMalloc(&p, 4096);
  cudaFree(p);
  out_rt("double_free", cudaFree(p));  // a finding: written through at once
  out_n("calls_failed", bad);
  char back[256] = {};
  const ssize_t n = pread(file, back, sizeof back, 0);
  out_n("host_file_intact",
        n == static_cast<ssize_t>(sizeof host_bytes - 1) && std::memcmp(back, host_bytes, n) == 0);
  bool intact = same_file(file, log_fd >= 0 ? log_fd : file);
  for (int fd : low) intact = intact && same_file(file, fd);
  sockaddr_in now{};
  socklen_t nl = sizeof now;
  intact = intact && getsockname(served_on, reinterpret_cast<sockaddr *>(&now), &nl) == 0 &&
           now.sin_port == a.sin_port;
  out_n("host_fds_intact", intact ? 1 : 0);
  // The next export starts a new broker, which serves.
  Segment s2 = segment(1, {0}, seed ^ 1);
  CUipcMemHandle h2{};
  out("export_again", export_drv(h2, s2.v));
  if (is_bridge_handle(reinterpret_cast<unsigned char *>(h2.reserved)))
    import_in_child("fd-reuse", h2.reserved, 0, G, seed ^ 1, false);
  release(s2);
  release(s);
  return 0;
}

// The exporter of fork-stall, in its own process: one export, the job to the parent, then it
// waits (the parent stops and continues it) until told to exit.
int exporter_stall(int rfd, int wfd) {
  init_primary();
  CUmemAllocationProp p = prop_for(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const unsigned seed = 0x5a11u;
  Segment s = segment(1, {0}, seed);
  CUipcMemHandle h{};
  export_drv(h, s.v);
  Job j = job_for(reinterpret_cast<unsigned char *>(h.reserved), 0, G, seed, true);
  write_all(wfd, &j, sizeof j);
  wait_ack(rfd);
  release(s);
  return 0;
}

// Whether thread `tid` is blocked in poll (an open waiting for its broker's answer).
bool blocked_in_poll(long tid) {
  char path[96], sys[32] = {};
  std::snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  if (FILE *f = std::fopen(path, "r")) {
    if (!std::fgets(sys, sizeof sys, f)) sys[0] = 0;
    std::fclose(f);
  }
  const long nr = std::strtol(sys, nullptr, 10);
  return tid && (nr == SYS_poll || nr == SYS_ppoll);
}

// Whether every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat): kill()
// returns before a SIGSTOP has taken effect, and the exporter's broker thread could still answer an
// open that arrives meanwhile.
bool all_stopped(pid_t pid) {
  char dir[64];
  std::snprintf(dir, sizeof dir, "/proc/%d/task", static_cast<int>(pid));
  DIR *d = opendir(dir);
  if (!d) return false;
  bool all = true, any = false;
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[64 + sizeof e->d_name + 8], buf[512] = {};  // room for any name: no truncation
    std::snprintf(path, sizeof path, "%s/%s/stat", dir, e->d_name);
    FILE *f = std::fopen(path, "r");
    if (!f) continue;
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const char *close = n ? std::strrchr(buf, ')') : nullptr;  // "pid (comm) S ..."
    any = true;
    if (!close || close[1] != ' ' || (close[2] != 'T' && close[2] != 't')) all = false;
  }
  closedir(d);
  return any && all;
}

// A thread opens a handle of an exporter that was stopped (SIGSTOP): it waits for the answer. A
// fork() from another thread meanwhile must not wait for that open (the shim's fork handler takes
// the importer's table lock, which the open must not hold across its socket wait).
int fork_stall() {
  Peer p = spawn("exporter-stall", "fork-stall");
  Job j;
  if (!read_all(p.from, &j, sizeof j)) return 3;
  bool stopped = kill(p.pid, SIGSTOP) == 0;
  const auto stop_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (stopped && !all_stopped(p.pid) && std::chrono::steady_clock::now() < stop_by) usleep(1000);
  out_n("exporter_stopped", stopped && all_stopped(p.pid) ? 1 : 0);
  std::atomic<int> done{0};
  std::atomic<long> opener{0};
  CUresult r = CUDA_ERROR_UNKNOWN;
  CUdeviceptr q = 0;
  std::thread t([&] {
    opener = tid_now();
    r = open_handle(j, j.handle, q);
    done = 1;
  });
  // Until the opener waits in the driver-free part of the open: blocked in poll on the socket. A
  // condition, not a count of pauses: on a loaded machine under ThreadSanitizer the thread took
  // longer than 5,000 one-millisecond pauses to get there. The bound only ends a run whose open
  // never waits (the open itself waits 30 s for the stopped exporter; the case's limit is 90 s).
  bool waiting = false;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (!waiting && !done && std::chrono::steady_clock::now() < give_up) {
    usleep(1000);
    waiting = blocked_in_poll(opener.load());
  }
  out_n("opener_waiting", waiting ? 1 : 0);
  std::fflush(stdout);
  const pid_t c = fork();
  if (c == 0) _exit(0);
  // The fork came back while the open still waits for the stopped exporter (it waits 30 s).
  const int pending = !done.load() && blocked_in_poll(opener.load()) ? 1 : 0;
  int st = 0;
  waitpid(c, &st, 0);
  out_n("fork_returned_while_open_pending", pending);
  out_n("fork_child_exit", WIFEXITED(st) ? WEXITSTATUS(st) : 128);
  kill(p.pid, SIGCONT);
  t.join();
  print_open(j, "open", r);
  if (r == CUDA_SUCCESS) {
    check_pattern("", q, 0, G, j.seed);
    print_open(j, "close", close_handle(j, q));
  }
  ack(p.to);
  out_n("exporter_exit", finish(p));
  return 0;
}

// The broker's address and a well-formed open request for the handle's export.
struct RawTarget {
  sockaddr_un addr{};
  socklen_t len = 0;
  unsigned char req[32] = {'C', 'M', 'G', 'Q', 1, 0, 1, 0};
};
RawTarget raw_target(const unsigned char *handle) {
  RawTarget t;
  char name[80];
  int n = std::snprintf(name, sizeof name, "%ccumemguard-ipc.%u.%016llx", 0, le32(handle + 12),
                        le64(handle + 16));
  t.addr.sun_family = AF_UNIX;
  std::memcpy(t.addr.sun_path, name, static_cast<size_t>(n));
  t.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  std::memcpy(t.req + 8, handle + 24, 8);
  std::memcpy(t.req + 16, handle + 32, 16);
  return t;
}

// One raw open: the reply's status (-1: no reply) and the descriptors that came with it.
// System calls only (it runs in a forked child of a threaded process).
int raw_open(const RawTarget &t, int &nfds) {
  nfds = 0;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr *>(&t.addr), t.len) != 0) {
    close(fd);
    return -1;
  }
  send(fd, t.req, sizeof t.req, MSG_NOSIGNAL);
  unsigned char rep[64] = {};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 64)];
  iovec iov{rep, sizeof rep};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  const ssize_t r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); r > 0 && c; c = CMSG_NXTHDR(&m, c))
    if (c->cmsg_type == SCM_RIGHTS) nfds += static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
  if (r == 64 && rep[0] == 'C' && rep[3] == 'R' && nfds == 0) {
    // An ok reply to an open: the page message with the descriptors follows.
    unsigned char page[1040];
    iovec iov2{page, sizeof page};
    m.msg_iov = &iov2;
    m.msg_controllen = sizeof cbuf;
    if ((rep[6] | rep[7] << 8) == 0 && recvmsg(fd, &m, MSG_CMSG_CLOEXEC) > 0)
      for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_type == SCM_RIGHTS)
          nfds += static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
  }
  close(fd);
  if (r != 64 || std::memcmp(rep, "CMGR", 4) != 0) return -1;
  return rep[6] | rep[7] << 8;
}

// A child of `uid` that runs `body` once the parent writes a byte to its pipe; its result comes
// back as two ints.
struct Child {
  pid_t pid = -1;
  int go = -1, result = -1;
};
template <class Body>
Child child_of_user(int uid, Body &&body) {
  int g[2], r[2];
  if (pipe(g) != 0 || pipe(r) != 0) std::exit(4);
  std::fflush(stdout);
  Child c;
  c.pid = fork_when_blocked("cmg-ipc-broker");
  if (c.pid == 0) {
    close(g[1]);
    close(r[0]);
    int res[2] = {-9, -9};
    char byte;
    if (setgroups(0, nullptr) == 0 && setgid(static_cast<gid_t>(uid)) == 0 &&
        setuid(static_cast<uid_t>(uid)) == 0 && read(g[0], &byte, 1) == 1)
      body(res);
    (void)!write(r[1], res, sizeof res);
    _exit(0);
  }
  close(g[0]);
  close(r[1]);
  c.go = g[1];
  c.result = r[0];
  return c;
}
void run_child(Child &c, int res[2]) {
  (void)!write(c.go, "g", 1);
  res[0] = res[1] = -9;
  read_all(c.result, res, 2 * sizeof(int));
  close(c.go);
  close(c.result);
  waitpid(c.pid, nullptr, 0);
}

// Another user's process connects to the broker in a loop for 2.5 s: every connection is refused,
// and the log says so in a bounded number of lines that count them all.
int flood() {
  if (geteuid() != 0) {
    std::fprintf(stderr, "flood needs root to run a client as another user\n");
    return 77;
  }
  Segment s = segment(1, {0}, 0xf100u);
  CUipcMemHandle h{};
  out("export", export_drv(h, s.v));
  const RawTarget t = raw_target(reinterpret_cast<unsigned char *>(h.reserved));
  // Counts: connections, answers "denied" (4), answers with descriptors (none may come).
  Child c = child_of_user(65534, [&](int res[2]) {
    timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    res[0] = res[1] = 0;
    do {
      int nfds = 0;
      const int st = raw_open(t, nfds);
      res[0] += 1 << 16;  // attempts in the high half, descriptors received in the low half
      res[0] += nfds;
      if (st == 4) ++res[1];
      clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 < 2500 &&
             (res[0] >> 16) < 30000);
  });
  int res[2];
  run_child(c, res);
  out_n("flood_attempts", res[0] >> 16);
  out_n("flood_denied", res[1]);
  out_n("flood_fds", res[0] & 0xffff);
  release(s);
  return 0;
}

// A root exporter drops to another user after its export; a client of that user asks for the
// export with the right nonce: the broker must refuse it (memory exported as root is not handed
// to uid 65534 because the process is 65534 now).
int uid_change() {
  if (geteuid() != 0) {
    std::fprintf(stderr, "uid-change needs root to change users\n");
    return 77;
  }
  Segment s = segment(1, {0}, 0x01d0u);
  CUipcMemHandle h{};
  out("export", export_drv(h, s.v));
  const RawTarget t = raw_target(reinterpret_cast<unsigned char *>(h.reserved));
  Child c = child_of_user(65534, [&](int res[2]) { res[0] = raw_open(t, res[1]); });
  out_n("dropped", setresgid(65534, 65534, 65534) == 0 && setresuid(65534, 65534, 65534) == 0 &&
                           geteuid() == 65534
                       ? 1
                       : 0);
  int res[2];
  run_child(c, res);
  out_n("raw_status", res[0]);
  out_n("raw_fds", res[1]);
  release(s);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 5 && std::string(argv[1]) == "importer")
    return importer(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc == 5 && std::string(argv[1]) == "exporter-exit")
    return exporter_exit(std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc == 5 && std::string(argv[1]) == "exporter-stall")
    return exporter_stall(std::atoi(argv[3]), std::atoi(argv[4]));
  if (argc != 2) {
    std::fprintf(
        stderr,
        "usage: ipc_bridge P11|P12|P13|P14|P15|P15-host|P16|multi|forged|exited|peer-uid|fork|"
        "fd-reuse|fork-stall|flood|uid-change|one-sided\n");
    return 64;
  }
  const std::string c = argv[1];
  init_primary();
  CUmemAllocationProp p = prop_for(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (c == "exited") return exited();
  if (c == "P11" || c == "P12" || c == "one-sided") return vllm_flow(c);
  if (c == "P13") return p13();
  if (c == "P14") return p14();
  if (c == "P15" || c == "P15-host") return p15(c);
  if (c == "P16") return p16();
  if (c == "multi") return multi();
  if (c == "forged") return forged();
  if (c == "peer-uid") return peer_uid();
  if (c == "fork") return forked();
  if (c == "fd-reuse") return fd_reuse();
  if (c == "fork-stall") return fork_stall();
  if (c == "flood") return flood();
  if (c == "uid-change") return uid_change();
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
