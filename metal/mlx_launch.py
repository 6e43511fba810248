"""Launch an ``MslKernel`` through mlx (``mx.fast.metal_kernel``), the Metal runtime on a Mac.

mlx builds the kernel from its parts: our ``body`` (mlx's ``source``), ``header``, and the names of
the inputs (the params the kernel reads, scalars included) and of the outputs (the params it
writes); it writes the signature itself. What it writes, checked on Linux by tracing a launch in
``mx.export_function`` with ``verbose=True`` (tests/metal/test_launchers.py), is the signature
``MslKernel.full_source`` spells, up to spelling:

* inputs first, in params order, ``const device T* name [[buffer(i)]]``; an input of fewer than 8
  elements (every scalar) ``const constant T* name``; then the outputs, ``device T* name``;
* element types by mlx's names: ``float16_t`` for ``half`` and ``bfloat16_t`` for ``bfloat``,
  ``int32_t``/``uint8_t``/... for ``int``/``uchar``/...: typedefs of the MSL types in the utils
  header mlx puts first (``bfloat16_t`` is ``bfloat`` from Metal 3.1 on; before, mlx's own struct,
  and a body spelling ``bfloat`` does not compile there: bf16 kernels need macOS 14);
* a parameter for each thread attribute whose name appears anywhere in the body, with its
  attribute (``uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]``, ...);
* then our header and the body, verbatim, in ``[[kernel]] void custom_kernel_<name>_...(...)``.

mlx is functional: outputs are new arrays, never a caller's buffer, and they start uninitialized.
So a written param that the kernel also reads (``MslParam.read``) cannot go through mlx: building
the launcher refuses it (use ``tilews.metal.mps_launch``, which updates torch MPS tensors in
place). mlx is imported lazily (on Linux ``pip install "mlx[cpu]"`` imports and traces, but every
real launch raises ``No Metal back-end``).
"""
from __future__ import annotations

from typing import Sequence

from . import launch_args
from .source import MslKernel, MslParam


def mlx_dtype(param: MslParam):
    """The mlx dtype of a buffer of ``param.dtype`` (``uchar``: ``uint8``; mlx has no fp8)."""
    import mlx.core as mx
    name = launch_args.element_dtype(param).record.torch
    return getattr(mx, "bool_" if name == "bool" else name)


class MlxLauncher:
    """``mx.fast.metal_kernel`` for one ``MslKernel``, built once; call it per launch."""

    def __init__(self, kernel: MslKernel):
        import mlx.core as mx
        in_place = [p.name for p in kernel.params if p.written and p.read]
        if in_place:
            raise ValueError(
                f"kernel {kernel.name}: parameter(s) {', '.join(in_place)} are written and also "
                f"read, so the kernel updates them in place; mlx cannot (its outputs are new, "
                f"uninitialized arrays). Launch it with tilews.metal.mps_launch.MpsLauncher on "
                f"torch MPS tensors instead")
        self.kernel = kernel
        self.inputs = tuple(p for p in kernel.params if not p.written)
        self.outputs = tuple(p for p in kernel.params if p.written)
        self._dtypes = {p.name: mlx_dtype(p) for p in kernel.params}
        self._fn = mx.fast.metal_kernel(name=kernel.name, input_names=[p.name for p in self.inputs],
                                        output_names=[p.name for p in self.outputs],
                                        source=kernel.body, header=kernel.header,
                                        ensure_row_contiguous=True)

    def __call__(self, args: Sequence, grid: Sequence[int], *, verbose: bool = False, stream=None) -> list:
        """Launch on a grid of ``grid = (gx, gy, gz)`` threadgroups. ``args`` follow
        ``kernel.params``: an ``mx.array`` for a buffer the kernel reads, a Python number for a
        scalar, and for a written param the output's shape (a tuple, or an ``mx.array`` whose shape
        and dtype it has; its contents are not used). Returns the outputs, one new ``mx.array`` per
        written param, in params order (unwritten elements are undefined). ``verbose`` prints the
        source mlx generates."""
        if len(args) != len(self.kernel.params):
            raise TypeError(f"kernel {self.kernel.name} takes {len(self.kernel.params)} arguments "
                            f"({', '.join(p.name for p in self.kernel.params)}); got {len(args)}")
        given = {p.name: a for p, a in zip(self.kernel.params, args)}
        inputs = [self._input(p, given[p.name]) for p in self.inputs]
        shapes = [self._output_shape(p, given[p.name]) for p in self.outputs]
        threads, group = launch_args.dispatch(self.kernel, grid)
        return self._fn(inputs=inputs, output_shapes=shapes,
                        output_dtypes=[self._dtypes[p.name] for p in self.outputs],
                        grid=threads, threadgroup=group, verbose=verbose, stream=stream)

    def _input(self, param: MslParam, value):
        import mlx.core as mx
        if param.scalar:
            return mx.array([launch_args.scalar_value(param, value)], dtype=self._dtypes[param.name])
        if not isinstance(value, mx.array):
            raise TypeError(f"kernel parameter '{param.name}': pass an mx.array, not "
                            f"{type(value).__name__}")
        self._check_dtype(param, value)
        return value

    def _output_shape(self, param: MslParam, value) -> tuple[int, ...]:
        import mlx.core as mx
        if isinstance(value, mx.array):
            self._check_dtype(param, value)
            return tuple(value.shape)
        if isinstance(value, tuple) and all(isinstance(n, int) and n >= 0 for n in value):
            return value
        raise TypeError(f"kernel parameter '{param.name}' is an output: pass its shape (a tuple) or "
                        f"an mx.array of its shape and dtype, not {type(value).__name__}")

    def _check_dtype(self, param: MslParam, value) -> None:
        if value.dtype != self._dtypes[param.name]:
            raise TypeError(f"kernel parameter '{param.name}' is a {param.dtype} buffer "
                            f"({self._dtypes[param.name]}); got an mx.array of {value.dtype}")
