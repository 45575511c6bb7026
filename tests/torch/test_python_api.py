# SPDX-License-Identifier: Apache-2.0
"""The cumemguard Python package against the stand-in torch (tests/torch/standin), run twice by
run_python_tests.py: without the shim (CMG_TEST_SHIM=0: the in-process fallback and
libcumemguard_policy.so) and with it preloaded (CMG_TEST_SHIM=1: the shim's C API)."""
import ctypes
import os
import subprocess
import sys
import threading
import unittest
import warnings

import cumemguard
import torch

SHIM = os.environ.get("CMG_TEST_SHIM") == "1"
BUILD = os.environ["CMG_TEST_BUILD"]
MiB = 1 << 20
VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
        "PYTORCH_NO_CUDA_MEMORY_CACHING")


def fresh(**env):
    """A process whose allocator read `env` at its first allocation."""
    for v in VARS:
        os.environ.pop(v, None)
    os.environ.update(env)
    torch._reset()


def child_env(**env):
    """This process's environment without the allocator variables a test set, plus `env`."""
    out = {k: v for k, v in os.environ.items() if k not in VARS}
    out.update(env)
    return out


def strings():
    return [s for _api, s in torch.calls]


def settings():
    return torch.cuda.memory._snapshot()["allocator_settings"]


class Import(unittest.TestCase):
    def test_every_public_function_has_a_docstring(self):
        # help(cumemguard) shows them: each name of __all__, and each public method of a class.
        import inspect
        for name in cumemguard.__all__:
            obj = getattr(cumemguard, name)
            doc = obj.__doc__ or ""  # its own, not one inherited
            self.assertGreater(len(doc.split()), 5, f"cumemguard.{name} has no docstring")
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and callable(f):
                        self.assertTrue(inspect.getdoc(f), f"cumemguard.{name}.{m}")
        text = subprocess.run([sys.executable, "-c", "import cumemguard; help(cumemguard)"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PAGER="cat"),
                              check=True).stdout
        for phrase in ("returns True if it", "Turns opportunistic cleanup off"):
            self.assertIn(phrase, text)

    def test_import_is_light(self):
        code = ("import sys, cumemguard\n"
                "print(sorted(m for m in ('torch', 'ctypes', 'json') if m in sys.modules))")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             check=True, timeout=120).stdout.strip()
        self.assertEqual(out, "[]")

    def test_without_torch_the_error_says_torch_is_needed(self):
        """The README's snippet on a machine without PyTorch: an ImportError that names what
        needs it, not a bare "No module named 'torch'" from inside the package."""
        code = ("import sys\n"
                "sys.modules['torch'] = None  # not importable, even where PyTorch is installed\n"
                "import cumemguard\n"
                "for call in (lambda: cumemguard.expandable_segments(False).__enter__(),\n"
                "             lambda: cumemguard.allocator_settings('max_split_size_mb:64')"
                ".__enter__(),\n"
                "             lambda: cumemguard.maybe_empty_cache()):\n"
                "    try:\n"
                "        call()\n"
                "    except ImportError as e:\n"
                "        print(str(e).split(' (')[0])\n"
                "print(cumemguard.maybe_empty_cache(flush=lambda: None))\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.splitlines(), [
            "cumemguard.expandable_segments changes PyTorch's allocator settings and needs "
            "PyTorch, which cannot be imported here",
            "cumemguard.allocator_settings changes PyTorch's allocator settings and needs "
            "PyTorch, which cannot be imported here",
            "cumemguard.maybe_empty_cache() without a flush runs torch.cuda.empty_cache() and "
            "needs PyTorch, which cannot be imported here",
            "True"])

    def test_active(self):
        info = cumemguard.active()
        self.assertEqual(bool(info), SHIM)
        self.assertEqual(info.loaded, SHIM)
        self.assertEqual(info.version, "0.1.0" if SHIM else None)
        self.assertEqual(repr(info), f"ShimInfo(loaded={SHIM}, version={info.version!r})")


