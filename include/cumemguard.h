/* SPDX-License-Identifier: Apache-2.0 */
/* cumemguard's C API: transport-aware cache cleanup for programs that adopt it, the shim's
 * counters, and PyTorch's allocator settings changed at run time by the shim's own policy.
 * From Python, the `cumemguard` package wraps all of it (docs/python.md). */
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
 *   Python: import cumemguard   (the package finds them, and falls back when they are absent)
 *
 * docs/transport.md describes the cleanup feature, docs/python.md the whole API.
 *
 * The contract (opt-in opportunistic cleanup that steps aside once a transport starts):
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

/* The shim's version ("0.1.0"); the string is static. */
const char *cumemguard_version(void);

/* The shim's counters as one JSON object, for a test that asserts a run had no findings:
 *   {"version":"0.1.0","disabled":false,"findings":{"double-free":1},
 *    "memory":[{"device":0,"kind":"linear","current":1048576,"peak":2097152,"total":3145728}],
 *    "opportunistic_cleanup_suppressed":false}
 * "findings" counts by class (classes without findings are left out); "memory" has one row per
 * device (-1: host or none) and memory kind that ever held a byte, in bytes. Writes the text and a
 * NUL to buf when len is larger than the text; returns the text's length (snprintf's contract: call
 * again with a larger buffer when the result is >= len). */
size_t cumemguard_stats_json(char *buf, size_t len);

/* PyTorch's allocator configuration with overrides applied, by the shim's own parser (the judged
 * release's keys, grammar and precedence, policy/torch_conf), for PyTorch's allocator setter (the
 * one "setter" names for that release).
 *   base:          the configuration in effect, as last passed to the setter; NULL for the one
 *                  PyTorch read from the environment (the variable its common-key parser reads).
 *   overrides:     "expandable_segments:False" (the CUMEMGUARD_TORCH_ALLOC_CONF syntax).
 *   torch_version: the release to judge for ("2.11.0+cu130"); NULL or "" for the release whose
 *                  libraries are loaded, else 2.11.
 * The JSON object written to buf:
 *   {"variable":"PYTORCH_CUDA_ALLOC_CONF"|null,"base":"...","result":"...","restore":"...",
 *    "error":null|"...","expandable_before":true,"expandable_after":false,"changed":true,
 *    "torch_version":"2.11.0","torch_version_source":"...",
 *    "setter":"torch._C._accelerator_setAllocatorSettings","known_problems":["..."]}
 * "result" changes only the overridden tokens of "base", in place; passing "restore" to the
 * setter afterwards gives back every setting "base" had. Both were checked against the model of
 * the setter; when "error" is not null neither may be used. Returns the text's length, as
 * cumemguard_stats_json does. */
size_t cumemguard_torch_alloc_conf(const char *base, const char *overrides,
                                   const char *torch_version, char *buf, size_t len);

/* Tells the shim that `conf` was just passed to PyTorch's allocator setter and accepted, so that
 * its check of the allocator's path (cudaMalloc segments while expandable segments are asked for is
 * a `config` finding) follows run-time changes. Returns 1 when expandable segments are in effect
 * afterwards, 0 when not, -1 when the shim is disabled or models the string as rejected. */
int cumemguard_torch_settings_applied(const char *conf);

/* Writes a snapshot of what is resident now to the event log (docs/log-format.md, `snapshot`):
 * linear and VMM memory by device, kind, state (live, mapped, held, asleep) and creating stack,
 * which `cumemguard report` shows in its "Resident" section and `cumemguard report --diff`
 * compares. `label` names it (NULL: ""). A sleep or wake-up still in progress ends first, with its
 * own snapshot. The models are read in place and the call makes no CUDA call; it takes the model's
 * locks, so do not call it from a signal handler (CUMEMGUARD_SNAPSHOT_SIGNAL is for that).
 * Returns the snapshot's number in this process (1, 2, ...), 0 when none was written (no event
 * log, or the shim is disabled). */
size_t cumemguard_snapshot(const char *label);

/* Types for dlsym. */
typedef void (*cumemguard_suppress_opportunistic_cleanup_fn)(void);
typedef int (*cumemguard_maybe_empty_cache_fn)(void (*)(void *), void *);
typedef int (*cumemguard_opportunistic_cleanup_suppressed_fn)(void);
typedef size_t (*cumemguard_release_deferred_fn)(void);
typedef const char *(*cumemguard_version_fn)(void);
typedef size_t (*cumemguard_stats_json_fn)(char *, size_t);
typedef size_t (*cumemguard_torch_alloc_conf_fn)(const char *, const char *, const char *, char *,
                                                 size_t);
typedef int (*cumemguard_torch_settings_applied_fn)(const char *);
typedef size_t (*cumemguard_snapshot_fn)(const char *);

#ifdef __cplusplus
}
#endif

#endif /* CUMEMGUARD_H */
