// SPDX-License-Identifier: Apache-2.0
// A C extension that frees device memory with the GIL held (as pybind11 bindings and PyTorch's
// own functions do), and a native thread with no Python frames that makes a double free: built by
// tests/integration/check_pyframes.py for each interpreter it tests.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static void *runtime(void) {
  static void *h;
  if (!h) h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_GLOBAL);
  return h;
}

static PyObject *ext_free(PyObject *self, PyObject *arg) {
  (void)self;
  void *h = runtime();
  free_fn f = h ? (free_fn)dlsym(h, "cudaFree") : NULL;
  if (!f) return PyErr_Format(PyExc_RuntimeError, "no cudaFree: %s", dlerror());
  const uintptr_t p = (uintptr_t)PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return NULL;
  return PyLong_FromLong(f((void *)p));  // the GIL stays held
}

static void *native_thread(void *arg) {
  (void)arg;
  void *h = runtime();
  malloc_fn m = (malloc_fn)dlsym(h, "cudaMalloc");
  free_fn f = (free_fn)dlsym(h, "cudaFree");
  void *p = NULL;
  if (m && f && m(&p, 4096) == 0) {
    f(p);
    f(p);
  }
  return NULL;
}

static PyObject *ext_native_thread_double_free(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  pthread_t t;
  Py_BEGIN_ALLOW_THREADS if (pthread_create(&t, NULL, native_thread, NULL) == 0)
      pthread_join(t, NULL);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

// After the interpreter is gone (a C atexit handler runs after Py_FinalizeEx, as static
// destructors of CUDA libraries do): a double free with no Python left to read.
static void double_free_at_exit(void) {
  native_thread(NULL);
}

static PyObject *ext_double_free_at_exit(PyObject *self, PyObject *unused) {
  (void)self;
  (void)unused;
  if (atexit(double_free_at_exit) != 0) return PyErr_Format(PyExc_RuntimeError, "atexit failed");
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"free", ext_free, METH_O, "cudaFree(ptr) with the GIL held"},
                                {"native_thread_double_free", ext_native_thread_double_free,
                                 METH_NOARGS, "a double free from a thread Python never saw"},
                                {"double_free_at_exit", ext_double_free_at_exit, METH_NOARGS,
                                 "a double free in a C atexit handler, after Py_FinalizeEx"},
                                {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "cmg_pyext", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_cmg_pyext(void) {
  return PyModule_Create(&module);
}