class ExpandableSegments(unittest.TestCase):
    """The scoped guard's cases: the setter gets the full configuration, one token changed, and the full
    original back; the allocator state after the block equals the state before it."""

    def run_block(self, env, expect_inside, expect_after=None):
        fresh(**env)
        before = settings()
        with cumemguard.expandable_segments(False) as block:
            inside = settings()
            self.assertEqual(strings(), expect_inside)
        self.assertEqual(strings(), expect_inside + (expect_after or []))
        self.assertEqual(settings(), before)
        return before, inside, block

    def test_mixed_legacy_configuration(self):
        conf = ("max_split_size_mb:512,roundup_power2_divisions:4,"
                "garbage_collection_threshold:0.8,expandable_segments:True")
        before, inside, block = self.run_block(
            {"PYTORCH_CUDA_ALLOC_CONF": conf},
            [conf.replace("expandable_segments:True", "expandable_segments:False")], [conf])
        self.assertTrue(before["expandable_segments"])
        self.assertFalse(inside["expandable_segments"])
        for k in ("max_split_size", "roundup_power2_divisions", "garbage_collection_threshold"):
            self.assertEqual(inside[k], before[k], k)
        self.assertEqual(inside["max_split_size"], 512 * MiB)
        self.assertEqual(inside["garbage_collection_threshold"], 0.8)
        self.assertEqual(block.plan["variable"], "PYTORCH_CUDA_ALLOC_CONF")
        # The accelerator setter, without the deprecated wrapper's FutureWarning.
        self.assertEqual({api for api, _s in torch.calls}, {"accelerator"})

    def test_unified_variable_only(self):
        conf = "expandable_segments:True,max_split_size_mb:256"
        _before, inside, block = self.run_block(
            {"PYTORCH_ALLOC_CONF": conf}, ["expandable_segments:False,max_split_size_mb:256"],
            [conf])
        self.assertEqual(block.plan["variable"], "PYTORCH_ALLOC_CONF")
        self.assertEqual(inside["max_split_size"], 256 * MiB)

    def test_empty_legacy_variable_shadows_the_unified_one(self):
        # PyTorch reads the present but empty PYTORCH_CUDA_ALLOC_CONF: nothing is expandable.
        self.run_block({"PYTORCH_CUDA_ALLOC_CONF": "",
                        "PYTORCH_ALLOC_CONF": "expandable_segments:True"}, [])
        self.assertFalse(settings()["expandable_segments"])

    def test_bracketed_roundup_power2_divisions(self):
        conf = "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True"
        _b, inside, _blk = self.run_block(
            {"PYTORCH_CUDA_ALLOC_CONF": conf},
            ["roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:False"], [conf])
        self.assertEqual(inside["roundup_power2_divisions"], "[256:1,512:2,>:4]")

    def test_exception_inside_the_block(self):
        conf = "garbage_collection_threshold:0.7,expandable_segments:True"
        fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
        before = settings()
        with self.assertRaises(KeyError):
            with cumemguard.expandable_segments(False):
                self.assertFalse(settings()["expandable_segments"])
                raise KeyError("capture failed")
        self.assertEqual(strings(), ["garbage_collection_threshold:0.7,expandable_segments:False",
                                     conf])
        self.assertEqual(settings(), before)

    def test_nested_use(self):
        conf = "expandable_segments:True,max_split_size_mb:256"
        off = "expandable_segments:False,max_split_size_mb:256"
        fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
        before = settings()
        with cumemguard.expandable_segments(False):
            with cumemguard.expandable_segments(False) as inner:  # already off: a no-op
                self.assertFalse(inner.applied)
                self.assertEqual(strings(), [off])
            with cumemguard.expandable_segments(True):  # on again inside
                self.assertTrue(settings()["expandable_segments"])
                self.assertEqual(strings(), [off, conf])
            self.assertEqual(strings(), [off, conf, off])
            self.assertFalse(settings()["expandable_segments"])
        self.assertEqual(strings(), [off, conf, off, conf])
        self.assertEqual(settings(), before)

    def test_not_in_effect_is_a_no_op(self):
        fresh(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64")
        with cumemguard.expandable_segments(False) as b:
            self.assertFalse(b.applied)
        fresh()
        with cumemguard.expandable_segments(False):
            pass
        fresh(PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync,expandable_segments:True")
        with cumemguard.expandable_segments(False):
            pass
        self.assertEqual(strings(), [])

    def test_turning_them_on_is_undone(self):
        # The setter keeps expandable_segments when a string omits it: the restore names it.
        fresh(PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:64")
        before = settings()
        with cumemguard.expandable_segments(True):
            self.assertTrue(settings()["expandable_segments"])
        self.assertEqual(strings(), ["max_split_size_mb:64,expandable_segments:True",
                                     "max_split_size_mb:64,expandable_segments:False"])
        after = settings()
        self.assertEqual({k: v for k, v in after.items() if k != "PYTORCH_CUDA_ALLOC_CONF"},
                         {k: v for k, v in before.items() if k != "PYTORCH_CUDA_ALLOC_CONF"})

    def test_deprecated_setter_where_the_accelerator_one_is_missing(self):
        fresh(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        saved = torch._C._accelerator_setAllocatorSettings
        del torch._C._accelerator_setAllocatorSettings
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the stand-in of 2.9 has no warning to give
                with cumemguard.expandable_segments(False):
                    pass
        finally:
            torch._C._accelerator_setAllocatorSettings = saved
        self.assertEqual(torch.calls, [("cuda", "expandable_segments:False"),
                                       ("cuda", "expandable_segments:True")])

    def test_keys_of_the_release_it_runs_under(self):
        # throw_on_cudamalloc_oom is a key of 2.12 (its release notes): under 2.12 the block keeps
        # it and changes only expandable_segments; under 2.11 the same environment already fails.
        conf = "throw_on_cudamalloc_oom:True,expandable_segments:True,pinned_free_catch_all:True"
        saved = torch.__version__
        torch.__version__ = "2.12.0+cu130"
        try:
            fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
            with cumemguard.expandable_segments(False) as b:
                self.assertFalse(settings()["expandable_segments"])
                self.assertTrue(settings()["throw_on_cudamalloc_oom"])
            self.assertEqual(b.plan["setter"], "torch._C._accelerator_setAllocatorSettings")
            self.assertEqual(torch.calls, [
                ("accelerator", "throw_on_cudamalloc_oom:True,expandable_segments:False,"
                                "pinned_free_catch_all:True"),
                ("accelerator", conf)])
            torch.__version__ = "2.11.0"
            with self.assertRaises(cumemguard.ConfigError) as e:
                with cumemguard.expandable_segments(False):
                    self.fail("entered")
            self.assertIn("Unrecognized key 'throw_on_cudamalloc_oom'", str(e.exception))
        finally:
            torch.__version__ = saved

    def test_setter_of_the_release(self):
        # Before 2.10 the policy names torch.cuda.memory._set_allocator_settings: the package calls
        # that one even where the stand-in also has the accelerator one (it records "deprecated"
        # then; the accelerator call would record "accelerator").
        saved = torch.__version__
        torch.__version__ = "2.9.1"
        try:
            fresh(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True,max_split_size_mb:256")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                with cumemguard.expandable_segments(False) as b:
                    pass
        finally:
            torch.__version__ = saved
        self.assertEqual(b.plan["setter"], "torch.cuda.memory._set_allocator_settings")
        self.assertEqual([api for api, _ in torch.calls], ["deprecated", "deprecated"])

    def test_first_call_of_a_fresh_process(self):
        code = ("import cumemguard, torch\n"
                "with cumemguard.expandable_segments(False):\n"
                "    print(torch.calls)\n"
                "print(torch.calls[-1])\n")
        env = child_env(PYTORCH_ALLOC_CONF="expandable_segments:True")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=env, check=True, timeout=120).stdout.splitlines()
        self.assertEqual(out, ["[('accelerator', 'expandable_segments:False')]",
                               "('accelerator', 'expandable_segments:True')"])

    def test_configuration_pytorch_rejects(self):
        fresh(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:true")
        with self.assertRaises(cumemguard.ConfigError) as e:
            with cumemguard.expandable_segments(False):
                self.fail("entered")
        self.assertIn("already fails at the first CUDA allocation: ValueError: Expected 'True' "
                      "or 'False'", str(e.exception))
        self.assertEqual(strings(), [])

    def test_release_that_ignores_the_unified_variable(self):
        # torch 2.9.1 never enabled them from PYTORCH_ALLOC_CONF (pytorch#183387): nothing to do.
        fresh(PYTORCH_ALLOC_CONF="expandable_segments:True")
        saved = torch.__version__
        torch.__version__ = "2.9.1+cu128"
        try:
            with cumemguard.expandable_segments(False) as b:
                self.assertFalse(b.applied)
        finally:
            torch.__version__ = saved
        self.assertEqual(strings(), [])
        self.assertFalse(b.plan["expandable_before"])
        self.assertIn("pytorch#183387", b.plan["known_problems"][0])

    def test_other_settings_and_the_plan(self):
        fresh(PYTORCH_ALLOC_CONF="max_split_size_mb:512,expandable_segments:True")
        with cumemguard.allocator_settings("max_split_size_mb:20"):
            self.assertEqual(settings()["max_split_size"], 20 * MiB)
            self.assertTrue(settings()["expandable_segments"])
        self.assertEqual(strings(), ["max_split_size_mb:20,expandable_segments:True",
                                     "max_split_size_mb:512,expandable_segments:True"])
        p = cumemguard.torch_alloc_conf("-max_split_size_mb")
        self.assertEqual((p["variable"], p["result"], p["error"]),
                         ("PYTORCH_ALLOC_CONF", "expandable_segments:True", None))
        with self.assertRaises(cumemguard.ConfigError):
            with cumemguard.allocator_settings("max_split_size_mb:1"):  # PyTorch: must be >= 20
                pass


class Worker:
    """A thread that runs what it is sent, one step at a time: the test says which thread enters
    or leaves which block, in which order, and looks at the settings between the steps (events,
    no sleeps)."""

    def __init__(self):
        self._todo = []
        self._cv = threading.Condition()
        self._done = 0
        self._sent = 0
        self.error = None
        self.blocks = []
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._todo)
                step = self._todo.pop(0)
            if step is None:
                return
            try:
                step()
            except BaseException as e:  # seen by the test, in its own thread
                self.error = e
            with self._cv:
                self._done += 1
                self._cv.notify_all()

    def do(self, step, wait=True):
        with self._cv:
            self._todo.append(step)
            self._sent += 1
            n = self._sent
            self._cv.notify_all()
        if wait:
            self.wait(n)
        return n

    def wait(self, n):
        with self._cv:
            if not self._cv.wait_for(lambda: self._done >= n, timeout=60):
                raise AssertionError("a worker step did not finish within 60 s")
        if self.error:
            raise self.error

    def enter(self, block):
        self.do(lambda: self.blocks.append((block, block.__enter__())))

    def exit(self):
        def leave():
            block, _ = self.blocks.pop()
            block.__exit__(None, None, None)
        self.do(leave)

    def stop(self):
        self.do(None, wait=False)
        self._thread.join(timeout=60)


class Threads(unittest.TestCase):
    """Blocks open on two threads at once compose: each one's overrides stay applied until it
    ends, whichever ends first, and the settings after both equal those before."""

    def setUp(self):
        self.t1, self.t2 = Worker(), Worker()

    def tearDown(self):
        self.t1.stop()
        self.t2.stop()

    def test_two_threads_turn_expandable_segments_off(self):
        conf = "expandable_segments:True,max_split_size_mb:256"
        off = "expandable_segments:False,max_split_size_mb:256"
        fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
        before = settings()
        self.t1.enter(cumemguard.expandable_segments(False))
        self.assertFalse(settings()["expandable_segments"])
        self.t2.enter(cumemguard.expandable_segments(False))  # already off: nothing to set
        self.assertFalse(settings()["expandable_segments"])
        self.assertEqual(strings(), [off])
        # The first thread's block ends while the second's runs: still off (it was turned on
        # again here, the second block's plan having been made from the first's string).
        self.t1.exit()
        self.assertFalse(settings()["expandable_segments"])
        self.assertEqual(settings()["max_split_size"], 256 * MiB)
        self.assertEqual(strings(), [off])
        self.t2.exit()
        self.assertEqual(strings(), [off, conf])
        self.assertEqual(settings(), before)

    def test_other_settings_in_a_second_thread(self):
        conf = "max_split_size_mb:512,expandable_segments:True"
        fresh(PYTORCH_ALLOC_CONF=conf)
        before = settings()
        self.t1.enter(cumemguard.allocator_settings("max_split_size_mb:64"))
        self.assertEqual((settings()["max_split_size"], settings()["garbage_collection_threshold"]),
                         (64 * MiB, 0.0))
        self.t2.enter(cumemguard.allocator_settings("garbage_collection_threshold:0.5"))
        self.assertEqual((settings()["max_split_size"], settings()["garbage_collection_threshold"]),
                         (64 * MiB, 0.5))
        # The first block ends: its max_split_size goes, the second's threshold stays.
        self.t1.exit()
        self.assertEqual((settings()["max_split_size"], settings()["garbage_collection_threshold"]),
                         (512 * MiB, 0.5))
        self.assertTrue(settings()["expandable_segments"])
        # Both ended: the configuration from before, not a setting no block asked for (the
        # second block restored the string it started from, max_split_size_mb:64).
        self.t2.exit()
        self.assertEqual(settings(), before)
        self.assertEqual(strings(), [
            "max_split_size_mb:64,expandable_segments:True",
            "max_split_size_mb:64,expandable_segments:True,garbage_collection_threshold:0.5",
            "max_split_size_mb:512,expandable_segments:True,garbage_collection_threshold:0.5",
            conf])

    def test_the_block_entered_last_wins_where_two_disagree(self):
        conf = "expandable_segments:True"
        fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
        self.t1.enter(cumemguard.expandable_segments(False))
        self.t2.enter(cumemguard.expandable_segments(True))
        self.assertTrue(settings()["expandable_segments"])
        self.t2.exit()  # back to the first block's
        self.assertFalse(settings()["expandable_segments"])
        self.t1.exit()
        self.assertTrue(settings()["expandable_segments"])
        self.assertEqual(strings(), ["expandable_segments:False", conf,
                                     "expandable_segments:False", conf])
        # Ended in the order they were entered: the second one's True is the environment's too.
        self.t1.enter(cumemguard.expandable_segments(False))
        self.t2.enter(cumemguard.expandable_segments(True))
        self.t1.exit()
        self.assertTrue(settings()["expandable_segments"])
        self.t2.exit()
        self.assertTrue(settings()["expandable_segments"])
        self.assertEqual(strings()[4:], ["expandable_segments:False", conf])


class Fork(unittest.TestCase):
    def test_child_forked_while_another_thread_is_inside_enter(self):
        """A thread holds the package's lock inside a block's __enter__ (in the setter) when
        another forks: the child's own block hung on that lock. It must run, on the environment's
        settings (the parent's half-entered block is not the child's)."""
        conf = "expandable_segments:True,max_split_size_mb:256"
        fresh(PYTORCH_CUDA_ALLOC_CONF=conf)
        inside, release = threading.Event(), threading.Event()

        def hold(_conf):
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                release.wait(60)

        torch._setter_hook = hold
        w = Worker()
        try:
            block = cumemguard.allocator_settings("max_split_size_mb:64")
            n = w.do(lambda: w.blocks.append((block, block.__enter__())), wait=False)
            self.assertTrue(inside.wait(60), "the worker never reached the setter")
            r, wr = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: one block, then the settings inside and after it
                os.close(r)
                try:
                    with cumemguard.expandable_segments(False):
                        s = settings()
                        inside_block = (s["expandable_segments"], s["max_split_size"])
                    s = settings()
                    os.write(wr, repr((inside_block, (s["expandable_segments"],
                                                      s["max_split_size"]))).encode())
                finally:
                    os._exit(0)
            os.close(wr)
            import select
            ready, _, _ = select.select([r], [], [], 60)
            got = os.read(r, 4096).decode() if ready else None
            os.close(r)
            if got is None:
                os.kill(pid, 9)
            os.waitpid(pid, 0)
            self.assertIsNotNone(got, "the forked child did not finish its block within 60 s "
                                      "(hung on the package's lock)")
            self.assertEqual(got, repr(((False, 256 * MiB), (True, 256 * MiB))))
        finally:
            release.set()
            torch._setter_hook = None
            w.wait(n)
            w.exit()
            w.stop()
        # The parent's block ran and ended as usual.
        self.assertEqual(settings()["max_split_size"], 256 * MiB)
        self.assertEqual(strings(), ["expandable_segments:True,max_split_size_mb:64", conf])

    def test_child_forked_while_another_thread_flushes(self):
        """A flush runs on another thread (it holds a share of the cleanup's state) when the
        program forks: the child's suppression waited forever for a flush that, in the child,
        never ends. Run in a process of its own (suppression is sticky)."""
        code = (
            "import os, select, threading, cumemguard\n"
            "inside, release = threading.Event(), threading.Event()\n"
            "def flush():\n"
            "    inside.set()\n"
            "    release.wait(60)\n"
            "t = threading.Thread(target=cumemguard.maybe_empty_cache, args=(flush,))\n"
            "t.start()\n"
            "assert inside.wait(60)\n"
            "r, w = os.pipe()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.close(r)\n"
            "    cumemguard.suppress_opportunistic_cleanup()\n"
            "    os.write(w, repr((cumemguard.opportunistic_cleanup_suppressed(),\n"
            "                      cumemguard.maybe_empty_cache(lambda: None))).encode())\n"
            "    os._exit(0)\n"
            "os.close(w)\n"
            "ready = select.select([r], [], [], 30)[0]\n"
            "got = os.read(r, 100).decode() if ready else 'the child hung'\n"
            "if not ready:\n"
            "    os.kill(pid, 9)\n"
            "os.waitpid(pid, 0)\n"
            "release.set()\n"
            "t.join(60)\n"
            "print(got)\n"
            "print(cumemguard.opportunistic_cleanup_suppressed())\n")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env(), timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        # The child: suppressed, its next request declined; the parent: untouched.
        self.assertEqual(out.stdout.splitlines(), ["(True, False)", "False"])


class Cleanup(unittest.TestCase):
    """The cleanup contract; the process-wide suppression is sticky, so this class runs its tests
    in order inside one test method."""

    def test_contract(self):
        ran = []
        self.assertFalse(cumemguard.opportunistic_cleanup_suppressed())
        self.assertTrue(cumemguard.maybe_empty_cache(lambda: ran.append(1)))
        self.assertEqual(ran, [1])
        # The default flush is torch.cuda.empty_cache.
        torch._reset()
        self.assertTrue(cumemguard.maybe_empty_cache())
        self.assertEqual(torch.empty_cache_calls, 1)
        # An exception of the flush reaches the caller.
        with self.assertRaises(ZeroDivisionError):
            cumemguard.maybe_empty_cache(lambda: 1 / 0)

        # A flush running on another thread: suppression waits for it to finish.
        started, release, order = threading.Event(), threading.Event(), []

        def slow_flush():
            started.set()
            release.wait(60)
            order.append("flush done")

        t1 = threading.Thread(target=cumemguard.maybe_empty_cache, args=(slow_flush,))
        t1.start()
        self.assertTrue(started.wait(60))

        def suppress():
            cumemguard.suppress_opportunistic_cleanup()
            order.append("suppressed")

        t2 = threading.Thread(target=suppress)
        t2.start()
        t2.join(0.3)
        self.assertTrue(t2.is_alive(), "suppression returned while a flush was running")
        release.set()
        t1.join(60)
        t2.join(60)
        self.assertEqual(order, ["flush done", "suppressed"])

        # Sticky: nothing turns it off; intentional releases keep their direct call.
        self.assertTrue(cumemguard.opportunistic_cleanup_suppressed())
        self.assertFalse(cumemguard.maybe_empty_cache(lambda: ran.append(2)))
        cumemguard.suppress_opportunistic_cleanup()
        self.assertFalse(cumemguard.maybe_empty_cache(lambda: ran.append(3)))
        self.assertEqual(ran, [1])
        self.assertEqual(cumemguard.release_deferred(), 0)
        if SHIM:
            self.assertTrue(cumemguard.stats()["opportunistic_cleanup_suppressed"])

    def test_transport_started_in_a_child(self):
        """An NCCL communicator (shim: seen at its setup; fallback: an initialised NCCL process
        group of torch.distributed) suppresses the next optional flush."""
        code = ("import sys, torch, cumemguard\n"
                "print(int(cumemguard.maybe_empty_cache(lambda: None)))\n")
        if SHIM:
            code += ("import ctypes\n"
                     "class Id(ctypes.Structure): _fields_ = [('b', ctypes.c_char * 128)]\n"
                     "nccl = ctypes.CDLL('libnccl.so.2')\n"
                     "uid, comm = Id(), ctypes.c_void_p()\n"
                     "assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0\n"
                     "assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0\n"
                     "assert nccl.ncclCommDestroy(comm) == 0\n")
        else:
            code += ("sys.modules['torch.distributed'] = torch.distributed\n"
                     "torch.distributed._backend = 'cpu:gloo,cuda:nccl'\n")
        code += ("print(int(cumemguard.maybe_empty_cache(lambda: None)))\n"
                 "print(int(cumemguard.opportunistic_cleanup_suppressed()))\n")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=child_env(), check=True, timeout=120).stdout.split()
        self.assertEqual(out, ["1", "0", "1"])


class Findings(unittest.TestCase):
    def test_readme_snippet(self):
        """The README's findings check names the missing shim (it was a bare AssertionError,
        findings() being None without it) and passes under the shim."""
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "README.md")) as f:
            readme = f.read()
        lines = [l.split("  #")[0] for l in readme.splitlines()
                 if l.startswith("assert cumemguard.")]
        self.assertEqual(len(lines), 2, lines)
        self.assertTrue(lines[0].startswith("assert cumemguard.active().loaded, "), lines)
        p = subprocess.run([sys.executable, "-c", "import cumemguard\n" + "\n".join(lines)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=child_env(), timeout=120)
        if SHIM:
            self.assertEqual((p.returncode, p.stderr), (0, ""))
        else:
            self.assertEqual(p.returncode, 1)
            self.assertTrue(p.stderr.endswith(
                "AssertionError: the cumemguard shim is not loaded: run under cumemguard run\n"),
                p.stderr)

    def test_findings_and_stats(self):
        if not SHIM:
            self.assertIsNone(cumemguard.findings())
            self.assertIsNone(cumemguard.stats())
            return
        code = (
            "import ctypes, cumemguard\n"
            "print(cumemguard.findings())\n"
            "rt = ctypes.CDLL('libcudart.so.13')\n"
            "rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]\n"
            "rt.cudaFree.argtypes = [ctypes.c_void_p]\n"
            "a, b = ctypes.c_void_p(), ctypes.c_void_p()\n"
            "assert rt.cudaMalloc(ctypes.byref(a), 1 << 20) == 0\n"
            "assert rt.cudaMalloc(ctypes.byref(b), 2 << 20) == 0\n"
            "assert rt.cudaFree(a) == 0\n"
            "rt.cudaFree(a)\n"  # a double free: skipped by the shim, reported
            "s = cumemguard.stats()\n"
            "print(s['findings'])\n"
            "print([(m['device'], m['kind'], m['current'], m['peak'], m['total'])"
            " for m in s['memory']])\n"
            "assert rt.cudaFree(b) == 0\n")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env(), check=True,
                             timeout=120)
        self.assertEqual(out.stdout.splitlines(),
                         ["{}", "{'double-free': 1}", "[(0, 'linear', 2097152, 3145728, 3145728)]"])
        self.assertIn("double-free", out.stderr)

    def test_snapshot(self):
        """cumemguard.snapshot(label) writes a snapshot record with the label, the memory live
        then (1 MiB from cudaMalloc, its row by stack) and the caller's stack with this script's
        Python frame; its number is returned. None without the shim."""
        if not SHIM:
            self.assertIsNone(cumemguard.snapshot("x"))
            return
        import json
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "py.log")
            code = (
                "import ctypes, cumemguard\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]\n"
                "rt.cudaFree.argtypes = [ctypes.c_void_p]\n"
                "a = ctypes.c_void_p()\n"
                "assert rt.cudaMalloc(ctypes.byref(a), 1 << 20) == 0\n"
                "def take():\n"
                "    return cumemguard.snapshot('weights loaded')\n"
                "print(take())\n"
                "assert rt.cudaFree(a) == 0\n"
                "print(cumemguard.snapshot(''))\n")
            out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 env=child_env(CUMEMGUARD_LOG=log), check=True, timeout=120)
            self.assertEqual(out.stdout.split(), ["1", "2"])
            with open(log) as f:
                recs = [json.loads(line) for line in f]
        snaps = [r for r in recs if r.get("k") == "snapshot"]
        self.assertEqual([(r["id"], r["part"], r["label"], r["trigger"], r.get("end"))
                          for r in snaps],
                         [(1, 0, "weights loaded", "api", True), (2, 0, "", "api", True)])
        alloc = next(r for r in recs if r.get("api") == "cudaMalloc")
        self.assertEqual(snaps[0]["rows"], [[0, "linear", "live", alloc.get("stack", 0), 0, 1,
                                             1 << 20]])
        self.assertEqual(snaps[1]["rows"], [])
        stacks = {r["id"]: r for r in recs if r.get("k") == "stack"}
        codes = {r["id"]: r for r in recs if r.get("k") == "pycode"}
        py = stacks[snaps[0]["stack"]].get("py", [])
        # The package's own function, then the caller's.
        names = [codes[c]["name"] for _at, c, _line in py if c in codes]
        self.assertEqual(names[:3], ["snapshot", "take", "<module>"])
        # The caller's sites: file, function and line of the -c program (take's return on line 8,
        # the call of take() on line 9).
        sites = [(codes[c]["file"], codes[c]["name"], line) for _at, c, line in py if c in codes]
        self.assertEqual(sites[1:3], [("<string>", "take", 8), ("<string>", "<module>", 9)])

    def test_path_check_follows_the_block(self):
        """Under the shim, a cudaMalloc from PyTorch's allocator inside expandable_segments(False)
        is the asked path; after the block it is a config finding."""
        if not SHIM:
            self.skipTest("the path check is the shim's")
        lib = os.path.join(BUILD, "tests", "torch", "libc10_cuda.so")
        code = (
            "import ctypes, cumemguard, torch\n"
            f"c10 = ctypes.CDLL({lib!r})\n"
            "with cumemguard.expandable_segments(False):\n"
            "    assert c10.fake_torch_segment(1 << 20, 0) == 0\n"
            "    print(cumemguard.findings())\n"
            "assert c10.fake_torch_segment(1 << 20, 0) == 0\n"
            "print(cumemguard.findings())\n"
            "assert c10.fake_torch_release_all() == 0\n")
        env = child_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
        out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env, check=True,
                             timeout=120)
        self.assertEqual(out.stdout.splitlines(), ["{}", "{'config': 1}"])
        self.assertIn("although the settings applied at run time ask for expandable_segments:True",
                      out.stderr)


if __name__ == "__main__":
    unittest.main()
