"""Launch an ``MslKernel`` through ``torch.mps.compile_shader``: the whole kernel text
(``full_source()``) compiled once, launched on torch MPS tensors in place (zero copy).

What torch's binding does (torch/csrc/mps/Module.cpp): ``lib.<name>(*args, threads=..., group_size=...)``
binds the arguments to buffers 0, 1, ... in order: a tensor as its MTLBuffer (at its storage
offset), a Python ``float`` as 4 bytes (a C ``float``), an ``int`` as 8 bytes (``int64_t``),
``arg_casts={index: "fp16"|"bf16"|"int32"|"int16"|"int8"|"uint8"}`` re-encoding a number first.
``threads`` and ``group_size`` are 1 to 3 sizes (the same count) passed to dispatchThreads, so they
count threads, not threadgroups. So a scalar param (``constant T* name``, read as ``name[0]``) is
passed as a Python number with the cast its MSL type needs (none for ``float`` and ``long``;
``ulong`` goes as ``int64_t``: values below 2**63), never as a device tensor to allocate per call.

Tensors must be on the MPS device and have an element type of the param's MSL type (``uchar``
params take uint8 and the fp8 dtypes). A written tensor must be contiguous, since the kernel writes
its memory in place (a non-contiguous one is an error naming the param); a read-only one that is
not is copied to a contiguous tensor first.
"""
from __future__ import annotations

from typing import Sequence

from . import launch_args
from .source import MslKernel, MslParam

DEVICE_TYPE = "mps"   # the device the tensors must be on

# the arg_casts entry that encodes a Python number as a scalar of the MSL type (absent: torch's
# default encoding, a float as float and an int as int64_t, is already right)
ARG_CASTS = {"half": "fp16", "bfloat": "bf16", "int": "int32", "uint": "int32", "short": "int16",
             "ushort": "int16", "char": "int8", "uchar": "uint8", "bool": "uint8"}


class MpsLauncher:
    """One ``MslKernel`` compiled by ``torch.mps.compile_shader``; call it per launch."""

    def __init__(self, kernel: MslKernel):
        import torch
        self.kernel = kernel
        self.library = torch.mps.compile_shader(kernel.full_source())
        self._function = getattr(self.library, kernel.name)
        self._casts = {i: ARG_CASTS[p.dtype] for i, p in enumerate(kernel.params)
                       if p.scalar and p.dtype in ARG_CASTS}

    def __call__(self, args: Sequence, grid: Sequence[int]) -> None:
        """Launch on a grid of ``grid = (gx, gy, gz)`` threadgroups. ``args`` follow
        ``kernel.params``: a torch tensor on the MPS device for a buffer (written ones are updated
        in place), a Python number for a scalar. Returns when the launch is enqueued on torch's MPS
        stream (``torch.mps.synchronize()`` waits for it)."""
        if len(args) != len(self.kernel.params):
            raise TypeError(f"kernel {self.kernel.name} takes {len(self.kernel.params)} arguments "
                            f"({', '.join(p.name for p in self.kernel.params)}); got {len(args)}")
        bound = [launch_args.scalar_value(p, a) if p.scalar else _buffer(p, a)
                 for p, a in zip(self.kernel.params, args)]
        threads, group = launch_args.dispatch(self.kernel, grid)
        casts = {"arg_casts": self._casts} if self._casts else {}   # older torch lacks arg_casts
        self._function(*bound, threads=list(threads), group_size=list(group), **casts)


def _buffer(param: MslParam, tensor):
    """``tensor`` checked as the buffer of ``param``: on the MPS device, of a dtype the param's MSL
    type holds, contiguous (a read-only one made so)."""
    import torch
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"kernel parameter '{param.name}': pass a torch tensor on the "
                        f"{DEVICE_TYPE} device, not {type(tensor).__name__}")
    if tensor.device.type != DEVICE_TYPE:
        raise ValueError(f"kernel parameter '{param.name}': the tensor is on {tensor.device}; "
                         f"torch.mps kernels take tensors on the {DEVICE_TYPE} device")
    allowed = [d.torch_dtype for d in launch_args.storage_dtypes(param)]
    if tensor.dtype not in allowed:
        raise TypeError(f"kernel parameter '{param.name}' is a {param.dtype} buffer "
                        f"({', '.join(str(d) for d in allowed)}); got a tensor of {tensor.dtype}")
    if tensor.is_contiguous():
        return tensor
    if param.written:
        raise ValueError(f"kernel parameter '{param.name}' is written in place, so its tensor "
                         f"must be contiguous (strides {tuple(tensor.stride())} for shape "
                         f"{tuple(tensor.shape)}); pass a contiguous tensor and copy it back")
    return tensor.contiguous()
