"""The Tile IR: typed, frozen, target-neutral.

Every pass reads and writes it, the interpreter executes it and every backend emits from it.
Nodes are frozen dataclasses; each carries the ``Loc`` of the user's source it came from
(``loc`` takes no part in equality, so structural comparison ignores it). Nothing here is named
after a backend: per-statement decisions are neutral fields that ``legalize`` fills
(``Copy.mechanism``, ``Gemm.instr``, ``Role.num_warps``, the ``mask_low`` of global accesses),
whole-kernel decisions are typed plans (``lowering/plans.py``) on ``Kernel.plans``. Element types
are ``dtypes.DType``.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Optional, Union

from .dtypes import DTYPE_ALIASES, DType  # noqa: F401  (re-exported: ir.DType)
from .errors import InternalError
from .loc import UNKNOWN_LOC, Loc  # noqa: F401  (re-exported: ir.Loc)


def _loc() -> Loc:
    return field(default=UNKNOWN_LOC, compare=False, repr=False)


class Scope(enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"
    FRAGMENT = "fragment"
    LOCAL = "local"
    BARRIER = "barrier"


# ----------------------------------------------------------------------------------------------
# Expressions


@dataclass(frozen=True)
class Expr:
    """Base of scalar expressions (inside ``Parallel`` they are evaluated per element)."""


@dataclass(frozen=True)
class Const(Expr):
    """A constant; a float constant of a type narrower than float32 holds a value of its type
    (rounded to it when built; wider ones are rounded where they are used, as every target does)."""
    value: Union[int, float, bool]
    dtype: DType
    loc: Loc = _loc()

    def __post_init__(self):
        if isinstance(self.value, float) and self.dtype.is_float and self.dtype.bits < 32:
            object.__setattr__(self, "value", self.dtype.rounded(self.value))


class VarKind(enum.Enum):
    BLOCK = "block"      # block index bound by Kernel
    LOOP = "loop"        # serial / pipelined / unrolled loop index
    PARALLEL = "par"     # element index of a Parallel loop
    PARAM = "param"      # runtime scalar kernel parameter (T.dynamic dims, scalar arguments)
    THREAD = "thread"    # a thread's index (T.get_thread_binding); the frontend only: its
                         # thread-level lowering (frontend/threads.py) leaves none


@dataclass(frozen=True)
class Var(Expr):
    name: str
    dtype: DType
    kind: VarKind
    loc: Loc = _loc()


class BinOpKind(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"          # true division for floats
    FLOORDIV = "//"    # floor division (integers)
    MOD = "%"          # Python modulo (sign of the divisor)
    AND = "&"
    OR = "|"
    XOR = "^"
    SHL = "<<"
    SHR = ">>"
    LAND = "and"       # logical, on bools
    LOR = "or"


@dataclass(frozen=True)
class BinOp(Expr):
    op: BinOpKind
    a: Expr
    b: Expr
    dtype: DType
    loc: Loc = _loc()


class CmpKind(enum.Enum):
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    EQ = "=="
    NE = "!="


@dataclass(frozen=True)
class Cmp(Expr):
    op: CmpKind
    a: Expr
    b: Expr
    loc: Loc = _loc()

    @property
    def dtype(self) -> DType:
        return DType.BOOL


class UnOpKind(enum.Enum):
    NEG = "-"
    NOT = "not"
    INVERT = "~"


@dataclass(frozen=True)
class UnOp(Expr):
    op: UnOpKind
    a: Expr
    dtype: DType
    loc: Loc = _loc()


class MathFn(enum.Enum):
    EXP = "exp"
    EXP2 = "exp2"
    LOG = "log"
    LOG2 = "log2"
    MAX = "max"
    MIN = "min"
    ABS = "abs"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    CEIL = "ceil"


@dataclass(frozen=True)
class Call(Expr):
    fn: MathFn
    args: tuple[Expr, ...]
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True)
class Cast(Expr):
    value: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True)
class Bitcast(Expr):
    """``value``'s bits read as ``dtype`` (``T.reinterpret``); the frontend keeps the two widths
    equal."""
    value: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True)
class Select(Expr):
    """``T.if_then_else(cond, a, b)``."""
    cond: Expr
    a: Expr
    b: Expr
    dtype: DType
    loc: Loc = _loc()


@dataclass(frozen=True)
class Load(Expr):
    """One element of a buffer (per element inside ``Parallel``). ``mask_low`` (global buffers,
    decided by ``legalize``; ``()`` before): per dim, whether the index may be negative, so the
    access must check ``index >= 0``."""
    buffer: "Buffer"
    indices: tuple[Expr, ...]
    loc: Loc = _loc()
    mask_low: tuple[bool, ...] = ()

    @property
    def dtype(self) -> DType:
        return self.buffer.dtype


# ----------------------------------------------------------------------------------------------
# Buffers and regions


@dataclass(frozen=True)
class Buffer:
    """A named tensor in one memory scope. Global buffers are kernel parameters; their shape may
    hold ``Var`` (runtime dims). Barrier buffers hold ``len(arrive_counts)`` mbarriers."""
    name: str
    shape: tuple[Expr, ...]
    dtype: DType
    scope: Scope
    arrive_counts: tuple[int, ...] = ()
    loc: Loc = _loc()

    @property
    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; only valid for buffers whose dims are all constants."""
        return tuple(d.value for d in self.shape)  # type: ignore[attr-defined]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.static_shape:
            n *= d
        return n


