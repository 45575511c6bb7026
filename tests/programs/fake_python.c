// SPDX-License-Identifier: Apache-2.0
// A program that looks like a CPython to the shim's frame reader without being one: it exports
// _PyRuntime, Py_Version and the type objects the reader compares with, and makes a double free.
//   fake_python future   a version the reader has no layout for (3.15): native frames, one note
//   fake_python garbage  3.11's layout with this thread's state whose frame points at unmapped
//                        memory: the Python part ends "unreadable", the native frames stay
//   fake_python cycle    a well-formed frame whose `previous` is itself: 64 frames, "truncated"
//   fake_python fork     one well-formed frame; a thread's first captured stack is held inside
//                        the reader's look-up of the interpreter (at its dladdr1 of _PyRuntime,
//                        which this program interposes) while the main thread forks, and the
//                        child captures stacks of its own
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

// 3.11 offsets (shim/pyframes_layout.cpp): _PyRuntime.interpreters.head 40, interp threads.head
// 16, tstate next 8 interp 16 cframe 56 thread_id 152, _PyCFrame.current_frame 8,
// _PyInterpreterFrame f_code 32 previous 48 prev_instr 56 is_entry 68 owner 69, PyCodeObject
// co_firstlineno 72 co_filename 112 co_name 120 co_qualname 128 co_linetable 136
// co_code_adaptive 184, str (compact ASCII) length 16 state 32 data 48, bytes size 16 data 32.
__attribute__((used, visibility("default"))) unsigned char _PyRuntime[4096];
__attribute__((used, visibility("default"))) unsigned long Py_Version = 0x030B02F0;
__attribute__((used, visibility("default"))) unsigned char PyCode_Type[512];
__attribute__((used, visibility("default"))) unsigned char PyUnicode_Type[512];
__attribute__((used, visibility("default"))) unsigned char PyBytes_Type[512];
__attribute__((used, visibility("default"))) unsigned char PyFrame_Type[512];

static _Alignas(16) unsigned char interp[256], tstate[512], cframe[64], frame[128], code[256];
static _Alignas(16) unsigned char filename[64], qualname[64], linetable[64];

static void put(unsigned char *obj, int off, uintptr_t v) {
  memcpy(obj + off, &v, sizeof v);
}

static void str(unsigned char *s, const char *text) {
  put(s, 8, (uintptr_t)PyUnicode_Type);
  put(s, 16, strlen(text));
  const uint32_t state = (1u << 2) | (1u << 5) | (1u << 6);  // kind 1, compact, ascii
  memcpy(s + 32, &state, 4);
  memcpy(s + 48, text, strlen(text) + 1);
}

static void build(int mode) {
  put(_PyRuntime, 40, (uintptr_t)interp);
  put(interp, 16, (uintptr_t)tstate);
  put(tstate, 16, (uintptr_t)interp);
  put(tstate, 56, (uintptr_t)cframe);
  put(tstate, 152, (uintptr_t)pthread_self());
  put(cframe, 8, (uintptr_t)frame);
  if (mode == 'g') {
    put(frame, 32, (uintptr_t)0x10000);  // a code object in unmapped memory
    return;
  }
  put(frame, 32, (uintptr_t)code);
  put(frame, 48, mode == 'c' ? (uintptr_t)frame : 0);  // previous: itself, or none
  put(frame, 56, (uintptr_t)code + 184);  // the first instruction
  put(code, 8, (uintptr_t)PyCode_Type);
  const int32_t first = 7;
  memcpy(code + 72, &first, 4);
  put(code, 112, (uintptr_t)filename);
  put(code, 120, (uintptr_t)qualname);
  put(code, 128, (uintptr_t)qualname);
  put(code, 136, (uintptr_t)linetable);
  str(filename, "fake.py");
  str(qualname, "fake_fn");
  put(linetable, 8, (uintptr_t)PyBytes_Type);
  put(linetable, 16, 2);
  linetable[32] = 0x80 | (13 << 3) | 3;  // NO_COLUMNS, 4 code units, line delta +1
  linetable[33] = 2;                     // svarint +1
}

// fork: the reader's first look-up of the interpreter, held until the child has run.
static pid_t g_parent;
static int g_hold;
static sem_t g_in_lookup, g_release;

int dladdr1(const void *addr, Dl_info *info, void **extra, int flags) {
  static int (*real)(const void *, Dl_info *, void **, int);
  if (!real) real = (int (*)(const void *, Dl_info *, void **, int))dlsym(RTLD_NEXT, "dladdr1");
  if (addr == (const void *)_PyRuntime && g_hold && getpid() == g_parent) {
    g_hold = 0;
    sem_post(&g_in_lookup);
    sem_wait(&g_release);
  }
  return real(addr, info, extra, flags);
}

static void *first_stack(void *arg) {
  (void)arg;
  void *p = NULL;
  if (cudaMalloc(&p, 4096) == 0) cudaFree(p);
  // No reader asked (no shim, or no stacks): the main thread forks all the same, with this thread
  // alive as under the reader (one that had ended unjoined before the fork is a thread leak to
  // ThreadSanitizer in the child, which exits 66 then).
  if (g_hold) {
    g_hold = 0;
    sem_post(&g_in_lookup);
    sem_wait(&g_release);
  }
  return NULL;
}

static int fork_case(void) {
  g_parent = getpid();
  g_hold = 1;
  sem_init(&g_in_lookup, 0, 0);
  sem_init(&g_release, 0, 0);
  pthread_t t;
  if (pthread_create(&t, NULL, first_stack, NULL) != 0) return 70;
  sem_wait(&g_in_lookup);
  const pid_t child = fork();
  if (child == 0) {
    alarm(60);  // a child that hangs ends by SIGALRM, and the parent says so
    void *p = NULL;
    int a = cudaMalloc(&p, 1 << 20), b = cudaFree(p), c = cudaFree(p);
    printf("child: malloc %d free %d free_again %d\n", a, b, c);
    fflush(stdout);
    _exit(0);
  }
  int status = 0;
  const int waited = child > 0 ? waitpid(child, &status, 0) : -1;
  sem_post(&g_release);
  pthread_join(t, NULL);
  if (waited != child)
    printf("fork failed\n");
  else if (WIFSIGNALED(status))
    printf("child: killed by signal %d\n", WTERMSIG(status));
  else
    printf("child: exit %d\n", WEXITSTATUS(status));
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "fork")) {
    build('f');
    return fork_case();
  }
  if (!strcmp(mode, "future"))
    Py_Version = 0x030F00F0;
  else if (!strcmp(mode, "garbage"))
    build('g');
  else if (!strcmp(mode, "cycle"))
    build('c');
  else
    return 64;
  void *p = NULL;
  int a = cudaMalloc(&p, 1 << 20), b = cudaFree(p), c = cudaFree(p);
  printf("malloc %d free %d free_again %d\n", a, b, c);
  return 0;
}
