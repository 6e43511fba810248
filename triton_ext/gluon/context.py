"""The state of one Gluon emission: output lines and Python names (``tl``'s ``Ctx``, with the
names Gluon source uses reserved), plus the decisions lowering recorded, read once from the kernel
attrs: layouts, TMA descriptors, barrier counts, the default role, the scalar locals (and which
are never negative) and the global buffers passed as pointers (and the roles reading them).
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.roles import describe

from ..tl.context import Ctx as _TlCtx

GL_DTYPE = {ir.DType.BF16: "gl.bfloat16", ir.DType.F16: "gl.float16", ir.DType.F32: "gl.float32",
            ir.DType.F64: "gl.float64", ir.DType.I8: "gl.int8", ir.DType.I16: "gl.int16",
            ir.DType.I32: "gl.int32", ir.DType.I64: "gl.int64", ir.DType.U8: "gl.uint8",
            ir.DType.BOOL: "gl.int1", ir.DType.F8E4M3: "gl.float8e4nv", ir.DType.F8E5M2: "gl.float8e5"}

# names the generated module itself uses
_GLUON_NAMES = {"gl", "gluon", "tma", "mbarrier", "fence_async_shared", "warpgroup_mma",
                "warpgroup_mma_wait", "TensorDescriptor", "args"}


class Ctx(_TlCtx):
    def __init__(self, kernel: ir.Kernel):
        super().__init__(kernel)
        self._used |= _GLUON_NAMES
        self.fn = self.name(kernel.name)
        self.layouts: dict[str, object] = dict(kernel.attr("layouts", ()))
        self.counts: dict[str, tuple[int, ...]] = dict(kernel.attr("mbarrier_counts", ()))
        self.default_role: tuple[int, ...] = kernel.attr("default_role")
        self.descriptors: dict[tuple[str, tuple[int, ...]], str] = {}
        seen: dict[str, int] = {}
        for gname, block in kernel.attr("tma_descriptors", ()):
            n = seen[gname] = seen.get(gname, -1) + 1
            self.descriptors[(gname, tuple(block))] = self.fresh(f"{gname}_desc_{n}")
        self.layout_names: dict[str, str] = {}
        self.scalar_locals: dict[str, bool] = dict(kernel.attr("scalar_locals", ()))
        self.pointers: dict[str, tuple[tuple[int, ...], ...]] = dict(kernel.attr("pointer_params", ()))
        # the role being emitted: its warp groups, fragments (declared at its start) and gemm
        # accumulators
        self.role: tuple[int, ...] = ()
        self.fragments: dict[str, ir.Buffer] = {}
        self.accumulators: list[ir.Buffer] = []

    def descriptor(self, g: ir.Region, loc: ir.Loc) -> str:
        """The TMA descriptor of the global region ``g`` (by buffer and box)."""
        key = (g.buffer.name, tuple(g.extents))
        if key not in self.descriptors:
            raise InternalError(f"gluon backend: no TMA descriptor for '{g.buffer.name}' with block "
                                f"{list(g.extents)} (attr tma_descriptors lacks it)", loc)
        return self.descriptors[key]

    def scalar(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The Python variable holding the scalar local ``b`` in the role being emitted."""
        if b.name not in self.scalar_locals:
            raise InternalError(f"gluon backend: {b.scope.value} buffer '{b.name}' is not a scalar "
                                f"local (attr scalar_locals lacks it)", loc)
        return self.name(b.name)

    def pointer(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The pointer parameter of the global buffer ``b`` in the role being emitted."""
        if self.role not in self.pointers.get(b.name, ()):
            raise InternalError(f"gluon backend: '{b.name}' is not passed as a pointer to "
                                f"{describe(self.role)} (attr pointer_params)", loc)
        return self.name(b.name)

    def layout(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The module-level constant holding ``b``'s layout."""
        if b.name not in self.layout_names:
            raise InternalError(f"gluon backend: no layout for {b.scope.value} buffer '{b.name}' "
                                f"(attr layouts lacks it)", loc)
        return self.layout_names[b.name]