@dataclass(frozen=True)
class Region:
    """The box ``buffer[starts[i] : starts[i] + extents[i]]``; extents are static. ``mask_low``
    (global buffers, decided by ``legalize``; ``()`` before): per dim, whether the start may be
    negative, so an access that masks (``CopyMechanism.MASKED``, atomics) must check ``>= 0``."""
    buffer: Buffer
    starts: tuple[Expr, ...]
    extents: tuple[int, ...]
    loc: Loc = _loc()
    mask_low: tuple[bool, ...] = ()

    @property
    def is_whole(self) -> bool:
        """The region is its whole buffer (every start 0, every extent the buffer's)."""
        return all(as_int(st) == 0 for st in self.starts) and tuple(self.extents) == self.buffer.static_shape

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """The extents with unit dims dropped (the shape the region has as a tile)."""
        return tuple(e for e in self.extents if e != 1) or (1,)


@dataclass(frozen=True)
class BarrierRef:
    """One mbarrier of a barrier buffer."""
    buffer: Buffer
    index: Expr
    loc: Loc = _loc()


# ----------------------------------------------------------------------------------------------
# Statements


@dataclass(frozen=True)
class Stmt:
    """Base of statements."""


@dataclass(frozen=True)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class Alloc(Stmt):
    buffer: Buffer
    loc: Loc = _loc()


@dataclass(frozen=True)
class PointerView(Stmt):
    """``buffer = T.make_tensor(address, shape, dtype, strides)``: from here to the end of the
    enclosing statement list, global ``buffer`` (not a parameter) is the memory at ``address``, a
    64-bit integer expression (a device address, typically an element of an int64 pointer table)
    evaluated once, here; element ``idx`` lies at ``address + sum(idx[d] * strides[d]) * itemsize``.
    ``strides`` (elements) are row-major over ``buffer.shape`` unless the program gave them. The
    address exists only inside the kernel, so no copy of ``buffer`` can use a tensor descriptor
    made at launch (TMA): its copies are DIRECT or MASKED."""
    buffer: Buffer
    address: Expr
    strides: tuple[Expr, ...]
    loc: Loc = _loc()


class CopyMechanism(enum.Enum):
    """How a copy is performed; ``legalize`` decides, emitters spell it."""
    UNDECIDED = "undecided"
    DIRECT = "direct"          # in bounds by construction: no mask
    MASKED = "masked"          # boundary tiles: zero-fill on load, masked store
    TMA = "tma"                # bulk tensor copy engine (asynchronous)


@dataclass(frozen=True)
class Copy(Stmt):
    src: Region
    dst: Region
    barrier: Optional[BarrierRef] = None      # completes asynchronously on this barrier
    mechanism: CopyMechanism = CopyMechanism.UNDECIDED
    loc: Loc = _loc()


class GemmInstr(enum.Enum):
    """The matrix instruction; ``legalize`` decides."""
    UNDECIDED = "undecided"
    DOT = "dot"                    # the target's native tile dot
    DOT_F32_OPERANDS = "dot_f32"   # operands upcast to f32 first (exact for 16-bit inputs)
    WGMMA = "wgmma"                # Hopper warp-group MMA, issued asynchronously (see GemmWait)


