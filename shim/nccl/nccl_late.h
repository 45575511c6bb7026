// SPDX-License-Identifier: Apache-2.0
// NCCL entry points newer than the toolkit's nccl.h (2.28.9 here), declared once for the shim,
// the fake NCCL and the test programs. Each is copied from NCCL's own header at the release that
// added it (NVIDIA/nccl, `git show TAG:src/nccl.h.in`), and resolved at run time: a program built
// against 2.28 cannot link them, so the shim answers them through its dlsym hook and its exports
// (a program linked against a newer libnccl reaches the exports through the PLT).
//
//   v2.29.2-1  ncclCommGrow
//   v2.29.7-1  NCCL_SUSPEND_MEM, ncclCommSuspend, ncclCommResume, ncclCommMemStat_t,
//              ncclCommMemStats (src/mem_manager.cc)
#pragma once

#include <nccl.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 2)
/* Grow communicator by adding new ranks. (v2.29.2-1) */
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                          ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                           ncclComm_t *newcomm, ncclConfig_t *config);
#endif

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 29, 7)
/* Communicator suspend flags (v2.29.7-1) */
#define NCCL_SUSPEND_MEM 0x01 /* Suspend memory (release dynamic allocations) */

ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t pncclCommResume(ncclComm_t comm);

/* Communicator memory statistics (v2.29.7-1) */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* Allocated GPU memory that can be suspended (bytes) */
  ncclStatGpuMemSuspended = 1, /* GPU memory suspended? (0=active, 1=suspended) */
  ncclStatGpuMemPersist = 2,   /* Allocated GPU memory that cannot be suspended (bytes) */
  ncclStatGpuMemTotal = 3      /* Total allocated GPU memory tracked by NCCL (bytes) */
} ncclCommMemStat_t;

ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);
ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);
#endif

#ifdef __cplusplus
}
#endif
