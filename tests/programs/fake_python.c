// SPDX-License-Identifier: Apache-2.0
// A program that looks like a CPython to the shim's frame reader without being one: it exports
// _PyRuntime, Py_Version and the type objects the reader compares with, and makes a double free.
//   fake_python future   a version the reader has no layout for (3.15): native frames, one note
//   fake_python garbage  3.11's layout with this thread's state whose frame points at unmapped
//                        memory: the Python part ends "unreadable", the native frames stay
//   fake_python cycle    a well-formed frame whose `previous` is itself: 64 frames, "truncated"
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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
  put(frame, 48, (uintptr_t)frame);       // previous: itself
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

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
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
