// SPDX-License-Identifier: Apache-2.0
// NCCL communicator setup reached two ways: through the PLT (linked with -lnccl, like PyTorch) and
// through dlopen + dlsym (ctypes users such as vLLM's pynccl). One rank; an all-reduce is checked.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"

namespace {

struct Api {
  decltype(&ncclGetUniqueId) get_id;
  decltype(&ncclCommInitRank) init;
  decltype(&ncclCommInitRankConfig) init_config;
  decltype(&ncclCommSplit) split;
  decltype(&ncclAllReduce) all_reduce;
  decltype(&ncclCommDestroy) destroy;
};

int run(const Api &a, const char *how) {
  CHECK_CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  ncclResult_t r = a.get_id(&id);
  std::printf("%s.get_id %d\n", how, r);
  ncclComm_t comm = nullptr, child = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  r = a.init_config ? a.init_config(&comm, 1, id, 0, &cfg) : a.init(&comm, 1, id, 0);
  std::printf("%s.init %d\n", how, r);
  if (r != ncclSuccess) return 1;
  if (a.split) std::printf("%s.split %d\n", how, a.split(comm, 0, 0, &child, nullptr));
  const int n = 1024;
  std::vector<float> host(n), back(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i) * 0.5f;
  void *send = nullptr, *recv = nullptr;
  CHECK_CUDA(cudaMalloc(&send, n * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&recv, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(send, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  std::printf("%s.all_reduce %d\n", how, a.all_reduce(send, recv, n, ncclFloat, ncclSum, comm, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaMemcpy(back.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("%s.result_ok %d\n", how, std::memcmp(host.data(), back.data(), n * sizeof(float)) == 0 ? 1 : 0);
  if (child) std::printf("%s.destroy_child %d\n", how, a.destroy(child));
  std::printf("%s.destroy %d\n", how, a.destroy(comm));
  CHECK_CUDA(cudaFree(send));
  CHECK_CUDA(cudaFree(recv));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::string how = argc > 1 ? argv[1] : "plt";
  if (how == "plt") {
    Api a{ncclGetUniqueId, ncclCommInitRank, ncclCommInitRankConfig, ncclCommSplit,
          ncclAllReduce, ncclCommDestroy};
    return run(a, "plt");
  }
  if (how == "ctypes") {
    // What Python's ctypes.CDLL does: a local dlopen, then handle-scoped dlsym per function.
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::fprintf(stderr, "dlopen libnccl.so.2: %s\n", dlerror());
      return 2;
    }
    Api a{};
    a.get_id = reinterpret_cast<decltype(a.get_id)>(dlsym(h, "ncclGetUniqueId"));
    a.init = reinterpret_cast<decltype(a.init)>(dlsym(h, "ncclCommInitRank"));
    a.all_reduce = reinterpret_cast<decltype(a.all_reduce)>(dlsym(h, "ncclAllReduce"));
    a.destroy = reinterpret_cast<decltype(a.destroy)>(dlsym(h, "ncclCommDestroy"));
    Dl_info info{};
    dladdr(reinterpret_cast<void *>(a.init), &info);
    std::printf("ctypes.init_from %s\n", info.dli_fname && std::strstr(info.dli_fname, "cumemguard")
                                              ? "shim" : "nccl");
    return run(a, "ctypes");
  }
  std::fprintf(stderr, "usage: nccl_cases plt|ctypes\n");
  return 64;
}
