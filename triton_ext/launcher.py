"""Launching a ``@triton.jit`` / ``@gluon.jit`` kernel with no per-call work that can be done once.

``Launcher(fn, num_warps, compiling, options).launch(grid, args)`` launches through Triton's JIT the
first time for each specialization of the arguments on a device (Triton compiles then, or loads
from its cache, inside ``compiling()`` where given: the Gluon launcher's TTGIR checks; with the
compile ``options`` beside ``num_warps``, e.g. the Gluon kernels' ``launch_pdl``) and keeps the
``CompiledKernel`` it returns; later calls with the same specialization launch that kernel
directly on the current stream, skipping the JIT's argument binding and cache key, with the launch
attributes its metadata asks for (cooperative grid, programmatic dependent launch). The
specialization is what Triton's JIT specializes on, computed by a function generated once per list
of argument types: for integers the classes of Triton's ``native_specialize_impl`` (1 becomes a
constant; divisibility by 16; i32, i64 or u64 by range; remembered per tuple of the integers'
values), 16-byte alignment for tensors; floats,
booleans and TMA descriptors carry none (a descriptor's type is fixed by the kernel's emitted
block shape and layout).

A direct launch calls the C launcher Triton built for the kernel (``DirectLaunch``). A TMA
descriptor argument is passed as the encoded tensor map Triton's launcher wrapper would make from
it on every call; here it is made once per descriptor object (the Gluon launcher's descriptor
cache hands back the same object for the same tensor address, shape and strides). Where the
kernel needs scratch memory, or a launch hook listens (``triton.knobs.runtime.launch_enter_hook``
holds one, e.g. a profiler's; Triton 3.6 keeps an empty hook chain there otherwise, which counts
as none), the compiled kernel's own ``run`` is used, as the JIT would.

A caller that launches one call signature again and again may skip even that
(``bound_launch``, the programs' launch for a kept call): after the signature's first launch,
``Launcher.direct`` gives a function calling the compiled kernel's C launcher with the arguments
already expanded, where this call may (``unhooked``: this thread's context, the same current
device, no launch hook listening; the part of Triton's specialization a signature leaves open,
``value_key``, the same as the first call's).

Under Triton's CPU interpreter (``TRITON_INTERPRET=1``) there is no compiled kernel: every call
goes through the interpreter.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

_ENCODED = "_tilews_encoded"     # attribute of a TensorDescriptor holding its launcher arguments


class Launcher:
    def __init__(self, fn, num_warps: int, compiling: Callable[[], ContextManager] = contextlib.nullcontext,
                 options: Optional[dict] = None):
        import torch
        from triton import knobs
        from triton.runtime import driver
        from triton.runtime.interpreter import InterpretedFunction
        self.fn = fn
        self.interpreted = isinstance(fn, InterpretedFunction)
        self.num_warps = num_warps
        self.options = dict(options or {})
        self.compiling = compiling
        self.compiled: dict = {}             # (device, specialization) -> DirectLaunch
        self._tensor = torch.Tensor
        self._keys: dict = {}                # argument types -> their specialization function
        self._driver = driver
        self._hooks = knobs.runtime

    def specialization(self, args: list) -> tuple:
        types = tuple(map(type, args))
        key = self._keys.get(types)
        if key is None:
            key = self._keys[types] = _specializer(types, self._tensor)
        return key(args)

    def launch(self, grid: tuple, args: list) -> None:
        if self.interpreted:
            self.fn[grid](*args, num_warps=self.num_warps)
            return
        active = self._driver.active
        device = active.get_current_device()
        if not getattr(_THREAD, "has_context", False):
            _make_context_current(device)
        key = (device, self.specialization(args))
        direct = self.compiled.get(key)
        if direct is None:
            with self.compiling():
                self.compiled[key] = DirectLaunch.of(self.fn[grid](*args, num_warps=self.num_warps,
                                                                   **self.options))
            return
        stream = active.get_current_stream(device)
        g = tuple(grid) + (1, 1)
        enter, leave = _listening(self._hooks.launch_enter_hook), _listening(self._hooks.launch_exit_hook)
        kernel = direct.kernel
        if direct.raw is None or enter is not None:
            metadata = kernel.launch_metadata(grid, stream, *args) if enter is not None else None
            kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, metadata,
                       enter, leave, *args)
            return
        direct.raw(g[0], g[1], g[2], stream, kernel.function, direct.cooperative, direct.pdl, None,
                   None, kernel.packed_metadata, None, None, leave, *direct.expand(args))

    def unhooked(self, device: int) -> bool:
        """Whether a launch may go straight to a compiled kernel's C launcher on ``device`` now:
        this thread has a current context, ``device`` is the current device and no launch hook
        listens (else ``launch`` does what Triton's JIT would)."""
        return (getattr(_THREAD, "has_context", False) and self._driver.active.get_current_device() == device
                and _listening(self._hooks.launch_enter_hook) is None
                and _listening(self._hooks.launch_exit_hook) is None)

    def stream(self, device: int) -> int:
        """The current torch stream's handle on ``device``."""
        return self._driver.active.get_current_stream(device)

    def direct(self, values: list, args: list,
               preparer: Callable[["DirectLaunch"], Optional[Callable[[list], tuple]]]
               ) -> Optional[Callable[[list], bool]]:
        """After ``args`` (a program's arguments made of its launch ``values``) were launched: a
        function launching values of the same call signature straight through the compiled
        kernel's C launcher, ``preparer(compiled)(values)`` giving (the grid, the arguments as
        that launcher takes them: TMA descriptors expanded), answering False (launching nothing)
        where the call must go through ``launch``: not ``unhooked``, or another specialization
        (a pointer's alignment or an integer's class among ``values``, which a signature leaves
        open); None where the kernel has no direct launch (under Triton's interpreter, none
        has) or ``preparer`` gives none for it. The signature fixes the rest of the
        specialization: each tensor's strides and the integers derived from them."""
        import torch
        if self.interpreted:                    # Triton's CPU interpreter: no compiled kernel
            return None
        device = self._driver.active.get_current_device()
        compiled = self.compiled.get((device, self.specialization(args)))   # launched: compiled
        prepared = None if compiled is None or compiled.raw is None else preparer(compiled)
        if prepared is None:
            return None
        passed = prepared(values)[1]
        picked = [i for i, v in enumerate(values)
                  if (isinstance(v, int) and not isinstance(v, bool))
                  or (isinstance(v, torch.Tensor) and any(a is v for a in passed))]
        key = value_key(values, picked, torch.Tensor)
        expected, unhooked, stream = key(values), self.unhooked, self.stream
        kernel, raw = compiled.kernel, compiled.raw
        function, metadata, cooperative, pdl = (kernel.function, kernel.packed_metadata,
                                                compiled.cooperative, compiled.pdl)

        def direct(values: list) -> bool:
            if not unhooked(device) or key(values) != expected:
                return False
            grid, expanded = prepared(values)
            g = tuple(grid) + (1, 1)
            raw(g[0], g[1], g[2], stream(device), function, cooperative, pdl, None, None, metadata,
                None, None, None, *expanded)
            return True
        return direct


def bound_launch(launch: Callable[[list], None],
                 direct: Callable[[list], Optional[Callable[[list], bool]]]) -> Callable[[list], None]:
    """A program's launch for the values of one call signature: the first call through
    ``launch``, which then gives ``direct(values)`` (a direct launch, ``Launcher.direct``, or
    None); later calls through it where it takes them, else through ``launch``."""
    tried: list = []          # [the direct launch, or None], once the first call made it

    def bound(values: list) -> None:
        if tried:
            if tried[0] is None or not tried[0](values):
                launch(values)
            return
        launch(values)
        tried.append(direct(values))
    return bound


_THREAD = threading.local()


def _make_context_current(device: int) -> None:
    """Bind the device's primary CUDA context to this thread (a runtime call that needs one does).
    Triton encodes a TMA descriptor before its launcher makes a context current, so the first
    launch with descriptors from a thread that never touched CUDA failed with "invalid device
    context"."""
    import torch
    torch.cuda.current_stream(device).query()
    _THREAD.has_context = True


INT_TUPLES = 256     # tuples of integer arguments whose classes one specializer remembers
# Triton's classes of an integer argument (``native_specialize_impl``): the constant 1, divisible
# by 16, and its type: i32 within 32 bits, i64 below 2**63, else u64
_INT_CLASS = "({a} == 1, {a} % 16 == 0, -2147483648 <= {a} < 2147483648, {a} < 9223372036854775808)"


def _specializer(types: tuple, tensor: type) -> Callable[[list], tuple]:
    """A function of an argument list of these ``types`` returning its specialization: per
    tensor its 16-byte alignment, then the classes of its integers as Triton sees them (at least
    as fine as Triton's, so one key never stands for two of Triton's compiled kernels); other
    arguments (floats, booleans, TMA descriptors) carry none. Generated once per list of types;
    the integers' classes are remembered per tuple of their values (a kernel's strides and
    sizes repeat from call to call: one hash of the tuple, not four comparisons per integer)."""
    ints = [i for i, t in enumerate(types) if t is int]
    aligned = [f"args[{i}].data_ptr() % 16 == 0" for i, t in enumerate(types) if issubclass(t, tensor)]
    classes = functools.lru_cache(maxsize=INT_TUPLES)(eval(     # noqa: S307
        f"lambda v: ({''.join(_INT_CLASS.format(a=f'v[{k}]') + ', ' for k in range(len(ints)))})"))
    values = "".join(f"args[{i}], " for i in ints)
    return eval(f"lambda args: ({''.join(a + ', ' for a in aligned)}classes(({values})),)",  # noqa: S307
                {"classes": classes})


def value_key(values: list, picked: list[int], tensor: type) -> Callable[[list], tuple]:
    """A function of a value list like ``values`` giving the specialization (``_specializer``) of
    the values at ``picked``, with no list built per call."""
    spec = _specializer(tuple(type(values[i]) for i in picked), tensor)
    return eval(f"lambda v: spec(({''.join(f'v[{i}], ' for i in picked)}))", {"spec": spec})  # noqa: S307


def _listening(hook):
    """``hook``, or None when nothing listens: Triton 3.6 keeps its launch hooks in a ``HookChain``
    that is never None, empty unless a profiler (proton) added a hook."""
    return None if hook is None or getattr(hook, "calls", True) == [] else hook


@dataclass
class DirectLaunch:
    """A compiled kernel and, where it can be called directly, Triton's C launcher for it
    (``raw``; None: use ``kernel.run``) with what that launcher takes besides the arguments,
    and per TMA descriptor position the metadata its encoding needs."""
    kernel: object
    raw: Optional[Callable]
    cooperative: bool = False
    pdl: bool = False
    descriptors: tuple[tuple[int, object], ...] = ()

    @classmethod
    def of(cls, kernel) -> "DirectLaunch":
        run = kernel.run
        if run.global_scratch_size or run.profile_scratch_size:
            return cls(kernel, None)
        wrapper = run.launch
        code = getattr(wrapper, "__code__", None)
        if code is None:                      # no descriptor arguments: the C launcher itself
            return cls(kernel, wrapper, run.launch_cooperative_grid, run.launch_pdl)
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in wrapper.__closure__ or ())))
        if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
            return cls(kernel, None)          # a Triton whose wrapper we do not know
        positions = sorted(cells["tensordesc_indices"])
        return cls(kernel, cells["launcher"], run.launch_cooperative_grid, run.launch_pdl,
                   tuple(zip(positions, cells["tensordesc_meta"])))

    def expand(self, args: list) -> list:
        """``args`` with each TMA descriptor replaced by its encoded tensor map, shape and strides
        (made once per descriptor object)."""
        if not self.descriptors:
            return args
        out = list(args)
        for i, meta in reversed(self.descriptors):
            desc = args[i]
            encoded = desc.__dict__.get(_ENCODED)
            if encoded is None:
                encoded = desc.__dict__[_ENCODED] = _encoded(desc, meta)
            out[i:i + 1] = encoded
        return out

    def encoder(self, i: int) -> Callable[[object], list]:
        """The function expanding a descriptor for the ``i``-th descriptor argument."""
        return functools.partial(_encoded, meta=self.descriptors[i][1])


def _encoded(desc, meta) -> list:
    """What Triton's launcher wrapper passes for TMA descriptor ``desc``: its encoded tensor map,
    shape and strides."""
    from triton.backends.nvidia.driver import make_tensordesc_arg
    return make_tensordesc_arg(desc, meta)
