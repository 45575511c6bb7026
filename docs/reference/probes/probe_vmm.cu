// SPDX-License-Identifier: Apache-2.0
// Probe: real-driver facts for the shim design (error codes, handle reuse, IPC on VMM, implicit sync, latencies).
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <vector>
#include <set>
#define CK(x) do { CUresult _r = (x); if (_r != CUDA_SUCCESS) { const char *s; cuGetErrorName(_r, &s); printf("FAIL %s -> %s line %d\n", #x, s, __LINE__); } } while (0)
static const char *en(CUresult r) { const char *s = "?"; cuGetErrorName(r, &s); return s; }
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static CUmemAllocationProp prop(int handleTypes) {
  CUmemAllocationProp p{}; p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  p.requestedHandleTypes = (CUmemAllocationHandleType)handleTypes; return p;
}
static void setacc(CUdeviceptr p, size_t sz) { CUmemAccessDesc d{}; d.location.type = CU_MEM_LOCATION_TYPE_DEVICE; d.location.id = 0; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE; CK(cuMemSetAccess(p, sz, &d, 1)); }

__global__ void spin(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
__global__ void fill(int *p, int v, size_t n) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) p[i] = v; }
__global__ void check(const int *p, int v, size_t n, int *bad) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n && p[i] != v) atomicAdd(bad, 1); }

static void send_fd(int s, int fd, const void *data, size_t len) {
  struct msghdr m{}; struct iovec io{(void *)data, len}; m.msg_iov = &io; m.msg_iovlen = 1;
  char cbuf[CMSG_SPACE(sizeof(int))]; memset(cbuf, 0, sizeof cbuf);
  if (fd >= 0) { m.msg_control = cbuf; m.msg_controllen = sizeof cbuf; cmsghdr *c = CMSG_FIRSTHDR(&m); c->cmsg_level = SOL_SOCKET; c->cmsg_type = SCM_RIGHTS; c->cmsg_len = CMSG_LEN(sizeof(int)); memcpy(CMSG_DATA(c), &fd, sizeof(int)); }
  if (sendmsg(s, &m, 0) < 0) perror("sendmsg");
}
static int recv_fd(int s, void *data, size_t len) {
  struct msghdr m{}; struct iovec io{data, len}; m.msg_iov = &io; m.msg_iovlen = 1; char cbuf[CMSG_SPACE(sizeof(int))]; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
  if (recvmsg(s, &m, 0) < 0) { perror("recvmsg"); return -1; }
  cmsghdr *c = CMSG_FIRSTHDR(&m); int fd = -1; if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof(int)); return fd;
}

struct Msg { int fd_num; pid_t pid; size_t size; cudaIpcMemHandle_t legacy; };

