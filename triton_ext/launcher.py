"""Launching a ``@triton.jit`` / ``@gluon.jit`` kernel with no per-call work that can be done once.

``Launcher(fn, num_warps).launch(grid, args)`` launches through Triton's JIT the first time for
each specialization of the arguments (Triton compiles then, or loads from its cache) and keeps the
``CompiledKernel`` it returns; later calls with the same specialization on the same device launch that compiled
kernel directly on the current stream, skipping the JIT's argument binding and cache-key
computation. The specialization is what Triton's JIT specializes on, computed with Triton's own
``native_specialize_impl`` for integers (1 becomes a constant; divisibility by 16; 32 vs 64 bits)
and as 16-byte alignment for tensors; floats, booleans and TMA descriptors carry none (a
descriptor's type is fixed by the kernel's emitted block shape and layout). Launch hooks
(``triton.knobs.runtime.launch_enter_hook``, e.g. a profiler) are honoured as the JIT does.

Under Triton's CPU interpreter (``TRITON_INTERPRET=1``) there is no compiled kernel: every call
goes through the interpreter.
"""
from __future__ import annotations


class Launcher:
    def __init__(self, fn, num_warps: int):
        import torch
        from triton import knobs
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
        from triton.runtime import driver
        from triton.runtime.interpreter import InterpretedFunction
        self.fn = fn
        self.interpreted = isinstance(fn, InterpretedFunction)
        self.num_warps = num_warps
        self.compiled: dict = {}             # specialization -> CompiledKernel
        self._tensor = torch.Tensor
        self._int_key = lambda a: native_specialize_impl(BaseBackend, a, False, True, True)[1]
        self._driver = driver
        self._hooks = knobs.runtime

    def specialization(self, args: list) -> tuple:
        return tuple(a.data_ptr() % 16 == 0 if isinstance(a, self._tensor)
                     else self._int_key(a) if type(a) is int else None for a in args)

    def launch(self, grid: tuple, args: list) -> None:
        if self.interpreted:
            self.fn[grid](*args, num_warps=self.num_warps)
            return
        active = self._driver.active
        device = active.get_current_device()
        key = (device, self.specialization(args))
        kernel = self.compiled.get(key)
        if kernel is None:
            self.compiled[key] = self.fn[grid](*args, num_warps=self.num_warps)
            return
        g = tuple(grid) + (1, 1)
        stream = active.get_current_stream(device)
        hooks = self._hooks
        metadata = kernel.launch_metadata(grid, stream, *args) if hooks.launch_enter_hook else None
        kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, metadata,
                   hooks.launch_enter_hook, hooks.launch_exit_hook, *args)
