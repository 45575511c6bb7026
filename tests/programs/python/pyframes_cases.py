#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Double frees reached from Python in every way the frame reader must follow: ctypes (the GIL
# released during the call), a stale free of an address handed out again, a threading.Thread, a C
# extension (the GIL held), a generator, deep recursion, an exception unwinding through the call,
# threads exiting while another thread's stacks are captured, a native thread with no Python
# frames, code objects made at the address of freed ones, and a crash (SIGSEGV) under Python
# frames; and a snapshot of what is resident, made from Python. Lines marked "# @NAME" are the sites tests/integration/check_pyframes.py expects.
#   pyframes_cases.py CASE [EXTENSION_DIR | libfakecaching.so]
import ctypes
import gc
import sys
import threading

rt = ctypes.CDLL("libcudart.so.13")


def alloc():
    p = ctypes.c_void_p(0)
    rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))  # @malloc
    return p


def free_buffer(p):
    return rt.cudaFree(p)  # @free


def case_ctypes():
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    free_buffer(p)  # @second-call


def case_stale():
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    q = alloc()
    free_buffer(p)  # @second-call
    free_buffer(q)


def worker(p):
    free_buffer(p)  # @thread-call


def case_thread():
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    t = threading.Thread(target=worker, args=(p,))
    t.start()
    t.join()


def ext_free(ext, p):
    ext.free(p.value)  # @ext-call


def case_exit(ext):
    # CUDA calls in a C atexit handler, after the interpreter has been finalized.
    free_buffer(alloc())
    ext.double_free_at_exit()


def case_cext(ext):
    p = alloc()  # @alloc-call
    ext_free(ext, p)  # @first-call
    ext_free(ext, p)  # @second-call
    ext.native_thread_double_free()


def freeing_generator(p):
    yield 1
    free_buffer(p)  # @gen-first
    yield 2
    free_buffer(p)  # @gen-second
    yield 3


def case_generator():
    p = alloc()  # @alloc-call
    g = freeing_generator(p)
    next(g)
    next(g)  # @first-call
    next(g)  # @second-call


def recurse(n, p):
    if n == 0:
        return free_buffer(p)  # @deep-call
    return recurse(n - 1, p)  # @recurse-call


def case_recursion():
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    recurse(200, p)


def raising(p):
    try:
        raise RuntimeError("unwinding")
    finally:
        free_buffer(p)  # @finally-call


def case_exception():
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    try:
        raising(p)  # @raising-call
    except RuntimeError:
        pass


def short_lived():
    pass


