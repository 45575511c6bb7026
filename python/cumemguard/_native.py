# SPDX-License-Identifier: Apache-2.0
"""The C entry points of include/cumemguard.h, found at run time.

The shim's are in the process's global scope when libcumemguard.so is preloaded (LD_PRELOAD,
``cumemguard run``). Without it, the allocator policy comes from libcumemguard_policy.so (the same
C++ policy, without hooks), loaded privately with ctypes; nothing else of the shim is emulated in
C. Only ctypes and json are imported, and only when first needed.
"""
import os
import threading

try:
    from . import _paths
except ImportError:  # the source tree, not built: no library known
    _paths = None

_lock = threading.RLock()  # policy() asks shim() under it


def _after_fork_in_child():
    # A thread of the parent may have held it (loading a library): it does not exist here.
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
_shim = None  # the _Api of the preloaded shim, or False when absent
_policy = None  # the _Api of libcumemguard_policy.so (or of the shim), or False when absent
_policy_error = ""


class _Api:
    """The functions of one library, with their C types set."""

    def __init__(self, lib, origin):
        import ctypes

        self.origin = origin
        self.version = lib.cumemguard_version
        self.version.argtypes, self.version.restype = [], ctypes.c_char_p
        self.torch_alloc_conf = lib.cumemguard_torch_alloc_conf
        self.torch_alloc_conf.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.c_char_p, ctypes.c_size_t]
        self.torch_alloc_conf.restype = ctypes.c_size_t


class _ShimApi(_Api):
    """The shim's C API: the policy functions and the cleanup and counter entry points."""

    FLUSH = None

    def __init__(self, lib):
        import ctypes

        super().__init__(lib, "shim")
        if _ShimApi.FLUSH is None:
            _ShimApi.FLUSH = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        self.maybe_empty_cache = lib.cumemguard_maybe_empty_cache
        self.maybe_empty_cache.argtypes = [_ShimApi.FLUSH, ctypes.c_void_p]
        self.maybe_empty_cache.restype = ctypes.c_int
        self.suppress = lib.cumemguard_suppress_opportunistic_cleanup
        self.suppress.argtypes, self.suppress.restype = [], None
        self.suppressed = lib.cumemguard_opportunistic_cleanup_suppressed
        self.suppressed.argtypes, self.suppressed.restype = [], ctypes.c_int
        self.release_deferred = lib.cumemguard_release_deferred
        self.release_deferred.argtypes, self.release_deferred.restype = [], ctypes.c_size_t
        self.stats_json = lib.cumemguard_stats_json
        self.stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        self.stats_json.restype = ctypes.c_size_t
        self.settings_applied = lib.cumemguard_torch_settings_applied
        self.settings_applied.argtypes = [ctypes.c_char_p]
        self.settings_applied.restype = ctypes.c_int
        self.snapshot = lib.cumemguard_snapshot
        self.snapshot.argtypes, self.snapshot.restype = [ctypes.c_char_p], ctypes.c_size_t


def shim():
    """The preloaded shim's C API, or None."""
    global _shim
    if _shim is None:
        with _lock:
            if _shim is None:
                _shim = _find_shim() or False
    return _shim or None


def _find_shim():
    import ctypes

    try:
        scope = ctypes.CDLL(None)  # dlopen(NULL): the global scope, where a preloaded library is
        scope.cumemguard_maybe_empty_cache  # only the shim has the cleanup entry points
        return _ShimApi(scope)
    except (OSError, AttributeError):
        return None


def policy():
    """The C API that rewrites allocator settings: the shim's, else libcumemguard_policy.so."""
    global _policy, _policy_error
    if _policy is None:
        with _lock:
            if _policy is None:
                _policy = _find_policy() or False
    return _policy or None


def policy_error():
    """Why policy() is None: the libraries looked for."""
    return _policy_error


def _find_policy():
    global _policy_error
    api = shim()
    if api is not None:
        return api
    import ctypes

    tried = []
    for path in _policy_candidates():
        tried.append(path)
        if not os.path.exists(path):
            continue
        try:
            return _Api(ctypes.CDLL(path, mode=os.RTLD_LOCAL), path)
        except (OSError, AttributeError) as e:
            tried[-1] = f"{path} ({e})"
    _policy_error = ("libcumemguard_policy.so not found (looked for: " +
                     (", ".join(tried) or "no path known: the package was not built with meson") +
                     ")")
    return None


def _policy_candidates():
    if _paths is None:
        return []
    here = os.path.dirname(os.path.abspath(__file__))
    near = os.path.normpath(os.path.join(here, _paths.LIBDIR_FROM_PACKAGE, "libcumemguard_policy.so"))
    return [_paths.POLICY] + ([near] if near != _paths.POLICY else [])


def call_json(fn, *args):
    """Calls a C function with snprintf's contract (buf, len) appended; parses its JSON."""
    import ctypes
    import json

    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(*args, buf, size)
        if n < size:
            return json.loads(buf.value.decode("utf-8", "replace"))
        size = n + 1


def encode(s):
    return None if s is None else s.encode("utf-8", "surrogateescape")