class GemmPrecision(enum.Enum):
    """How float32 operands may be multiplied (the frontend records the program's choice;
    ignored for other operand dtypes). The interpreter, Metal and Triton's CPU interpreter
    multiply float32 exactly either way; TF32 permits tensor cores that round the operands to
    tf32 (10-bit mantissa), as ``torch.backends.cuda.matmul.allow_tf32`` does."""
    TF32 = "tf32"                  # Triton's input_precision "tf32"; wgmma's float32 form
    IEEE = "ieee"                  # exact float32 products: no wgmma (legalize_wgmma refuses)


@dataclass(frozen=True)
class Gemm(Stmt):
    """C (+)= op(A) @ op(B): ``C = ...`` with ``clear_accum``, or where the scalar condition
    ``clear_if`` holds at run time (``runtime_clear``); ``C += ...`` otherwise."""
    a: Region
    b: Region
    c: Region
    transpose_a: bool = False
    transpose_b: bool = False
    clear_accum: bool = False
    instr: GemmInstr = GemmInstr.UNDECIDED
    precision: GemmPrecision = GemmPrecision.TF32
    loc: Loc = _loc()
    clear_if: Optional[Expr] = None

    @property
    def may_clear(self) -> bool:
        """Whether the gemm may overwrite C instead of adding to it."""
        return self.clear_accum or self.clear_if is not None


@dataclass(frozen=True)
class GemmWait(Stmt):
    """Wait until at most ``outstanding`` asynchronous gemms issued by this role are in flight.
    An asynchronous gemm's accumulator may be read, and its operands overwritten, only after a
    wait that covers it. (The interpreter runs gemms synchronously: a no-op there.)"""
    outstanding: int
    loc: Loc = _loc()


@dataclass(frozen=True)
class BulkStoreWait(Stmt):
    """Wait until at most ``outstanding`` of this role's bulk (TMA) stores are still reading
    their shared source. A source may be written again only after a wait that covers its store.
    (The interpreter's stores are synchronous: a no-op there.)"""
    outstanding: int
    loc: Loc = _loc()


@dataclass(frozen=True)
class ProxyFence(Stmt):
    """Orders this role's generic shared-memory writes before later asynchronous-proxy accesses
    (bulk tensor copies, wgmma operand reads) of the same memory. A no-op in the interpreter."""
    loc: Loc = _loc()


@dataclass(frozen=True)
class BlockSync(Stmt):
    """Every thread of the block waits here for all the others; their writes to shared memory (and,
    with ``device``, to global memory) before it are visible to every thread after it. Inserted by
    ``insert_syncs`` on targets whose backend spells the barriers itself (Metal), and for
    per-thread code in the interpreter, where it ends an epoch of its checks for races between
    threads (``interpreter/thread_races.py``; elsewhere a no-op there); otherwise a whole-tile
    statement is one step and needs none."""
    device: bool = False
    loc: Loc = _loc()


@dataclass(frozen=True)
class Fill(Stmt):
    dst: Region
    value: Expr
    loc: Loc = _loc()


class ReduceKind(enum.Enum):
    MAX = "max"
    MIN = "min"
    SUM = "sum"
    ABSSUM = "abssum"
    ABSMAX = "absmax"

    @property
    def of_abs(self) -> bool:
        """The kind reduces the absolute values of its source (``abssum``, ``absmax``)."""
        return self in (ReduceKind.ABSSUM, ReduceKind.ABSMAX)


@dataclass(frozen=True)
class Reduce(Stmt):
    kind: ReduceKind
    src: Buffer
    dst: Buffer
    dim: int
    clear: bool = True
    loc: Loc = _loc()


@dataclass(frozen=True)
class CumSum(Stmt):
    """``dst`` = the inclusive prefix sums of ``src`` along ``dim`` (``reverse``: from the end of
    the dim); the two buffers have one shape and may be the same buffer (in place). Float sums
    are accumulated in float32 at least, then rounded to ``dst``'s dtype."""
    src: Buffer
    dst: Buffer
    dim: int
    reverse: bool = False
    loc: Loc = _loc()


@dataclass(frozen=True)
class Store(Stmt):
    """``buffer[indices] = value``; per element inside ``Parallel``, once otherwise. ``mask_low``
    as in ``Load``."""
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr
    loc: Loc = _loc()
    mask_low: tuple[bool, ...] = ()


MEMORY_ORDERS = ("relaxed", "acquire", "release", "acq_rel")


