"""Typed lowering plans: what a pass decided, for later passes and the emitters to read.

A plan is a frozen dataclass attached to the kernel (``Kernel.plans``, at most one of each type).
The pass named in its ``made_by`` writes it (``kernel.with_plan(plan)``); readers ask for it by
type: ``kernel.plan(SharedMemoryPlan)`` returns it or raises ``InternalError`` naming the pass that
should have made it, so a missing decision is an error at the reader, never a silent default.
``kernel.find_plan(T)`` is for readers to whom absence is itself the answer (no pipelined loop,
no asynchronous form).

Plans name what was decided, not which backend reads it: ``StreamPlan`` is the shape of a kernel
that runs as one stream of threads, ``AsyncPlan`` that of a kernel of concurrent roles driving the
asynchronous copy and matrix engines (TMA, wgmma; the Gluon emitter spells it), ``AsyncRefusal``
why a program has no such form on an asynchronous target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from . import ir
from .errors import InternalError
from .traverse import walk


@dataclass(frozen=True)
class Plan:
    made_by: ClassVar[str] = ""


@dataclass(frozen=True)
class PipelinePlan(Plan):
    """Which statements of the ``T.Pipelined`` loop produce its ring buffers, and which copies
    before the loop load tiles the loop only reads."""
    made_by: ClassVar[str] = "plan_pipeline"
    loop_index: int                  # position of the loop in the kernel body
    producers: tuple[int, ...]       # positions of the producer copies in the loop body (or in
                                     # its guard's body)
    stages: int
    ring_buffers: tuple[str, ...]    # shared buffers the producers fill
    guarded: bool = False            # the loop body is one `if` (iterations may be skipped)
    tile_loop_index: Optional[int] = None   # persistent kernels: the T.Persistent loop's position
                                            # in the kernel body (loop_index is then inside it)
    preloads: tuple[int, ...] = ()   # positions (in the body holding the loop) of global ->
                                     # shared copies before it whose tiles stay fixed (e.g. Q)
    preload_rings: tuple[str, ...] = ()   # preloaded buffers warp_specialize gave a leading
                                          # slot dim (persistent kernels: one slot per tile)


def slot_shape(b: ir.Buffer, pipeline: Optional[PipelinePlan]) -> tuple[int, ...]:
    """The shape of one slot of shared buffer ``b``: without its leading slot dim where ``b`` is
    one of ``pipeline``'s ring buffers or slotted preloads, else at most its last two dims."""
    if pipeline is not None and b.name in pipeline.ring_buffers + pipeline.preload_rings:
        return b.static_shape[1:]
    return b.static_shape[-2:]


@dataclass(frozen=True)
class ConsumerSplit(Plan):
    """The roles split_consumers made of one consumer: copies of one body, each with its own rows,
    so they run the same statements, loops and branches in the same order; ``turns``: their
    row-sum partials do not fit at once, and take_turns has them compute the whole product in
    turns."""
    made_by: ClassVar[str] = "split_consumers"
    roles: tuple[tuple[int, ...], ...]
    turns: bool = False