def case_thread_exit():
    # Threads start and exit (their thread states come and go from the interpreter's list) while
    # this thread allocates and frees, each call a captured stack.
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            ts = [threading.Thread(target=short_lived) for _ in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()

    c = threading.Thread(target=churn)
    c.start()
    for _ in range(200):
        free_buffer(alloc())
    p = alloc()  # @alloc-call
    free_buffer(p)  # @first-call
    free_buffer(p)  # @second-call
    stop.set()
    c.join()


GENERATED = "def {name}(p):\n    return free_buffer(p)\n"


def case_reused_code():
    # Functions exec'd one after another from one source shape, each freed before the next is
    # made: pymalloc hands a freed code object's block out again, so a later function's code
    # object lives at an earlier one's address, running at the same instruction addresses. Each
    # double free must name its own function; the case says how many addresses were reused.
    seen, reused = [], 0
    for i in range(6):
        ns = {"free_buffer": free_buffer}
        exec(compile(GENERATED.format(name=f"generated_{i}"), "generated.py", "exec"), ns)
        fn = ns[f"generated_{i}"]
        reused += id(fn.__code__) in seen
        seen.append(id(fn.__code__))
        p = alloc()  # @alloc-call
        fn(p)  # @first-call
        fn(p)  # @second-call
        del ns, fn
        gc.collect()
    print("reused code addresses", reused)


# Run in a sub-interpreter (its frames are those of "<string>": line k of this text is line k).
SUB = """  # @sub-start
import ctypes
rt = ctypes.CDLL("libcudart.so.13")
def sub_free(p):
    return rt.cudaFree(p)  # @sub-free
def sub_main():
    p = ctypes.c_void_p(0)
    rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))
    sub_free(p)  # @sub-first
    sub_free(p)  # @sub-second
sub_main()  # @sub-module
"""


def case_subinterpreter():
    # This thread's stacks were captured in the main interpreter first; then it runs a
    # sub-interpreter, which has a thread state of its own on this thread: the double free there
    # is named by the sub-interpreter's frames.
    free_buffer(alloc())
    try:
        import _interpreters as subs  # 3.13+
        run = lambda i: subs.exec(i, SUB)
        make = lambda: subs.create("legacy")
    except ImportError:
        try:
            import _xxsubinterpreters as subs  # 3.10-3.12
        except ImportError:
            print("no sub-interpreters")
            return
        run = lambda i: subs.run_string(i, SUB)
        make = (lambda: subs.create(isolated=False)) if sys.version_info >= (3, 12) else subs.create
    iid = make()
    run(iid)
    subs.destroy(iid)
    free_buffer(alloc())  # @after-call


MANY = 20000  # more code objects than the reader's look-up table has slots (16,384)


def case_many_code():
    # MANY functions each allocate and free once, then the first quarter again: every code object
    # is interned once, however full the look-up table is (one pycode record each).
    src = "".join(f"def many_{i}():\n    free_buffer(alloc())\n" for i in range(MANY))
    ns = {"free_buffer": free_buffer, "alloc": alloc}
    exec(compile(src, "many_functions.py", "exec"), ns)
    fns = [ns[f"many_{i}"] for i in range(MANY)]
    for fn in fns + fns[:MANY // 4]:
        fn()


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def case_nccl_free():
    # Frees while a communicator is live are classified by their native frames (a cache flush or
    # not). These three are not flushes, and with stacks off no stack of theirs is kept: their
    # Python frames must not be read (no pycode record of their functions).
    nccl = ctypes.CDLL("libnccl.so.2")
    uid = NcclUniqueId()
    comm = ctypes.c_void_p(0)
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    for _ in range(3):
        free_buffer(alloc())
    # A flush of a PyTorch-shaped cache (its emptyCache frame): that stack is kept, with the
    # Python line that asked for it.
    cache = ctypes.CDLL(sys.argv[2])
    p = ctypes.c_void_p(0)
    assert cache.fakecache_malloc(ctypes.byref(p), ctypes.c_size_t(1 << 20), None) == 0
    cache.fakecache_free(p, ctypes.c_size_t(1 << 20))
    cache.fakecache_empty_cache()  # @flush-call
    assert nccl.ncclCommDestroy(comm) == 0


def case_resident():
    # A snapshot (the C API, through ctypes) while alloc()'s memory is live: its resident site is
    # alloc's line, the innermost frame of this file. One before it, for report --diff.
    snap = getattr(ctypes.CDLL(None), "cumemguard_snapshot", None)  # None without the shim
    if snap:
        snap.restype = ctypes.c_size_t
        snap.argtypes = [ctypes.c_char_p]
        print("snapshot", snap(b"before"))
    p = alloc()  # @alloc-call
    if snap:
        print("snapshot", snap(b"resident"))
    free_buffer(p)


def crash_here():
    return ctypes.string_at(0)  # @crash


def case_crash():
    # A fatal signal under a Python frame no earlier stack had: the crash record names it.
    free_buffer(alloc())
    crash_here()  # @crash-call


def main():
    case = sys.argv[1]
    if case in ("cext", "exit"):
        sys.path.insert(0, sys.argv[2])
        import cmg_pyext
        globals()["case_" + case](cmg_pyext)
    else:
        globals()["case_" + case.replace("-", "_")]()
    print("done", case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
