// SPDX-License-Identifier: Apache-2.0
// A program that embeds CPython twice (Py_Initialize, Py_FinalizeEx, Py_Initialize again, as
// plugin hosts and test runners do), each life making a double free from Python through a
// module of the host's own (ctypes is not used: 3.12.1 aborts in `free()` when it is imported
// again after Py_FinalizeEx, without the shim too). Between the two lives it takes a
// thread-specific key of its own, with a value on this thread: the slot the first interpreter's
// key had, so the second interpreter's key is another one.
// Built by tests/integration/check_pyframes.py for each interpreter with a shared libpython.
//   cmg_embed
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static void *runtime(void) {
  static void *h;
  if (!h) h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  return h;
}

// host.malloc() -> the address of 4096 new bytes of device memory (cudaMalloc's status raised)
static PyObject *host_malloc(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  void *h = runtime();
  malloc_fn m = h ? (malloc_fn)dlsym(h, "cudaMalloc") : NULL;
  if (!m) return PyErr_Format(PyExc_RuntimeError, "no cudaMalloc: %s", dlerror());
  void *p = NULL;
  const int rc = m(&p, 4096);
  if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "cudaMalloc: %d", rc);
  return PyLong_FromUnsignedLongLong((uintptr_t)p);
}

// host.free(ptr) -> cudaFree's status, the GIL held
static PyObject *host_free(PyObject *self, PyObject *arg) {
  (void)self;
  void *h = runtime();
  free_fn f = h ? (free_fn)dlsym(h, "cudaFree") : NULL;
  if (!f) return PyErr_Format(PyExc_RuntimeError, "no cudaFree: %s", dlerror());
  const uintptr_t p = (uintptr_t)PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(f((void *)p));
}

static PyMethodDef methods[] = {{"malloc", host_malloc, METH_NOARGS, "cudaMalloc(4096)"},
                                {"free", host_free, METH_O, "cudaFree(ptr)"},
                                {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "host", NULL, -1, methods, NULL, NULL, NULL, NULL};

static PyObject *init_host(void) {
  return PyModule_Create(&module);
}

// Each life's text: the free at line 3, the allocation at line 4, the two calls at lines 5 and 6.
static const char *life(int n) {
  return n == 1 ? "import host\n"
                  "def first_life(p):\n"
                  "    return host.free(p)\n"
                  "p = host.malloc()\n"
                  "first_life(p)\n"
                  "first_life(p)\n"
                : "import host\n"
                  "def second_life(p):\n"
                  "    return host.free(p)\n"
                  "p = host.malloc()\n"
                  "second_life(p)\n"
                  "second_life(p)\n";
}

int main(void) {
  // Zeroes, large enough that a reader taking it for a thread state reads no thread id.
  static long other_value[64];
  pthread_key_t other;
  if (PyImport_AppendInittab("host", init_host) != 0) return 3;
  for (int n = 1; n <= 2; ++n) {
    Py_Initialize();
    const int rc = PyRun_SimpleString(life(n));
    if (Py_FinalizeEx() != 0 || rc != 0) return 1;
    if (n == 1 &&
        (pthread_key_create(&other, NULL) != 0 || pthread_setspecific(other, other_value) != 0))
      return 2;
  }
  printf("done embed\n");
  return 0;
}
