/* SPDX-License-Identifier: Apache-2.0 */
/* cumemguard's C API: transport-aware cache cleanup for programs that adopt it. */
#ifndef CUMEMGUARD_H
#define CUMEMGUARD_H

#include <stddef.h>

/*
 * These functions live in libcumemguard.so, which is preloaded (LD_PRELOAD, `cumemguard run`);
 * a program does not link against it. Look them up at run time and fall back to running the
 * flush yourself when the shim is not there:
 *
 *   C/C++:  f = (cumemguard_maybe_empty_cache_fn)dlsym(RTLD_DEFAULT,
 *                                                     "cumemguard_maybe_empty_cache");
 *   Python: f = ctypes.CDLL(None).cumemguard_maybe_empty_cache   (AttributeError: absent)
 *
 * docs/transport.md describes the whole feature.
 *
 * The contract (the one of seed 000, kept as it was proposed):
 *  - Opportunistic cleanup becomes *suppressed* when an NCCL communicator setup begins (seen by the
 *    shim, counted from the entry of the init call) or when the program announces another
 *    transport with cumemguard_suppress_opportunistic_cleanup(). It stays suppressed for the rest
 *    of the process: destroying every communicator, or a setup that failed, does not end it.
 *  - cumemguard_maybe_empty_cache() runs an optional flush only while not suppressed. The
 *    transition to suppressed waits for a flush already running, so a flush never overlaps the
 *    start of a transport's background work.
 *  - Intentional releases keep calling the allocator directly: this API is only for flushes that
 *    are safe to omit.
 * None of these functions synchronizes the device or waits for other ranks.
 */

#ifdef __cplusplus
extern "C" {
#endif

/* A transport the shim cannot see (UCXX, a custom one) is about to start background work. Call it
 * before starting that work. Returns once a flush running under cumemguard_maybe_empty_cache()
 * on another thread has finished. */
void cumemguard_suppress_opportunistic_cleanup(void);

/* Runs flush(arg) when opportunistic cleanup is not suppressed. Returns 1 when it ran, 0 when it
 * did not (suppressed, or flush is NULL). The result says whether the flush ran, not how many
 * bytes it released. */
int cumemguard_maybe_empty_cache(void (*flush)(void *arg), void *arg);

/* 1 when opportunistic cleanup is suppressed, else 0. */
int cumemguard_opportunistic_cleanup_suppressed(void);

/* Under CUMEMGUARD_OPPORTUNISTIC=defer the shim holds back the frees of cache flushes it sees in
 * an unchanged program; this hands them to the driver now (each one may wait for the device) and
 * returns the bytes released. 0 when nothing is held. */
size_t cumemguard_release_deferred(void);

/* Types for dlsym. */
typedef void (*cumemguard_suppress_opportunistic_cleanup_fn)(void);
typedef int (*cumemguard_maybe_empty_cache_fn)(void (*)(void *), void *);
typedef int (*cumemguard_opportunistic_cleanup_suppressed_fn)(void);
typedef size_t (*cumemguard_release_deferred_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* CUMEMGUARD_H */
