"""The state of one Gluon emission: a ``SourceWriter`` (lines, Python names, with the names
Gluon source uses reserved), plus the decisions lowering recorded, read once from the kernel's
``AsyncPlan`` and ``LayoutPlan``: layouts, TMA descriptors, barrier counts, the default role, the
scalar locals (and which are never negative), the global buffers passed as pointers (and the
roles reading them) and the views of shared tiles per-thread code reads and writes by runs.
"""
from __future__ import annotations

from tilews.lowering import ir
from tilews.lowering.errors import InternalError
from tilews.lowering.roles import describe

from tilews.lowering.plans import AsyncPlan, LayoutPlan, SharedMemoryPlan
from tilews.lowering.traverse import footprint

from ..pysource import SourceWriter
from .layouts import spell_layout

GL_DTYPE = {d: f"gl.{d.record.triton}" for d in ir.DType}   # spelled from the dtype records

# names the generated module itself uses
_GLUON_NAMES = {"gl", "gluon", "tma", "mbarrier", "fence_async_shared", "warpgroup_mma",
                "warpgroup_mma_wait", "TensorDescriptor", "args", "range", "float"}


class Ctx(SourceWriter):
    def __init__(self, kernel: ir.Kernel, fast_math: bool = False):
        super().__init__(kernel, _GLUON_NAMES, fast_math)
        plan: AsyncPlan = kernel.plan(AsyncPlan)
        self.plan = plan
        self.fn = self.name(kernel.name)
        # global buffers the kernel never writes: an element read twice holds one value
        written = footprint(kernel.body)[1]
        self.read_only = frozenset(b for b in kernel.buffer_params
                                   if b.scope is ir.Scope.GLOBAL and b not in written)
        self.layouts: dict[str, object] = dict(kernel.plan(LayoutPlan).layouts)
        self.counts: dict[str, tuple[int, ...]] = dict(plan.barrier_counts)
        self.default_role: tuple[int, ...] = plan.default_role
        self.descriptors: dict[tuple[str, tuple[int, ...]], str] = {}
        seen: dict[str, int] = {}
        for gname, block in plan.tma_descriptors:
            n = seen[gname] = seen.get(gname, -1) + 1
            self.descriptors[(gname, tuple(block))] = self.fresh(f"{gname}_desc_{n}")
        self.frames: dict[str, object] = dict(kernel.plan(LayoutPlan).frames)
        # shared buffers the SharedMemoryPlan lets share bytes: name -> (its group's arena,
        # offset in the arena, the arena's bytes); the arena is spelled with its first member
        self.arenas: dict[str, tuple[str, int, int]] = {}
        for lo, span, names in kernel.plan(SharedMemoryPlan).reused():
            arena = self.fresh("smem_arena")
            for n, offset, _ in kernel.plan(SharedMemoryPlan).ranges:
                if n in names:
                    self.arenas[n] = (arena, offset - lo, span)
        self.spelled_arenas: set[str] = set()
        self.layout_lines: list[str] = []           # module-level layout constants
        self._layout_consts: dict[object, str] = {}
        self.scalar_locals: dict[str, bool] = dict(plan.scalar_locals)
        self.pointers: dict[str, tuple[tuple[int, ...], ...]] = dict(plan.pointer_params)
        self.register_loads: dict[str, tuple] = {b: (rows, layout) for b, rows, layout
                                                  in plan.register_loads}
        self.shared_chunks = {(c.buffer, c.size): c for c in plan.shared_chunks}
        # the role being emitted: its warp groups, fragments (declared at its start) and gemm
        # accumulators
        self.role: tuple[int, ...] = ()
        self.fragments: dict[str, ir.Buffer] = {}
        self.accumulators: list[ir.Buffer] = []     # gemm accumulators and register A operands
        self.defined: set[str] = set()              # fragments holding a value at this point
        self.par = None                             # the T.Parallel being spelled (fragments.Frame)
        self.named: dict = {}                       # expressions already held in a temporary

    def cast(self, value: str, dt: ir.DType) -> str:
        return f"gl.cast({value}, {GL_DTYPE[dt]})"

    def descriptor(self, g: ir.Region, loc: ir.Loc) -> str:
        """The TMA descriptor of the global region ``g`` (by buffer and box)."""
        key = (g.buffer.name, tuple(g.extents))
        if key not in self.descriptors:
            raise InternalError(f"gluon backend: no TMA descriptor for '{g.buffer.name}' with block "
                                f"{list(g.extents)} (the AsyncPlan's tma_descriptors lack it)", loc)
        return self.descriptors[key]

    def scalar(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The Python variable holding the scalar local ``b`` in the role being emitted."""
        if b.name not in self.scalar_locals:
            raise InternalError(f"gluon backend: {b.scope.value} buffer '{b.name}' is not a scalar "
                                f"local (the AsyncPlan's scalar_locals lack it)", loc)
        return self.name(b.name)

    def pointer(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The pointer parameter of the global buffer ``b`` in the role being emitted."""
        if self.role not in self.pointers.get(b.name, ()):
            raise InternalError(f"gluon backend: '{b.name}' is not passed as a pointer to "
                                f"{describe(self.role)} (the AsyncPlan's pointer_params)", loc)
        return self.name(b.name)

    def layout(self, b: ir.Buffer, loc: ir.Loc) -> str:
        """The module-level constant holding ``b``'s layout."""
        if b.name not in self.layouts:
            raise InternalError(f"gluon backend: no layout for {b.scope.value} buffer '{b.name}' "
                                f"(the LayoutPlan lacks it)", loc)
        return self.layout_const(self.layouts[b.name], f"{b.name}_layout")

    def layout_const(self, layout, hint: str = "layout") -> str:
        """The module-level ``gl.constexpr`` holding ``layout`` (declared on first use, after
        the layouts it derives from)."""
        if layout not in self._layout_consts:
            text = spell_layout(self, layout)
            const = self._layout_consts[layout] = self.fresh(hint)
            self.layout_lines.append(f"{const}: gl.constexpr = gl.constexpr({text})")
        return self._layout_consts[layout]
