// SPDX-License-Identifier: Apache-2.0
// Runs the sequences of real-driver.md rows D1-D23, the one-host IPC rows of section 2 and the
// stream-capture rows C1-C17 of section 7 (conformance_capture.cpp) and prints one stable line per
// row, so that the fake driver and the real one can be compared.
//
// A plain driver-API program: no kernels, no runtime, nothing of the fake's control API. Built
// against NVIDIA's headers and the stub libcuda.so, it runs on whatever libcuda.so.1 the loader
// finds (the fake with LD_LIBRARY_PATH, the real driver on the GPU machine). Exit status 77 means
// there is no usable driver or device (the suites count it as a skip).
#include <cuda.h>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "conformance.h"
#include "cuda_check.h"

const char *en(CUresult r) {
  const char *s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) {
    static char buf[32];
    std::snprintf(buf, sizeof buf, "CUresult(%d)", static_cast<int>(r));
    return buf;
  }
  return s;
}

void row(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::putchar('\n');
  std::fflush(stdout);
}

namespace {

// A call that the rows need to succeed; anything else means the machine cannot run them.
void must(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return;
  std::fprintf(stderr, "conformance: %s -> %s\n", what, en(r));
  std::exit(r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_STUB_LIBRARY ||
                    r == CUDA_ERROR_NOT_INITIALIZED || r == CUDA_ERROR_INVALID_DEVICE
                ? 77
                : 1);
}
#define MUST(call) must((call), #call)

const char *which(CUcontext c, CUcontext primary, CUcontext other) {
  return c == primary ? "primary" : c == other ? "other" : c ? "unknown" : "none";
}

// real-driver.md section 5: cuCtxCreate pushes the new context, and cuCtxSetCurrent(NULL) pops
// the thread's stack (the primary context below is current again, not none). Leaves the primary
// context current.
void context_stack_row(CUcontext primary, CUdevice dev) {
  CUcontext other = nullptr, now = nullptr;
  const CUresult c = cuCtxCreate(&other, nullptr, 0, dev);
  MUST(cuCtxGetCurrent(&now));
  const char *after_create = which(now, primary, other);
  const CUresult s = cuCtxSetCurrent(other);
  const CUresult n = cuCtxSetCurrent(nullptr);
  MUST(cuCtxGetCurrent(&now));
  const char *after_null = which(now, primary, other);
  const CUresult d = other ? cuCtxDestroy(other) : CUDA_ERROR_INVALID_CONTEXT;
  MUST(cuCtxSetCurrent(primary));
  row("CTX1 create %s current %s set-other %s set-null %s current %s destroy %s", en(c),
      after_create, en(s), en(n), after_null, en(d));
}

CUresult set_rw(CUdeviceptr p, size_t size) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(p, size, &d, 1);
}

// ---- the child: forked before any CUDA call, it plays the importing process -------------------

struct Msg {
  size_t size;         // of the VMM allocation behind the descriptor
  CUipcMemHandle ipc;  // a legacy handle of cuMemAlloc memory filled with 0x5a
};

void send_msg(int s, int fd, const void *data, size_t len) {
  msghdr m{};
  iovec io{const_cast<void *>(data), len};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  if (sendmsg(s, &m, 0) < 0) std::perror("conformance: sendmsg");
}

