/* SPDX-License-Identifier: Apache-2.0 */
/* Control and introspection API of the fake CUDA driver (exported from the fake libcuda.so.1). */
#ifndef FAKECUDA_H
#define FAKECUDA_H

/*
 * Test programs reach these with dlsym(RTLD_DEFAULT or a libcuda handle, "fakecuda_...") so that
 * the same program also builds and runs against the real driver, where the lookup returns NULL.
 * The fn typedefs below are for that cast.
 *
 * Environment read by the fake driver (once, at the first driver call):
 *   FAKECUDA_DEVICES=N            devices (1..16, default 1)
 *   FAKECUDA_DEVICE_MEMORY=B      bytes per device, K/M/G suffixes (default 16G)
 *   FAKECUDA_HANDLE_REUSE=0       never re-issue a released handle value (default 1: last released first)
 *   FAKECUDA_RETAIN_SAME=0        cuMemRetainAllocationHandle always issues a new value (default 1: the
 *                                 value of a live handle of the allocation, reference counted, as measured)
 *   FAKECUDA_FABRIC=accept        cuMemCreate accepts CU_MEM_HANDLE_TYPE_FABRIC (its export then fails)
 *   FAKECUDA_FAIL=api:N[+]:ERR,.. the Nth (N+: every from the Nth) call of api fails with ERR
 *                                 (OOM, OUT_OF_MEMORY, INVALID_VALUE, NOT_PERMITTED, NOT_SUPPORTED,
 *                                 INVALID_CONTEXT, NOT_INITIALIZED, or a number); api is an exact
 *                                 export name or a base name covering all its variants
 *   FAKECUDA_FAIL_SEED=S FAKECUDA_FAIL_RATE=P FAKECUDA_FAIL_APIS=api[:ERR],..
 *                                 random failures (default ERR: OUT_OF_MEMORY), deterministic per
 *                                 seed and call order
 *   FAKECUDA_BENCH=1              benchmark mode: linear memory without backing pages, VMM without
 *                                 syscalls, nothing counted; copies refused (README.md)
 *   FAKECUDA_TRACE=path           append "gpa <entry> <symbol> <version> <flags> <export|NULL>" per
 *                                 cuGetProcAddress request and "call <export> <CUresult name>" per
 *                                 other driver call; %p in path expands to the pid
 */

#ifdef __cplusplus
extern "C" {
#endif

struct fakecuda_state {
  unsigned long long linear_allocs;   /* live cuMemAlloc/pitch/managed/async allocations */
  unsigned long long linear_bytes;    /* their requested sizes */
  unsigned long long host_allocs;     /* live cuMemAllocHost/cuMemHostAlloc allocations */
  unsigned long long host_bytes;
  unsigned long long phys_allocs;     /* live VMM physical allocations (created or imported) */
  unsigned long long phys_bytes;
  unsigned long long handle_refs;     /* live handle references (a value retained twice counts 2) */
  unsigned long long handle_values;   /* distinct live handle values */
  unsigned long long reservations;    /* live cuMemAddressReserve ranges */
  unsigned long long reserved_bytes;
  unsigned long long mappings;        /* live cuMemMap mappings */
  unsigned long long mapped_bytes;
  unsigned long long ipc_imports;     /* open legacy IPC imports (distinct pointers) */
  unsigned long long ipc_import_refs; /* open legacy IPC references (each open counts) */
  unsigned long long streams;         /* live streams */
  unsigned long long device_used[16]; /* bytes charged to each device (linear + device VMM) */
};

/* Stream capture and graphs (driver_capture.cpp). */
struct fakecuda_graph_state {
  unsigned long long captures;         /* open captures (invalidated ones included) */
  unsigned long long graphs;           /* live graphs (cuGraphCreate or a successful end of capture) */
  unsigned long long execs;            /* live executable graphs */
  unsigned long long graph_allocs;     /* graph allocations whose address is held */
  unsigned long long graph_live;       /* of those, allocated by a launch and not freed since */
  unsigned long long graph_live_bytes; /* their requested sizes */
};

/* One export's most recent call on the calling thread. */
struct fakecuda_call {
  unsigned long long serial; /* the thread's driver-call count when it was made (see below) */
  int result;                /* the CUresult it returned */
  int injected;              /* 1 when that result was an injected fault (FAKECUDA_FAIL*, inject) */
};

/* The api's nth matching call from now (1 = the next one) returns cuda_error without effect.
 * Returns 0, or -1 for an unknown api, nth < 1 or cuda_error == 0. */
int fakecuda_inject(const char *api, int nth_call_from_now, int cuda_error);
/* Drops every injected and configured failure (FAKECUDA_FAIL and random ones). */
void fakecuda_clear_faults(void);
/* The device is busy (a kernel runs) for ns from now; frees and synchronisations wait for it. */
void fakecuda_set_busy(int dev, unsigned long long ns);
/* Returns 0 and fills *st. */
int fakecuda_get_state(struct fakecuda_state *st);
/* Returns 0 and fills *st. */
int fakecuda_get_graph_state(struct fakecuda_graph_state *st);
/* 1 while a handle value is live (issued and not yet released), else 0. */
int fakecuda_handle_live(unsigned long long value);
/* The allocation id behind a live handle value, or 0. */
unsigned long long fakecuda_handle_allocation(unsigned long long value);
/* The allocation id mapped at virtual address va, or 0 when nothing is mapped there. */
unsigned long long fakecuda_mapping_handle(unsigned long long va);
/* Driver calls (of every export) the calling thread has made so far. */
unsigned long long fakecuda_thread_calls(void);
/* The calling thread's most recent call of the export of that exact name: returns 0 and fills
 * *out, or -1 when this thread never called it. A call made since fakecuda_thread_calls() last
 * returned N has out->serial > N. */
int fakecuda_thread_last_call(const char *exact_name, struct fakecuda_call *out);
/* Faults injected so far in this process (configured, random and fakecuda_inject ones). */
unsigned long long fakecuda_faults_injected(void);
/* How many times the export of that exact name was called (0 for names the fake does not export). */
unsigned long long fakecuda_calls(const char *exact_name);

typedef int (*fakecuda_inject_fn)(const char *, int, int);
typedef void (*fakecuda_clear_faults_fn)(void);
typedef void (*fakecuda_set_busy_fn)(int, unsigned long long);
typedef int (*fakecuda_get_state_fn)(struct fakecuda_state *);
typedef int (*fakecuda_get_graph_state_fn)(struct fakecuda_graph_state *);
typedef int (*fakecuda_handle_live_fn)(unsigned long long);
typedef unsigned long long (*fakecuda_handle_allocation_fn)(unsigned long long);
typedef unsigned long long (*fakecuda_mapping_handle_fn)(unsigned long long);
typedef unsigned long long (*fakecuda_calls_fn)(const char *);
typedef unsigned long long (*fakecuda_thread_calls_fn)(void);
typedef int (*fakecuda_thread_last_call_fn)(const char *, struct fakecuda_call *);
typedef unsigned long long (*fakecuda_faults_injected_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* FAKECUDA_H */