@dataclass(frozen=True)
class SharedMemoryPlan(Plan):
    """Byte ranges of the shared buffers and barriers, as (name, offset, bytes), and the peak
    ``total_bytes``. Two ranges overlap only where ``reuses`` holds the pair (buffer, buffer whose
    bytes it reuses): the first is live only after the second's live range has ended
    (``lowering.liveness``); ``reused`` gives them as groups."""
    made_by: ClassVar[str] = "plan_buffers"
    ranges: tuple[tuple[str, int, int], ...]
    total_bytes: int
    reuses: tuple[tuple[str, str], ...] = ()

    def reused(self) -> tuple[tuple[int, int, tuple[str, ...]], ...]:
        """The buffers sharing bytes, in groups closed under ``reuses`` (connected components):
        per group its first byte, the bytes its ranges span, and its buffers by offset."""
        group = {n: {n} for pair in self.reuses for n in pair}
        for a, b in self.reuses:
            if group[a] is not group[b]:
                merged = group[a] | group[b]
                for n in merged:
                    group[n] = merged
        at = {n: (o, b) for n, o, b in self.ranges}
        out = []
        for members in {id(g): g for g in group.values()}.values():
            names = tuple(sorted(members, key=lambda n: (at[n][0], n)))
            lo = at[names[0]][0]
            out.append((lo, max(at[n][0] + at[n][1] for n in names) - lo, names))
        return tuple(sorted(out))

    def placed(self, name: str, nbytes: int, align: int) -> "SharedMemoryPlan":
        """This plan with ``nbytes`` for ``name`` after its last range, at a multiple of ``align``."""
        offset = -(-self.total_bytes // align) * align
        return SharedMemoryPlan(self.ranges + ((name, offset, nbytes),), offset + nbytes,
                                self.reuses)

    @staticmethod
    def of(body: ir.Stmt) -> "SharedMemoryPlan":
        """Every shared buffer and barrier allocated in ``body``, in allocation order, one after
        another: tiles 128-byte aligned, barriers 8 bytes each, 8-byte aligned."""
        plan = SharedMemoryPlan((), 0)
        for s in walk(body):
            if isinstance(s, ir.Alloc) and s.buffer.scope in (ir.Scope.SHARED, ir.Scope.BARRIER):
                b = s.buffer
                if b.scope is ir.Scope.BARRIER:
                    plan = plan.placed(b.name, 8 * len(b.arrive_counts), 8)
                else:
                    plan = plan.placed(b.name, b.nbytes, 128)
        return plan


@dataclass(frozen=True)
class LayoutPlan(Plan):
    """The layout of each fragment of a warp-specialized program and of each shared buffer, by
    buffer name, and the layout each ``T.Parallel`` over fragments runs in (values are
    ``lowering.layouts`` records)."""
    made_by: ClassVar[str] = "infer_layouts"
    layouts: tuple[tuple[str, object], ...]
    frames: tuple[tuple[str, object], ...] = ()    # (first variable of a T.Parallel, the layout
                                                   # its indices live in)

    def of(self, name: str):
        return dict(self.layouts).get(name)


@dataclass(frozen=True)
class StreamPlan(Plan):
    """A kernel run as one stream of ``num_warps`` warps (targets without warp specialization)."""
    made_by: ClassVar[str] = "legalize"
    num_warps: int
    passed_params: tuple[str, ...]         # the parameters the kernel's code names, in order: the
                                           # ones passed at launch (a function's combine kernel:
                                           # 3 of its 7 buffers)
    constant_scalar_params: bool = False   # scalar parameters are compile-time constants
    python_ints: bool = False              # integers that are no tensors (constants, scalar
                                           # parameters, loop indices) are Python ints: their
                                           # arithmetic is wrapped to its type by the emitter
    loops_as_while: bool = False           # loops with runtime bounds are spelled as while loops
    wide_offsets: tuple[str, ...] = ()     # global buffers whose element offsets are computed in
                                           # 64 bits (they may hold 2**31 elements or more)
    padded_tiles: bool = False             # tensors take power-of-two extents: see ``tile``
    f32_values: tuple[ir.DType, ...] = ()  # element types whose values are held in float32,
                                           # rounded to the type after each operation (global
                                           # memory keeps the type's bits)

    def passed(self, params) -> tuple:
        """The kernel's ``params`` it is passed at launch (``passed_params``), in order."""
        return tuple(p for p in params if p.name in self.passed_params)

    def tile(self, extents) -> tuple[int, ...]:
        """The shape of the tensor holding a tile, on-chip buffer or ``T.Parallel`` nest of
        ``extents``: each extent n as is, or with ``padded_tiles`` the next power of two (its
        elements from n on are padding, always zero in a buffer)."""
        return tuple(1 << (n - 1).bit_length() if self.padded_tiles else n for n in extents)


@dataclass(frozen=True)
class AsyncPlan(Plan):
    """A kernel of concurrent roles on the asynchronous engines: everything its emitter spells
    beyond the statements themselves."""
    made_by: ClassVar[str] = "legalize_wgmma"
    default_role: tuple[int, ...]                       # warp groups of the default partition
    num_warps: int                                      # the default partition's warps
    barrier_counts: tuple[tuple[str, tuple[int, ...]], ...]   # arrivals per phase, per mbarrier
    tma_descriptors: tuple[tuple[str, tuple[int, ...]], ...]  # (global buffer, box) in order
    scalar_locals: tuple[tuple[str, bool], ...]         # (name, never negative)
    pointer_params: tuple[tuple[str, tuple[tuple[int, ...], ...]], ...]  # (buffer, reading roles)
    register_loads: tuple[tuple[str, int, object], ...] = ()   # (shared buffer, rows per chunk,
                                                        # the chunk's register layout) of each
                                                        # global -> shared copy through registers
    shared_chunks: tuple["SharedChunk", ...] = ()       # how per-thread code reads and
                                                        # writes runs of shared tiles

    @property
    def tma_buffers(self) -> frozenset[str]:
        return frozenset(g for g, _ in self.tma_descriptors)


@dataclass(frozen=True)
class SharedChunk:
    """Per-thread code reading or writing runs of ``size`` elements of shared buffer ``buffer``
    (``lowering/chunks.py``): its leading ``slots`` indices (ring slots) select the tile, a run
    is ``rows`` whole rows of the tile (a multiple of 8) starting at a row known when the kernel
    is compiled (the loops its start depends on are unrolled), so it is a static row slice of the
    tile in the tile's own shared layout, whatever that layout is (a view of the tile as
    [chunks, rows, cols] indexed at run time would be laid out as chunks of their own, which is
    the tile's layout only where a row fits in one swizzle row: not for a 128-column bf16 tile,
    whose 128-byte swizzle stores columns 64.. after all the rows of columns 0..63). One run is
    loaded or stored as a [rows, cols] register tensor in ``layout``, in which thread t holds
    elements t * n .. t * n + n - 1 of the run (n: the loop's vector length), the loop's
    per-thread layout reshaped."""
    buffer: str
    size: int
    slots: int
    rows: int
    layout: object


@dataclass(frozen=True)
class AsyncRefusal(Plan):
    """Why the program has no asynchronous (warp-specialized TMA/wgmma) form."""
    made_by: ClassVar[str] = "legalize_wgmma"
    reason: str


@dataclass(frozen=True)
class MatrixTiling:
    """How the simdgroups of a block share an accumulator held as 8x8 simdgroup matrices: a
    ``warps_m`` x ``warps_n`` grid of simdgroups (simdgroup ``s`` at row ``s // warps_n``, column
    ``s % warps_n``; those from ``warps_m * warps_n`` on hold none), each owning ``tiles_m`` x
    ``tiles_n`` matrices of the ``(8 * tiles_m * warps_m) x (8 * tiles_n * warps_n)`` tile."""
    warps_m: int
    warps_n: int
    tiles_m: int
    tiles_n: int

    @property
    def simdgroups(self) -> int:
        return self.warps_m * self.warps_n


@dataclass(frozen=True)
class FragmentStoragePlan(Plan):
    """Where each fragment and local buffer of a kernel run as one stream of SIMD threads lives
    (targets with ``simdgroup_matrix``), by buffer name, and how the statements over them run:

    * ``"registers"``: element ``f`` (row-major flat index) in thread ``f % threads``, slot
      ``f // threads``; every access is the owning thread's (whole-buffer copies and fills, and
      ``T.Parallel`` loops over exactly the buffer's shape reading it at their own indices, whose
      iteration ``f`` runs on thread ``f % threads``);
    * ``"matrix"``: simdgroup matrices, tiled by ``tilings[name]`` (a gemm accumulator, and the
      fragments T.Parallel loops combine with it element for element); a T.Parallel loop over
      matrices runs per simdgroup tile, staging each 8x8 tile through scratch;
    * ``"private"``: a per-thread local of shape ``thread_shape + own shape``: thread
      ``x + X * (y + Y * z)`` keeps elements ``(z, y, x, ...)`` (its own shape, row-major) in its
      registers; only per-thread T.Parallel loops at their own thread's indices, whole fills and
      whole copies between such buffers touch it;
    * ``"replicated"``: every thread holds the whole buffer and computes the same values (written
      only by statements outside ``T.Parallel``);
    * ``"shared"``: in the block's shared memory, readable by every thread (everything else).

    ``shared_bytes``: the block's shared memory: shared buffers, spilled fragments and scratch;
    ``scratch``: (element type, slots) of the per-simdgroup staging areas, each slot 64 elements,
    that staged matrix copies, reductions across simdgroups (float32 partials) and T.Parallel
    loops over matrices (a slot per matrix buffer) use; ``simdgroups``: the block's simdgroups, of
    ``simd_width`` threads each; ``thread_shape``: the block's thread dims, slowest first, as every
    per-thread T.Parallel loop's leading vars iterate them (its other vars: a loop in each thread),
    () without such loops.

    Per statement, keyed by what later passes keep (``double_buffer`` repeats a loop's statements
    with other indices and buffers, ``insert_syncs`` adds barriers), each read through its method,
    which raises ``InternalError`` for a statement legalize_metal did not decide:

    * ``matrix_copies`` (``staged``): for each copy out of a matrix buffer, by ``copy_key`` (source
      buffer, destination buffer, destination extents, mechanism: what decides it), whether it goes
      through the simdgroup's scratch slot (it masks, converts, or writes a destination whose rows
      are not contiguous) rather than storing the matrices straight to the destination;
    * ``reductions`` (``simdgroups_per_output``): by result buffer, how many simdgroups reduce each
      of its outputs together (1: each simdgroup takes whole outputs; more: they combine their
      float32 partials through scratch);
    * ``parallels`` (``matrix_loop``): by the name of a T.Parallel loop's first variable (None for
      the loop of no variables around a scalar statement), the matrix
      buffers it touches as (name, element type, scratch slot among that type's slots), in name
      order; none for a loop whose iterations are dealt to the threads element by element."""
    made_by: ClassVar[str] = "legalize_metal"
    storage: tuple[tuple[str, str], ...]
    tilings: tuple[tuple[str, MatrixTiling], ...]
    shared_bytes: int
    scratch: tuple[tuple[ir.DType, int], ...]
    simdgroups: int
    simd_width: int
    matrix_copies: tuple[tuple[tuple, bool], ...]
    reductions: tuple[tuple[str, int], ...]
    parallels: tuple[tuple[str, tuple[tuple[str, ir.DType, int], ...]], ...]
    thread_shape: tuple[int, ...] = ()

    def of(self, name: str) -> str:
        return dict(self.storage)[name]

    def tiling(self, name: str) -> MatrixTiling:
        return dict(self.tilings)[name]

    @staticmethod
    def copy_key(s: ir.Copy) -> tuple:
        """What decides how a copy out of a matrix buffer runs (no later pass changes it)."""
        return s.src.buffer.name, s.dst.buffer.name, s.dst.extents, s.mechanism.value

    def staged(self, s: ir.Copy) -> bool:
        return _decided(self.matrix_copies, self.copy_key(s), s,
                        f"copy out of matrix buffer '{s.src.buffer.name}'")

    def simdgroups_per_output(self, s: ir.Reduce) -> int:
        return _decided(self.reductions, s.dst.name, s, f"reduction into '{s.dst.name}'")

    @staticmethod
    def parallel_key(s: ir.Parallel) -> Optional[str]:
        """What a T.Parallel's decision is kept by: its first variable's name (None for the
        loop of no variables around a scalar statement)."""
        return s.vars[0].name if s.vars else None

    def matrix_loop(self, s: ir.Parallel) -> tuple[tuple[str, ir.DType, int], ...]:
        key = self.parallel_key(s)
        return _decided(self.parallels, key, s, f"T.Parallel over '{key}'")


def _decided(table: tuple, key, s: ir.Stmt, what: str):
    for k, v in table:
        if k == key:
            return v
    raise InternalError(f"FragmentStoragePlan has no decision for the {what} (legalize_metal "
                        f"decides every one)", s.loc)