@dataclass(frozen=True)
class AtomicAdd(Stmt):
    """``dst += value`` atomically; value is an Expr (element form) or a Region (tile form).

    Element form outside ``T.Parallel``: one add per block. ``prev`` (that form only): a local
    one-element buffer receiving the value ``dst`` held before the add. ``order`` (one of
    ``MEMORY_ORDERS``) orders the *block's* other global accesses around the add, at device
    scope: ``release``, every write the block made before it is visible to a block that
    ``acquire``s this element after it; ``acquire``, the block's later reads see what the
    releasing blocks wrote; ``acq_rel`` both; ``relaxed`` neither (only the add is atomic)."""
    dst: Region
    value: Union[Expr, Region]
    loc: Loc = _loc()
    prev: Optional[Buffer] = None
    order: str = "relaxed"

    @property
    def releases(self) -> bool:
        """The block's earlier writes must precede the add (every thread's: a block barrier)."""
        return self.order in ("release", "acq_rel")

    @property
    def acquires(self) -> bool:
        """The block's later reads must follow the add (no thread reads before it returned)."""
        return self.order in ("acquire", "acq_rel")


@dataclass(frozen=True)
class Parallel(Stmt):
    """Element-wise loop nest; iterations are independent.

    ``per_thread``: the loop is code the program wrote per thread (``T.get_thread_binding``):
    its vars are the block's thread indices, slowest first (z, y, x of ``threads=(x, y, z)``),
    its extents the thread counts, so iteration ``(z, y, x)`` is the work of thread
    ``x + X * (y + Y * z)``. Backends that place iterations on threads themselves (Metal) give
    each thread its own iteration; others treat it as any ``Parallel``."""
    vars: tuple[Var, ...]
    extents: tuple[int, ...]
    body: Seq
    loc: Loc = _loc()
    per_thread: bool = False


class ForKind(enum.Enum):
    SERIAL = "serial"
    PIPELINED = "pipelined"
    UNROLL = "unroll"
    PERSISTENT = "persistent"   # a block's loop over output tiles (T.Persistent): one tile per iteration


@dataclass(frozen=True)
class For(Stmt):
    var: Var
    start: Expr
    stop: Expr
    step: Expr
    kind: ForKind
    body: Seq
    num_stages: int = 0
    loc: Loc = _loc()


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: Seq
    orelse: Seq
    loc: Loc = _loc()


@dataclass(frozen=True)
class Role(Stmt):
    """Statements run by exactly the warp groups ``warpgroups`` (``T.ws``). ``num_warps`` and
    ``num_regs`` (per thread) are what warp specialization decided for the role (0: undecided);
    before that, a source-form role's ``num_regs`` is the program's request (``T.set_max_nreg``
    in the block; 0: none), which ``roles.split`` keeps and ``legalize_wgmma`` honours."""
    warpgroups: tuple[int, ...]
    body: Seq
    num_warps: int = 0
    num_regs: int = 0
    loc: Loc = _loc()


@dataclass(frozen=True)
class WarpSpecialize(Stmt):
    """Concurrently running roles, each with the whole program projected onto it."""
    roles: tuple[Role, ...]
    loc: Loc = _loc()


@dataclass(frozen=True)
class BarrierArrive(Stmt):
    """One arrival of the role on ``barrier``. ``after_role_barrier``: the role's threads first
    wait for each other (a barrier of the role's threads), so the arrival hands over shared memory
    every one of them wrote or read, not only what the arriving thread did (a role's own wgmma
    waits and TMA copies need none)."""
    barrier: BarrierRef
    loc: Loc = _loc()
    after_role_barrier: bool = False


@dataclass(frozen=True)
class BarrierWait(Stmt):
    """Wait until the phase of ``barrier`` with parity ``parity`` has completed."""
    barrier: BarrierRef
    parity: Expr
    loc: Loc = _loc()