static void child(int s) {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  Msg m{}; int fd = recv_fd(s, &m, sizeof m);
  printf("[child] got fd=%d (parent fd num %d, pid %d)\n", fd, m.fd_num, m.pid);
  CUmemGenericAllocationHandle h; CUresult r = cuMemImportFromShareableHandle(&h, (void *)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  printf("[child] import via SCM_RIGHTS -> %s\n", en(r));
  if (r == CUDA_SUCCESS) {
    CUdeviceptr p; CK(cuMemAddressReserve(&p, m.size, 0, 0, 0)); CK(cuMemMap(p, m.size, 0, h, 0)); setacc(p, m.size);
    int *bad; cudaMalloc(&bad, 4); cudaMemset(bad, 0, 4); size_t n = m.size / 4; check<<<(n + 255) / 256, 256>>>((int *)p, 7, n, bad); int hb = -1; cudaMemcpy(&hb, bad, 4, cudaMemcpyDeviceToHost);
    printf("[child] VMM import content mismatches=%d\n", hb);
    CK(cuMemUnmap(p, m.size)); CK(cuMemRelease(h)); CK(cuMemAddressFree(p, m.size));
  }
  // pidfd_getfd path
  int pidfd = syscall(SYS_pidfd_open, m.pid, 0);
  int fd2 = pidfd >= 0 ? syscall(SYS_pidfd_getfd, pidfd, m.fd_num, 0) : -1;
  printf("[child] pidfd_open=%d pidfd_getfd=%d errno=%d (%s)\n", pidfd, fd2, errno, strerror(errno));
  // legacy IPC
  void *lp = nullptr; cudaError_t e = cudaIpcOpenMemHandle(&lp, m.legacy, cudaIpcMemLazyEnablePeerAccess);
  printf("[child] legacy cudaIpcOpenMemHandle -> %s\n", cudaGetErrorName(e));
  if (e == cudaSuccess) {
    // open again: ref counted?
    void *lp2 = nullptr; cudaError_t e2 = cudaIpcOpenMemHandle(&lp2, m.legacy, cudaIpcMemLazyEnablePeerAccess);
    printf("[child] legacy open twice -> %s same=%d\n", cudaGetErrorName(e2), lp2 == lp);
    printf("[child] close -> %s\n", cudaGetErrorName(cudaIpcCloseMemHandle(lp)));
    if (e2 == cudaSuccess) printf("[child] close2 -> %s\n", cudaGetErrorName(cudaIpcCloseMemHandle(lp2)));
  }
  char ok = 1; send_fd(s, -1, &ok, 1);
}

int main(int argc, char **argv) {
  int sv[2]; socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  pid_t kid = fork();
  if (kid == 0) { close(sv[0]); child(sv[1]); return 0; }
  close(sv[1]);
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  int drv; cuDriverGetVersion(&drv); printf("driver version %d\n", drv);
  CUmemAllocationProp pr = prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t gran = 0; CK(cuMemGetAllocationGranularity(&gran, &pr, CU_MEM_ALLOC_GRANULARITY_MINIMUM)); size_t rg = 0; CK(cuMemGetAllocationGranularity(&rg, &pr, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  printf("granularity min=%zu recommended=%zu\n", gran, rg);
  // T1: double unmap / double release
  {
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, gran, &pr, 0)); CUdeviceptr p; CK(cuMemAddressReserve(&p, gran, 0, 0, 0)); CK(cuMemMap(p, gran, 0, h, 0)); setacc(p, gran);
    printf("T1 first unmap -> %s\n", en(cuMemUnmap(p, gran)));
    printf("T1 second unmap (double) -> %s\n", en(cuMemUnmap(p, gran)));
    printf("T1 first release -> %s\n", en(cuMemRelease(h)));
    printf("T1 second release (double) -> %s\n", en(cuMemRelease(h)));
    printf("T1 release of 0 -> %s\n", en(cuMemRelease(0)));
    CUmemGenericAllocationHandle h2; printf("T1 create after errors -> %s\n", en(cuMemCreate(&h2, gran, &pr, 0)));
    printf("T1 cudaGetLastError after -> %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("T1 map into freed-handle slot with new handle -> %s\n", en(cuMemMap(p, gran, 0, h2, 0)));
    printf("T1 unmap partial (half) -> %s\n", en(cuMemUnmap(p, gran / 2)));
    printf("T1 unmap full -> %s\n", en(cuMemUnmap(p, gran)));
    CK(cuMemRelease(h2));
    printf("T1 address free -> %s ; double address free -> %s\n", en(cuMemAddressFree(p, gran)), en(cuMemAddressFree(p, gran)));
    printf("T1 unmap of never-reserved address -> %s\n", en(cuMemUnmap((CUdeviceptr)0x7f0000000000ull, gran)));
  }
  // T2: handle value reuse
  {
    std::set<unsigned long long> seen; int reused = 0; CUmemGenericAllocationHandle prev = 0;
    for (int i = 0; i < 50; i++) { CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, gran, &pr, 0)); if (seen.count(h)) reused++; if (i < 4) printf("T2 handle[%d]=0x%llx\n", i, (unsigned long long)h); seen.insert(h); prev = h; CK(cuMemRelease(h)); }
    printf("T2 handle values reused after release: %d of 50\n", reused);
    std::vector<CUdeviceptr> vas; int vreuse = 0; std::set<CUdeviceptr> vs;
    for (int i = 0; i < 50; i++) { CUdeviceptr p; CK(cuMemAddressReserve(&p, gran, 0, 0, 0)); if (vs.count(p)) vreuse++; vs.insert(p); CK(cuMemAddressFree(p, gran)); }
    printf("T2 VA reused after free: %d of 50\n", vreuse);
    int preuse = 0; std::set<CUdeviceptr> ps; for (int i = 0; i < 50; i++) { CUdeviceptr p; CK(cuMemAlloc(&p, 1 << 20)); if (ps.count(p)) preuse++; ps.insert(p); CK(cuMemFree(p)); }
    printf("T2 cuMemAlloc ptr reused after free: %d of 50\n", preuse);
  }
  // T3: release while mapped, then unmap
  {
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, gran, &pr, 0)); CUdeviceptr p; CK(cuMemAddressReserve(&p, gran, 0, 0, 0)); CK(cuMemMap(p, gran, 0, h, 0)); setacc(p, gran);
    printf("T3 release while mapped -> %s\n", en(cuMemRelease(h)));
    CUmemGenericAllocationHandle rh; printf("T3 retain handle of mapped ptr -> %s (h=0x%llx rh=0x%llx)\n", en(cuMemRetainAllocationHandle(&rh, (void *)p)), (unsigned long long)h, (unsigned long long)rh);
    printf("T3 unmap after release -> %s\n", en(cuMemUnmap(p, gran)));
    printf("T3 release retained -> %s\n", en(cuMemRelease(rh)));
    CK(cuMemAddressFree(p, gran));
  }
  // T4: IPC on VMM, pointer attributes
  {
    size_t sz = 2 * gran; CUmemGenericAllocationHandle h1, h2; CK(cuMemCreate(&h1, gran, &pr, 0)); CK(cuMemCreate(&h2, gran, &pr, 0));
    CUdeviceptr p; CK(cuMemAddressReserve(&p, 4 * gran, 0, 0, 0)); CK(cuMemMap(p, gran, 0, h1, 0)); CK(cuMemMap(p + gran, gran, 0, h2, 0)); setacc(p, sz);
    cudaIpcMemHandle_t ih; cudaError_t e = cudaIpcGetMemHandle(&ih, (void *)(p + 256)); printf("T4 cudaIpcGetMemHandle(VMM+256) -> %s\n", cudaGetErrorName(e)); cudaGetLastError();
    CUipcMemHandle dh; printf("T4 cuIpcGetMemHandle(VMM) -> %s\n", en(cuIpcGetMemHandle(&dh, p)));
    int cap = -1; printf("T4 IS_LEGACY_CUDA_IPC_CAPABLE(VMM) -> %s val=%d\n", en(cuPointerGetAttribute(&cap, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p)), cap);
    CUdeviceptr st = 0; size_t rs = 0; cuPointerGetAttribute(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + gran + 100); cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + gran + 100);
    printf("T4 RANGE_START for 2nd chunk = base+%lld size=%zu (gran=%zu)\n", (long long)(st - p), rs, gran);
    CUdeviceptr ab = 0; size_t as = 0; printf("T4 cuMemGetAddressRange(2nd chunk) -> %s base+%lld size=%zu\n", en(cuMemGetAddressRange(&ab, &as, p + gran + 100)), (long long)(ab - p), as);
    unsigned long long mh = 0; int isvmm = -1; printf("T4 MAPPED attr -> %s\n", en(cuPointerGetAttribute(&isvmm, CU_POINTER_ATTRIBUTE_MAPPED, p)));
    printf("T4 ALLOWED_HANDLE_TYPES -> %s val=%llu\n", en(cuPointerGetAttribute(&mh, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p)), mh);
    void *cm; cudaMalloc(&cm, 1 << 20); cap = -1; cuPointerGetAttribute(&cap, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, (CUdeviceptr)cm); printf("T4 IS_LEGACY_CUDA_IPC_CAPABLE(cudaMalloc) = %d\n", cap);
    unsigned long long t2 = 0; cuPointerGetAttribute(&t2, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, (CUdeviceptr)cm); printf("T4 ALLOWED_HANDLE_TYPES(cudaMalloc) = %llu\n", t2);
    CK(cuMemUnmap(p, sz)); CK(cuMemRelease(h1)); CK(cuMemRelease(h2)); CK(cuMemAddressFree(p, 4 * gran)); cudaFree(cm);
  }
  // T5: cross-process export
  {
    size_t sz = 4 * gran; CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, sz, &pr, 0)); CUdeviceptr p; CK(cuMemAddressReserve(&p, sz, 0, 0, 0)); CK(cuMemMap(p, sz, 0, h, 0)); setacc(p, sz);
    fill<<<(sz / 4 + 255) / 256, 256>>>((int *)p, 7, sz / 4); cudaDeviceSynchronize();
    int fd = -1; CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)); printf("T5 exported fd=%d\n", fd);
    void *lm; cudaMalloc(&lm, 1 << 20); Msg m{}; m.fd_num = fd; m.pid = getpid(); m.size = sz; printf("T5 legacy get -> %s\n", cudaGetErrorName(cudaIpcGetMemHandle(&m.legacy, lm)));
    send_fd(sv[0], fd, &m, sizeof m); char ok; recv_fd(sv[0], &ok, 1); int st; waitpid(kid, &st, 0); printf("T5 child exit=%d\n", WEXITSTATUS(st));
    CK(cuMemUnmap(p, sz)); CK(cuMemRelease(h)); CK(cuMemAddressFree(p, sz)); close(fd); cudaFree(lm);
  }
  // T6: latencies
  {
    const int N = 2000; void *q; cudaFree(0);
    double t0 = now(); for (int i = 0; i < N; i++) { cudaMalloc(&q, 2 << 20); cudaFree(q); } double t1 = now();
    printf("T6 cudaMalloc+cudaFree 2MiB: %.2f us/pair\n", (t1 - t0) / N * 1e6);
    t0 = now(); for (int i = 0; i < N; i++) { CUdeviceptr d; cuMemAlloc(&d, 2 << 20); cuMemFree(d); } t1 = now();
    printf("T6 cuMemAlloc+cuMemFree 2MiB: %.2f us/pair\n", (t1 - t0) / N * 1e6);
    t0 = now(); for (int i = 0; i < N; i++) { cudaFree(nullptr); } t1 = now(); printf("T6 cudaFree(nullptr): %.3f us\n", (t1 - t0) / N * 1e6);
    t0 = now(); for (int i = 0; i < 500; i++) { CUmemGenericAllocationHandle h; CUdeviceptr p; cuMemCreate(&h, rg, &pr, 0); cuMemAddressReserve(&p, rg, 0, 0, 0); cuMemMap(p, rg, 0, h, 0); setacc(p, rg); cuMemUnmap(p, rg); cuMemRelease(h); cuMemAddressFree(p, rg); } t1 = now();
    printf("T6 VMM full cycle (create,reserve,map,access,unmap,release,free) %zu B: %.2f us/cycle\n", rg, (t1 - t0) / 500 * 1e6);
    CUdeviceptr p; cuMemAddressReserve(&p, rg, 0, 0, 0); t0 = now(); for (int i = 0; i < N; i++) cuMemUnmap(p, rg); t1 = now(); cuMemAddressFree(p, rg);
    printf("T6 failing cuMemUnmap (not mapped): %.3f us/call\n", (t1 - t0) / N * 1e6);
    int v; t0 = now(); for (int i = 0; i < N * 10; i++) cuDriverGetVersion(&v); t1 = now(); printf("T6 cuDriverGetVersion: %.3f us/call\n", (t1 - t0) / (N * 10) * 1e6);
  }
  // T7: which calls block while a kernel runs on another stream
  {
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); int clk; cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
    long long cyc = (long long)clk * 1000LL / 5; // ~200 ms
    auto measure = [&](const char *name, auto fn) { spin<<<1, 1, 0, s>>>(cyc); usleep(20000); double a = now(); fn(); double b = now(); cudaStreamSynchronize(s); printf("T7 %-40s blocked %.1f ms (kernel ~200ms)\n", name, (b - a) * 1e3); };
    void *x; cudaMalloc(&x, 2 << 20);
    measure("cudaFree(unrelated 2MiB)", [&] { cudaFree(x); });
    measure("cudaMalloc(2MiB)", [&] { cudaMalloc(&x, 2 << 20); });
    CUdeviceptr d; cuMemAlloc(&d, 2 << 20); measure("cuMemFree(unrelated)", [&] { cuMemFree(d); });
    CUmemGenericAllocationHandle h; CUdeviceptr p; cuMemCreate(&h, rg, &pr, 0); cuMemAddressReserve(&p, rg, 0, 0, 0); cuMemMap(p, rg, 0, h, 0); setacc(p, rg);
    measure("cuMemUnmap(unrelated)", [&] { cuMemUnmap(p, rg); });
    measure("cuMemRelease(unrelated)", [&] { cuMemRelease(h); });
    measure("cuMemAddressFree", [&] { cuMemAddressFree(p, rg); });
    measure("cuMemCreate", [&] { cuMemCreate(&h, rg, &pr, 0); });
    measure("cuMemAddressReserve+Map+SetAccess", [&] { cuMemAddressReserve(&p, rg, 0, 0, 0); cuMemMap(p, rg, 0, h, 0); setacc(p, rg); });
    cudaMemPool_t pool; cudaDeviceGetDefaultMemPool(&pool, 0); void *y; cudaMallocAsync(&y, 64 << 20, s); cudaFreeAsync(y, s); cudaStreamSynchronize(s);
    measure("cudaMemPoolTrimTo(0)", [&] { cudaMemPoolTrimTo(pool, 0); });
    measure("cudaFree(nullptr)", [&] { cudaFree(nullptr); });
    void *hp; measure("cudaMallocHost(1MiB)", [&] { cudaMallocHost(&hp, 1 << 20); });
    measure("cudaFreeHost", [&] { cudaFreeHost(hp); });
    void *y2; measure("cudaMallocAsync legacy stream", [&] { cudaMallocAsync(&y2, 1 << 20, 0); });
  }
  printf("DONE\n");
  return 0;
}
