# SPDX-License-Identifier: Apache-2.0
"""Optional cache flushes that step aside once a transport is live (the cleanup contract).

With the shim preloaded the shim decides: it sees NCCL communicator setup itself and serialises the
transition with a running flush (include/cumemguard.h). Without it, this module keeps the same
contract in-process, with one limit: it cannot see a communicator being set up, so it counts a
transport as started only when ``suppress_opportunistic_cleanup()`` is called or when an already
imported ``torch.distributed`` reports an initialised process group with an NCCL or UCC backend
(checked at each request, never importing anything).
"""
import os
import sys
import threading

from . import _native


class _Registry:
    """Sticky suppression; a flush holds a share of the registry while it runs."""

    def __init__(self):
        self._cv = threading.Condition()
        self._running = 0
        self._suppressed = False
        self._local = threading.local()

    def suppressed(self):
        return self._suppressed

    def suppress(self):
        """Publishes first, then waits for the flushes already past their check."""
        with self._cv:
            was = self._suppressed
            self._suppressed = True
            if not getattr(self._local, "flushing", False):  # cannot wait for itself
                self._cv.wait_for(lambda: self._running == 0)
        return not was

    def run(self, flush):
        if getattr(self._local, "flushing", False):  # a request from inside its own flush
            if self._suppressed:
                return False
            flush()
            return True
        with self._cv:
            if self._suppressed:
                return False
            self._running += 1
        self._local.flushing = True
        try:
            flush()
        finally:
            self._local.flushing = False
            with self._cv:
                self._running -= 1
                self._cv.notify_all()
        return True


    def after_fork_in_child(self):
        """A flush that another thread of the parent was running never ends in the child: a
        fresh lock, and only this thread's own flush (a fork from inside it) still counted."""
        self._cv = threading.Condition()
        self._running = 1 if getattr(self._local, "flushing", False) else 0


_registry = _Registry()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_registry.after_fork_in_child)


def _transport_started():
    """An initialised NCCL/UCC process group of an already imported torch.distributed."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        if not dist.is_available() or not dist.is_initialized():
            return False
        backend = str(dist.get_backend()).lower()
    except Exception:
        return False
    return "nccl" in backend or "ucc" in backend


def _default_flush():
    try:
        import torch  # the caller asked for PyTorch's flush: torch is in use
    except ImportError as e:
        raise ImportError("cumemguard.maybe_empty_cache() without a flush runs "
                          "torch.cuda.empty_cache() and needs PyTorch, which cannot be imported "
                          f"here ({e}); pass flush= to run another") from e

    torch.cuda.empty_cache()


def maybe_empty_cache(flush=None):
    """Runs an optional cache flush unless opportunistic cleanup is suppressed; returns True if it
    ran, False if it was declined (never how many bytes it released).

    flush: a callable with no arguments; None (the default) runs torch.cuda.empty_cache(), which
    needs PyTorch (ImportError saying so without it). An exception the flush raises reaches the
    caller. Use it for flushes that are safe to omit (between steps, after an evaluation); a
    release the program needs keeps calling torch.cuda.empty_cache() directly. With the shim
    loaded the shim decides, and it declines once it has seen an NCCL communicator set up;
    without it, once suppress_opportunistic_cleanup() was called or an imported torch.distributed
    has an initialised NCCL or UCC process group. Several threads may call it at once."""
    flush = _default_flush if flush is None else flush
    api = _native.shim()
    if api is not None:
        errors = []

        def call(_arg):
            try:
                flush()
            except BaseException as e:  # raised again below, outside the C frame
                errors.append(e)

        cb = _native._ShimApi.FLUSH(call)  # alive for the duration of the call
        ran = bool(api.maybe_empty_cache(cb, None))
        if errors:
            raise errors[0]
        return ran
    if _transport_started():
        _registry.suppress()
    return _registry.run(flush)


def suppress_opportunistic_cleanup():
    """Turns opportunistic cleanup off for the rest of the process: every later
    maybe_empty_cache() declines and returns False. Returns None once every flush already running
    under maybe_empty_cache() on other threads has finished (called from inside a flush, it does
    not wait for itself). Takes no arguments; nothing turns it back on.

    Call it before a transport the shim cannot see (UCXX, a custom one) starts background work,
    or before torch.distributed.init_process_group() without the shim, so that no flush overlaps
    the transport's start. NCCL communicator setup does the same by itself under the shim."""
    api = _native.shim()
    if api is not None:
        api.suppress()
    else:
        _registry.suppress()


def opportunistic_cleanup_suppressed():
    """True once opportunistic cleanup is suppressed in this process (maybe_empty_cache() then
    declines), False before. Takes no arguments."""
    api = _native.shim()
    if api is not None:
        return bool(api.suppressed())
    if _transport_started():
        _registry.suppress()
    return _registry.suppressed()


def release_deferred():
    """Under CUMEMGUARD_OPPORTUNISTIC=defer, hands the frees the shim holds back to the driver now
    and returns their bytes (an int); 0 without the shim or with nothing held. Takes no arguments."""
    api = _native.shim()
    return int(api.release_deferred()) if api is not None else 0