@dataclass(frozen=True)
class Kernel:
    """One kernel: parameters (global buffers and runtime scalars), grid, threads, body.

    ``plans`` holds what passes decided (``lowering.plans``: typed, one of each type); ``notes``
    what they decided or refused, in words, for the compile report.
    """
    name: str
    params: tuple[Union[Buffer, Var], ...]
    grid: tuple[Expr, ...]
    block_vars: tuple[Var, ...]
    threads: int
    body: Seq
    swizzle_panel: int = 0
    # block indices defined from the launched ones, in order, once at the start of every block
    # (each expression reads ``block_vars`` and earlier definitions): e.g. the grouped tile order
    block_defs: tuple[tuple[Var, Expr], ...] = ()
    # FP8 products must be promoted into fp32 at least every this many elements of K (block-scaled
    # FP8 matmuls; 0: no requirement). Backends check their compiled code against it.
    fp8_promote_every: int = 0
    plans: tuple = ()
    notes: tuple[str, ...] = ()
    # global buffers among ``params`` that no caller passes: scratch memory (``T.alloc_global``)
    # the runtime allocates, uninitialized, and keeps for the next call of the same shapes on the
    # same stream (``tilews.binding``); every kernel of a ``Function`` sees the same ones
    scratch: tuple[Buffer, ...] = ()
    loc: Loc = _loc()

    def plan(self, kind: type):
        """The plan of type ``kind``; an ``InternalError`` if no pass made one."""
        found = self.find_plan(kind)
        if found is None:
            raise InternalError(f"kernel '{self.name}' has no {kind.__name__} (made by the "
                                f"{kind.made_by} pass, which has not run or did not apply)", self.loc)
        return found

    def find_plan(self, kind: type):
        """The plan of type ``kind``, or None where its absence is the answer."""
        return next((p for p in self.plans if type(p) is kind), None)

    def with_plan(self, plan) -> "Kernel":
        kept = tuple(p for p in self.plans if type(p) is not type(plan))
        return dataclasses.replace(self, plans=kept + (plan,))

    def with_note(self, note: str) -> "Kernel":
        return dataclasses.replace(self, notes=self.notes + (note,))

    def rewritten(self, body: "Seq", lines, note: str) -> "Kernel":
        """This kernel with ``body`` and ``note``, its ``{lines}`` the rewritten source lines
        (sorted, each once); the kernel itself where a pass rewrote no line."""
        if not lines:
            return self
        where = ", ".join(str(n) for n in sorted(set(lines)))
        return dataclasses.replace(self, body=body).with_note(note.format(lines=where))

    @property
    def buffer_params(self) -> tuple[Buffer, ...]:
        return tuple(p for p in self.params if isinstance(p, Buffer))

    @property
    def scalar_params(self) -> tuple[Var, ...]:
        return tuple(p for p in self.params if isinstance(p, Var))


@dataclass(frozen=True)
class Function:
    """A kernel function: the kernels its ``with T.Kernel`` blocks make, in launch order. They
    share the function's parameters (every kernel has all of them, in the same order, so one
    argument list launches each) and its scratch buffers; a kernel sees what earlier ones wrote
    to them. Passes and emitters see one ``Kernel`` at a time; only the runtime sees this."""
    name: str
    kernels: tuple[Kernel, ...]
    loc: Loc = _loc()

    @property
    def params(self) -> tuple[Union[Buffer, Var], ...]:
        return self.kernels[0].params

    @property
    def scratch(self) -> tuple[Buffer, ...]:
        return self.kernels[0].scratch


NODE_CLASSES = (Const, Var, BinOp, Cmp, UnOp, Call, Cast, Bitcast, Select, Load, Buffer, Region,
                BarrierRef, Seq, Alloc, PointerView, Copy, Gemm, GemmWait, BulkStoreWait, ProxyFence, BlockSync, Fill, Reduce, CumSum, Store, AtomicAdd, Parallel, For,
                If, Role, WarpSpecialize, BarrierArrive, BarrierWait, Kernel)


def const(value, dtype: Optional[DType] = None, loc: Loc = UNKNOWN_LOC) -> Const:
    """A constant, with the dtype Python's type implies unless given."""
    if dtype is None:
        dtype = DType.BOOL if isinstance(value, bool) else DType.I32 if isinstance(value, int) else DType.F32
    return Const(value, dtype, loc)


def whole_region(b: Buffer, loc: Loc) -> Region:
    """All of buffer ``b`` (static shape) as a region."""
    return Region(b, tuple(Const(0, DType.I32, loc) for _ in b.shape), b.static_shape, loc)


def slot_region(b: Buffer, slot: Expr, loc: Loc) -> Region:
    """Slot ``slot`` (dim 0) of the ring buffer ``b``, whole."""
    zero = Const(0, DType.I32, loc)
    return Region(b, (slot,) + (zero,) * (len(b.shape) - 1), (1,) + b.static_shape[1:], loc)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def as_int(e: Expr) -> Optional[int]:
    """The value of an integer constant, else None."""
    if isinstance(e, Const) and not isinstance(e.value, bool) and isinstance(e.value, int):
        return e.value
    return None
