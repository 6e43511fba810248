"""The emitted Metal kernel as one artifact: what mlx, torch.mps and the CPU harness all take.

mlx's ``mx.fast.metal_kernel`` wants the kernel *body* and writes the signature itself (from the
input and output names, and from the thread attributes whose names appear in the body); torch.mps
and the CPU harness want a whole kernel function. ``MslKernel`` holds the parts once and spells the
whole function (``full_source``) in the form mlx would, so every launcher runs the same text.

Runtime scalars travel as 1-element buffers (mlx has no scalar inputs); the body reads ``name[0]``.
"""
from __future__ import annotations

from dataclasses import dataclass

# the thread attributes an emitted body may read, by mlx's names, with their MSL types
ATTRIBUTES = {"threadgroup_position_in_grid": "uint3",
              "thread_index_in_threadgroup": "uint",
              "simdgroup_index_in_threadgroup": "uint",
              "thread_index_in_simdgroup": "uint"}

PRELUDE = "#include <metal_stdlib>\nusing namespace metal;\n"


@dataclass(frozen=True)
class MslParam:
    name: str        # the name in the kernel text
    dtype: str       # MSL element type ("float", "half", "bfloat", "uchar", "int", ...)
    written: bool    # the kernel writes it (``device T*``), else read-only (``const device T*``)
    scalar: bool = False   # a runtime scalar, passed as a 1-element buffer (``constant T*``)
    read: bool = True      # the kernel reads it (a written param that is also read must keep its
                           # contents: launchers that cannot update in place refuse it)

    def declaration(self, index: int) -> str:
        space = "constant" if self.scalar else "device" if self.written else "const device"
        return f"{space} {self.dtype}* {self.name} [[buffer({index})]]"


@dataclass(frozen=True)
class MslKernel:
    name: str
    header: str                      # helper functions before the kernel (mlx's ``header``)
    body: str                        # the kernel body (mlx's ``source``)
    params: tuple[MslParam, ...]     # in the lowered kernel's parameter order
    attributes: tuple[str, ...]      # names from ATTRIBUTES the body reads
    threads: int                     # threads per threadgroup (1-D threadgroups)

    def full_source(self) -> str:
        """The whole translation unit: prelude, header, and the kernel function."""
        decls = [p.declaration(i) for i, p in enumerate(self.params)]
        decls += [f"{ATTRIBUTES[a]} {a} [[{a}]]" for a in self.attributes]
        signature = ",\n    ".join(decls)
        return (f"{PRELUDE}\n{self.header}\n[[kernel]] void {self.name}(\n    {signature}) {{\n"
                f"{self.body}}}\n")
