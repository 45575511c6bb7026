// SPDX-License-Identifier: Apache-2.0
// The shim's own threads (the log's flusher, the bridge's broker): detached, so they never keep the
// process alive and exit never waits for them, and started with every signal blocked, so that the
// program's handlers run on the program's threads only.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace cmg::shim {

// pthread_create's status (0 on success).
inline int start_detached_quiet(void *(*fn)(void *), void *arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  const int rc = pthread_create(&t, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

}  // namespace cmg::shim