int recv_msg(int s, void *data, size_t len) {
  msghdr m{};
  iovec io{data, len};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  if (recvmsg(s, &m, MSG_WAITALL) <= 0) return -2;
  int fd = -1;
  cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (c && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// The child's rows travel back as text; the parent prints them in place.
std::string child_rows(int fd, const Msg &m) {
  std::string out;
  auto add = [&out](const char *fmt, ...) __attribute__((format(printf, 2, 3))) {
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    out += line;
    out += '\n';
  };
  CUresult r;
  CUdevice dev;
  CUcontext ctx;
  if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuDevicePrimaryCtxRetain(&ctx, dev)) ||
      (r = cuCtxSetCurrent(ctx))) {
    add("IPC-child setup %s", en(r));
    return out;
  }
  // Section 2: POSIX fd over SCM_RIGHTS -> import -> reserve -> map -> set access; data verified.
  CUmemGenericAllocationHandle h = 0;
  CUresult ri = cuMemImportFromShareableHandle(
      &h, reinterpret_cast<void *>(static_cast<intptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  const char *data = "not-checked";
  CUresult rm = CUDA_ERROR_UNKNOWN, ra = CUDA_ERROR_UNKNOWN;
  if (ri == CUDA_SUCCESS) {
    CUdeviceptr p = 0;
    MUST(cuMemAddressReserve(&p, m.size, 0, 0, 0));
    rm = cuMemMap(p, m.size, 0, h, 0);
    ra = rm == CUDA_SUCCESS ? set_rw(p, m.size) : rm;
    if (ra == CUDA_SUCCESS) {
      std::vector<unsigned> v(m.size / 4);
      data = cuMemcpyDtoH(v.data(), p, m.size) == CUDA_SUCCESS ? "data-ok" : "data-copy-failed";
      for (unsigned x : v)
        if (x != 7u) {
          data = "data-mismatch";
          break;
        }
      cuMemUnmap(p, m.size);
    }
    cuMemRelease(h);
    cuMemAddressFree(p, m.size);
  }
  add("IPC-vmm-posix-fd import %s map %s access %s %s", en(ri), en(rm), en(ra), data);
  if (fd >= 0) close(fd);

  // Section 2: the same legacy handle opened twice gives the same pointer; each open needs a close.
  CUdeviceptr a = 0, b = 0;
  CUresult o1 = cuIpcOpenMemHandle(&a, m.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  CUresult o2 = cuIpcOpenMemHandle(&b, m.ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  const char *bytes = "not-checked";
  if (o1 == CUDA_SUCCESS) {
    unsigned char c[64];
    bytes = cuMemcpyDtoH(c, a, sizeof c) == CUDA_SUCCESS ? "data-ok" : "data-copy-failed";
    for (unsigned char x : c)
      if (x != 0x5a) bytes = "data-mismatch";
  }
  CUresult c1 = o1 == CUDA_SUCCESS ? cuIpcCloseMemHandle(a) : o1;
  CUresult c2 = o2 == CUDA_SUCCESS ? cuIpcCloseMemHandle(b) : o2;
  add("IPC-legacy-open-twice %s %s %s %s close %s %s", en(o1), en(o2),
      o1 == CUDA_SUCCESS && o2 == CUDA_SUCCESS && a == b ? "same-pointer" : "different-pointer",
      bytes, en(c1), en(c2));
  return out;
}

[[noreturn]] void child_main(int s) {
  Msg m{};
  int fd = recv_msg(s, &m, sizeof m);
  std::string out = fd == -2 ? std::string() : child_rows(fd, m);
  size_t n = out.size();
  if (write(s, &n, sizeof n) < 0 || write(s, out.data(), n) < 0) std::perror("conformance: write");
  _exit(0);
}

}  // namespace

int main() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    std::perror("conformance: socketpair");
    return 1;
  }
  std::fflush(stdout);
  pid_t kid = fork();
  if (kid == 0) {
    close(sv[0]);
    child_main(sv[1]);
  }
  close(sv[1]);

  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));

  const CUmemAllocationProp pr = device_prop();
  size_t gmin = 0, grec = 0;
  MUST(cuMemGetAllocationGranularity(&gmin, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  MUST(cuMemGetAllocationGranularity(&grec, &pr, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t G = gmin;

  // D1-D8: map, double unmap, double release, release of 0, double address free.
  {
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr v = 0;
    CUresult c = cuMemCreate(&h, G, &pr, 0);
    CUresult r = cuMemAddressReserve(&v, G, 0, 0, 0);
    CUresult m = cuMemMap(v, G, 0, h, 0);
    CUresult a = set_rw(v, G);
    row("D1 create-reserve-map-access %s %s %s %s", en(c), en(r), en(m), en(a));
    CUresult u1 = cuMemUnmap(v, G);
    row("D2 unmap-mapped %s", en(u1));
    CUresult u2 = cuMemUnmap(v, G);
    row("D3 unmap-again %s", en(u2));
    CUdeviceptr v2 = 0;
    MUST(cuMemAddressReserve(&v2, G, 0, 0, 0));
    CUresult u3 = cuMemUnmap(v2, G);
    row("D4 unmap-never-mapped %s", en(u3));
    MUST(cuMemAddressFree(v2, G));
    CUresult r1 = cuMemRelease(h);
    row("D5 release %s", en(r1));
    CUresult r2 = cuMemRelease(h);
    row("D6 release-again %s", en(r2));
    CUresult r0 = cuMemRelease(0);
    row("D7 release-zero %s", en(r0));
    CUresult f1 = cuMemAddressFree(v, G);
    CUresult f2 = cuMemAddressFree(v, G);
    row("D8 address-free-twice %s %s", en(f1), en(f2));
  }

  // D17: errors are per call; right after D6/D7 a create succeeds.
  {
    CUmemGenericAllocationHandle h = 0;
    CUresult c = cuMemCreate(&h, G, &pr, 0);
    row("D17 create-after-errors %s", en(c));
    if (c == CUDA_SUCCESS) cuMemRelease(h);
  }

  // D9: only whole mappings can be unmapped; D12: mapping onto a mapped range fails.
  {
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUdeviceptr v = 0;
    MUST(cuMemCreate(&h, G, &pr, 0));
    MUST(cuMemAddressReserve(&v, G, 0, 0, 0));
    MUST(cuMemMap(v, G, 0, h, 0));
    MUST(set_rw(v, G));
    CUresult lo = cuMemUnmap(v, G / 2);
    CUresult hi = cuMemUnmap(v + G / 2, G / 2);
    row("D9 unmap-half lower %s upper %s", en(lo), en(hi));
    MUST(cuMemCreate(&h2, G, &pr, 0));
    CUresult m2 = cuMemMap(v, G, 0, h2, 0);
    CUresult rel2 = cuMemRelease(h2);  // the refused handle is still alive and must be released
    row("D12 map-over-mapped %s release-refused-handle %s", en(m2), en(rel2));
    // D11: address free while still mapped.
    CUresult f = cuMemAddressFree(v, G);
    row("D11 address-free-mapped %s", en(f));
    MUST(cuMemUnmap(v, G));
    MUST(cuMemRelease(h));
    MUST(cuMemAddressFree(v, G));
  }

  // D10: unmap of a range that was never reserved (a host allocation, never a device VA).
  {
    void *host = std::aligned_alloc(G, G);
    CUresult u = cuMemUnmap(reinterpret_cast<CUdeviceptr>(host), G);
    row("D10 unmap-never-reserved %s", en(u));
    std::free(host);
  }

  // D13: released while mapped, the memory is still usable until the unmap.
  {
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr v = 0;
    MUST(cuMemCreate(&h, G, &pr, 0));
    MUST(cuMemAddressReserve(&v, G, 0, 0, 0));
    MUST(cuMemMap(v, G, 0, h, 0));
    MUST(set_rw(v, G));
    CUresult rel = cuMemRelease(h);
    CUresult set = cuMemsetD8(v, 0x3c, G);
    unsigned char back[256] = {};
    CUresult cp = cuMemcpyDtoH(back, v + G - sizeof back, sizeof back);
    const char *data = "data-ok";
    for (unsigned char x : back)
      if (x != 0x3c) data = "data-mismatch";
    CUresult un = cuMemUnmap(v, G);
    row("D13 release-while-mapped %s use %s %s %s unmap %s", en(rel), en(set), en(cp), data, en(un));
    MUST(cuMemAddressFree(v, G));
  }

  // D14: address free with the wrong size; D15: address range of a reserved, unmapped range.
  {
    CUdeviceptr v = 0;
    MUST(cuMemAddressReserve(&v, 2 * G, 0, 0, 0));
    CUresult f = cuMemAddressFree(v, G);
    row("D14 address-free-wrong-size %s", en(f));
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult q = cuMemGetAddressRange(&base, &size, v);
    row("D15 address-range-unmapped %s", en(q));
    MUST(cuMemAddressFree(v, 2 * G));
  }

  // D16: retain from a mapped address (after the creating handle was released, as the probe
  // did); the value may or may not equal the creating one. From an unmapped address: refused.
  {
    CUmemGenericAllocationHandle h = 0, rh = 0, bad = 0;
    CUdeviceptr v = 0;
    MUST(cuMemCreate(&h, G, &pr, 0));
    MUST(cuMemAddressReserve(&v, G, 0, 0, 0));
    MUST(cuMemMap(v, G, 0, h, 0));
    MUST(set_rw(v, G));
    CUresult rel = cuMemRelease(h);
    CUresult ret = cuMemRetainAllocationHandle(&rh, reinterpret_cast<void *>(v + 4096));
    CUresult un = cuMemUnmap(v, G);
    CUresult rel2 = ret == CUDA_SUCCESS ? cuMemRelease(rh) : ret;
    CUresult ret2 = cuMemRetainAllocationHandle(&bad, reinterpret_cast<void *>(v));
    row("D16 retain-mapped %s %s same-or-new unmap %s release-retained %s retain-unmapped %s",
        en(rel), en(ret), en(un), en(rel2), en(ret2));
    MUST(cuMemAddressFree(v, G));
  }

  // D18: handle values, address ranges and cuMemAlloc pointers come back after release.
  {
    std::set<unsigned long long> seen;
    int hv = 0, va = 0, lin = 0;
    for (int i = 0; i < 50; ++i) {
      CUmemGenericAllocationHandle h = 0;
      MUST(cuMemCreate(&h, G, &pr, 0));
      hv += !seen.insert(h).second;
      MUST(cuMemRelease(h));
    }
    seen.clear();
    for (int i = 0; i < 50; ++i) {
      CUdeviceptr p = 0;
      MUST(cuMemAddressReserve(&p, G, 0, 0, 0));
      va += !seen.insert(p).second;
      MUST(cuMemAddressFree(p, G));
    }
    seen.clear();
    for (int i = 0; i < 50; ++i) {
      CUdeviceptr p = 0;
      MUST(cuMemAlloc(&p, 1 << 20));
      lin += !seen.insert(p).second;
      MUST(cuMemFree(p));
    }
    row("D18 reuse handle %s va %s cuMemAlloc %s", hv ? "yes" : "no", va ? "yes" : "no",
        lin ? "yes" : "no");
  }

  row("D19 granularity minimum %zu recommended %zu", gmin, grec);

  // D20: range attributes of a pointer in the 2nd chunk of a 4-granule reservation with 2 chunks;
  // D21 and section 2: legacy IPC on VMM memory versus cuMemAlloc memory.
  CUipcMemHandle legacy{};
  CUdeviceptr lin = 0;
  {
    CUmemGenericAllocationHandle h1 = 0, h2 = 0;
    CUdeviceptr v = 0;
    MUST(cuMemCreate(&h1, G, &pr, 0));
    MUST(cuMemCreate(&h2, G, &pr, 0));
    MUST(cuMemAddressReserve(&v, 4 * G, 0, 0, 0));
    MUST(cuMemMap(v, G, 0, h1, 0));
    MUST(cuMemMap(v + G, G, 0, h2, 0));
    MUST(set_rw(v, 2 * G));
    CUdeviceptr start = 0;
    size_t size = 0;
    CUresult s1 = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, v + G + 100);
    CUresult s2 = cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, v + G + 100);
    row("D20 range-of-second-chunk %s %s start base+%lld size %zu-granules", en(s1), en(s2),
        static_cast<long long>(start - v), size / G);
    int vmm_cap = -1, lin_cap = -1;
    cuPointerGetAttribute(&vmm_cap, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, v);
    MUST(cuMemAlloc(&lin, 1 << 20));
    CUresult lc = cuPointerGetAttribute(&lin_cap, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, lin);
    row("D21 legacy-ipc-capable cuMemAlloc %s %d vmm %s", en(lc), lin_cap,
        vmm_cap == 0 || vmm_cap == -1 ? "0-or-unwritten" : "1");
    CUipcMemHandle ih;
    CUresult gv = cuIpcGetMemHandle(&ih, v + 256);
    CUresult gl = cuIpcGetMemHandle(&legacy, lin);
    row("IPC-get-handle vmm %s cuMemAlloc %s", en(gv), en(gl));
    MUST(cuMemsetD8(lin, 0x5a, 1 << 20));
    MUST(cuCtxSynchronize());  // a memset may still run when it returns; the child reads next
    MUST(cuMemUnmap(v, 2 * G));
    MUST(cuMemRelease(h1));
    MUST(cuMemRelease(h2));
    MUST(cuMemAddressFree(v, 4 * G));
  }

  // D22, D23: what the shim asks the driver before it answers a double free or a double release
  // itself (README, findings): an address's range start, live and freed; a handle value's
  // properties, live and released.
  {
    CUdeviceptr p = 0, start = 0;
    MUST(cuMemAlloc(&p, 1 << 20));
    CUresult live = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    CUmemoryPool pool = nullptr;
    CUresult lp = cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p);
    MUST(cuMemFree(p));
    CUdeviceptr after = 0;
    CUresult freed = cuPointerGetAttribute(&after, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
    row("D22 range-start live %s %s pool %s %s freed %s", en(live),
        start == p ? "start-is-ptr" : "start-differs", en(lp), pool ? "set" : "null", en(freed));
    CUmemGenericAllocationHandle h = 0;
    MUST(cuMemCreate(&h, G, &pr, 0));
    CUmemAllocationProp got{};
    CUresult hl = cuMemGetAllocationPropertiesFromHandle(&got, h);
    MUST(cuMemRelease(h));
    CUresult hr = cuMemGetAllocationPropertiesFromHandle(&got, h);
    row("D23 handle-properties live %s released %s", en(hl), en(hr));
  }

  // Section 2 across processes: a VMM allocation exported as a POSIX fd, and the legacy handle.
  {
    const size_t size = 4 * G;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr v = 0;
    MUST(cuMemCreate(&h, size, &pr, 0));
    MUST(cuMemAddressReserve(&v, size, 0, 0, 0));
    MUST(cuMemMap(v, size, 0, h, 0));
    MUST(set_rw(v, size));
    MUST(cuMemsetD32(v, 7u, size / 4));
    MUST(cuCtxSynchronize());
    int fd = -1;
    CUresult ex = cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    row("IPC-vmm-posix-fd export %s", en(ex));
    Msg m{};
    m.size = size;
    m.ipc = legacy;
    send_msg(sv[0], ex == CUDA_SUCCESS ? fd : -1, &m, sizeof m);
    size_t n = 0;
    std::string text;
    if (read(sv[0], &n, sizeof n) == static_cast<ssize_t>(sizeof n) && n < (1 << 20)) {
      text.resize(n);
      size_t got = 0;
      while (got < n) {
        ssize_t k = read(sv[0], &text[got], n - got);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
      text.resize(got);
    }
    int st = 0;
    waitpid(kid, &st, 0);
    std::fputs(text.c_str(), stdout);
    row("IPC-child exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    if (fd >= 0) close(fd);
    MUST(cuMemUnmap(v, size));
    MUST(cuMemRelease(h));
    MUST(cuMemAddressFree(v, size));
    MUST(cuMemFree(lin));
  }
  context_stack_row(ctx, dev);
  capture_rows(ctx);
  return 0;
}
