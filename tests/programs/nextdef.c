/* SPDX-License-Identifier: Apache-2.0 */
/* Defines cmg_probe_fn and asks dlsym(RTLD_NEXT) for the next definition of it (libnextbase.so's),
   as OpenMP's tool loader and other interposers do: a dlsym hook that forwards with an ordinary
   call would make RTLD_NEXT relative to the hook and return NULL or loop. */
#define _GNU_SOURCE
#include <dlfcn.h>

int cmg_nextbase_marker(void);

const char *cmg_probe_fn(void) { return "nextdef"; }

const char *nextdef_probe(void) {
  const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "cmg_probe_fn");
  if (!cmg_nextbase_marker() || !next) return "null";
  if (next == cmg_probe_fn) return "self";
  return next();
}
