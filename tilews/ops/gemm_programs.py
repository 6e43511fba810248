"""The GEMM programs ``tilews.ops.matmul`` chooses among, written in the tile language.

Each is a ``tilews.jit`` factory over the problem shape and a schedule's knobs; ``matmul_schedule``
says which program and knobs a shape gets. All compute ``C = A @ B`` for A [M, K] and B [K, N]
(row-major) with float32 accumulation; ``precision`` is ``T.gemm``'s, for float32 operands
(``"tf32"``: tensor cores may round them; ``"ieee"``: exact products):

* ``tiled``: one block per output tile (the warp-specialized TMA ring on Hopper); 64-row tiles
  for small M, narrow tiles for small N.
* ``persistent``: one block per SM over the output tiles in grouped order; on Hopper the next
  tile's loads run under this tile's store.
* ``split_k`` + ``split_k_reduce``: the K loop cut into ``splits`` slices, each block writing a
  float32 partial tile into a workspace [M, splits * N'] (N' = N in whole tiles); a second kernel sums the slices in a fixed
  order (deterministic) and casts. For shapes with too few output tiles to fill the GPU.
* ``split_k_fused``: split-K in one kernel: each block stores its float32 partial tile as
  ``split_k`` does, then counts itself in a per-tile arrival counter; the block arriving last
  sums the slices (in slice order: deterministic) and stores C. Saves the reduction kernel's
  launch and ramp, which is most of the time at M <= 32. With 16- or 32-row blocks it is a
  ``triton.language`` kernel (cp.async ring, mma); with 64-row multiples it is warp-specialized
  on Hopper, its tiles stored from registers ahead of the release (``warp_specialize``).
* ``swap_ab``: C^T = B^T A^T for small M, so N fills the wgmma's 64-row M dimension and M becomes
  the narrow N of the instruction; the tile is stored transposed.
* ``stream_k``: persistent, the tiles of the last partial wave shared out among all blocks by k
  iterations (``StreamK``), their partials summed in the kernel as ``split_k_fused`` sums its
  slices; M is fixed at build time.
"""
from __future__ import annotations

import dataclasses

import tilews
import tilews.language as T


@tilews.jit(out_idx=[-1])
def tiled(M, N, K, block_M=128, block_N=128, block_K=64, num_stages=3, threads=128, swizzle=0,
          dtype=T.bfloat16, out_dtype=T.bfloat16, precision="tf32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle:
                T.use_swizzle(swizzle)
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(C_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_f, precision=precision)
            T.copy(C_f, C[by * block_M, bx * block_N])
    return main


@tilews.jit(out_idx=[-1])
def persistent(M, N, K, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
               num_sms=132, group_size=8, dtype=T.bfloat16, out_dtype=T.bfloat16, precision="tf32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(num_sms, threads=threads) as block_id:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            for bx, by in T.Persistent([T.ceildiv(M, block_M), T.ceildiv(N, block_N)], num_sms,
                                       block_id, group_size):
                T.clear(C_f)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    T.copy(A[bx * block_M, k * block_K], A_s)
                    T.copy(B[k * block_K, by * block_N], B_s)
                    T.gemm(A_s, B_s, C_f, precision=precision)
                T.copy(C_f, C[bx * block_M, by * block_N])
    return main


def k_tiles_per_split(K: int, block_K: int, splits: int) -> int:
    """How many block_K-wide k tiles each of ``splits`` slices covers (the last may cover fewer
    real ones: its loads past K read zeros)."""
    return -(-(-(-K // block_K)) // splits)


def split_width(N: int, block_N: int) -> int:
    """Columns of one slice in the split-K workspace: N rounded up to whole tiles, so a ragged
    last tile's bulk store stays inside its own slice."""
    return -(-N // block_N) * block_N


@tilews.jit(out_idx=[-1])
def split_k(M, N, K, splits=4, block_M=64, block_N=128, block_K=64, num_stages=4, threads=128,
            dtype=T.bfloat16, precision="tf32"):
    """Partial products in float32: W[:, s * Np : s * Np + N] = A[:, Ks] @ B[Ks, :] for the s-th
    slice Ks of K (Np = ``split_width(N, block_N)``; columns N..Np of each slice are zeros)."""
    per = k_tiles_per_split(K, block_K, splits)
    Np = split_width(N, block_N)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             W: T.Tensor((M, splits * Np), T.float32)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages, precision)
            T.copy(C_f, W[by * block_M, bz * Np + bx * block_N])
    return main


@T.macro
def _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages, precision):
    """C_f = the product of A's row tile ``by`` and B's column tile ``bx`` (C_f's shape) over
    the ``per`` k tiles of K slice ``bz``, through a ``num_stages`` ring."""
    block_M, block_N = C_f.shape
    A_s = T.alloc_shared((block_M, block_K), A.dtype)
    B_s = T.alloc_shared((block_K, block_N), B.dtype)
    T.clear(C_f)
    for k in T.Pipelined(per, num_stages=num_stages):
        T.copy(A[by * block_M, (bz * per + k) * block_K], A_s)
        T.copy(B[(bz * per + k) * block_K, bx * block_N], B_s)
        T.gemm(A_s, B_s, C_f, precision=precision)


@tilews.jit(out_idx=[-1])
def split_k_reduce(M, N, splits, split_N, block_M=32, block_N=128, threads=128, out_dtype=T.bfloat16):
    """C = the sum over s of W's slice s (``split_N`` columns apart), in slice order, cast to
    ``out_dtype``."""
    @T.prim_func
    def main(W: T.Tensor((M, splits * split_N), T.float32), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            acc = T.alloc_fragment((block_M, block_N), T.float32)
            T.clear(acc)
            for s in T.serial(splits):
                for i, j in T.Parallel(block_M, block_N):
                    acc[i, j] += W[by * block_M + i, s * split_N + bx * block_N + j]
            T.copy(acc, C[by * block_M, bx * block_N])
    return main


ARRIVAL_SLOTS = T.dynamic("arrival_slots")


@tilews.jit(out_idx=[-2, -1])
def split_k_fused(M, N, K, splits=2, block_M=16, block_N=64, block_K=128, num_stages=4, threads=128,
                  dtype=T.bfloat16, out_dtype=T.bfloat16, precision="tf32"):
    """C = A @ B, K cut into ``splits`` slices, one block per (output tile, slice), summed in the
    same kernel. Each block stores its float32 partial into W (``split_k``'s layout), then adds 1
    to ``Arrivals[tile]`` (acq_rel, tiles numbered row by row); the block that sees
    ``splits - 1`` there arrived last: every other partial is visible to it. It sums the partials
    in slice order (the same bits whichever block is last), stores C and puts the count back to 0.

    Contract: ``Arrivals`` holds zeros at launch, at least ``ceildiv(M, block_M) *
    ceildiv(N, block_N)`` of them, and no other launch uses it meanwhile (one per stream). W is
    scratch; it is returned only because outputs are how a kernel gets fresh memory."""
    per = k_tiles_per_split(K, block_K, splits)
    Np = split_width(N, block_N)
    n_tiles = -(-N // block_N)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             Arrivals: T.Tensor((ARRIVAL_SLOTS,), T.int32), W: T.Tensor((M, splits * Np), T.float32),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(n_tiles, T.ceildiv(M, block_M), splits, threads=threads) as (bx, by, bz):
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            _k_slice(A, B, C_f, bx, by, bz, per, block_K, num_stages, precision)
            T.copy(C_f, W[by * block_M, bz * Np + bx * block_N])
            tile = by * n_tiles + bx
            arrived = T.atomic_add(Arrivals[tile], 1, memory_order="acq_rel", return_prev=True)
            if arrived == splits - 1:
                T.clear(C_f)
                for s in T.serial(splits):
                    for i, j in T.Parallel(block_M, block_N):
                        C_f[i, j] += W[by * block_M + i, s * Np + bx * block_N + j]
                T.copy(C_f, C[by * block_M, bx * block_N])
                T.atomic_add(Arrivals[tile], -splits)
    return main


@dataclasses.dataclass(frozen=True)
class StreamK:
    """How a stream-K GEMM shares its work among ``blocks`` persistent blocks: the first
    ``sk_tiles`` output tiles (in panel order) are cut into their ``k_tiles`` k iterations, and
    block b takes iterations [``first_iter(b)``, ``first_iter(b + 1)``) of them, tile after tile,
    as up to ``segments`` segments; the other tiles go whole to the blocks in turn.
    ``slots`` is the most blocks sharing one tile (the workspace's partial tiles per tile)."""
    tiles: int
    k_tiles: int
    blocks: int
    sk_tiles: int

    @classmethod
    def plan(cls, tiles: int, k_tiles: int, blocks: int, sk_waves: int = 0) -> "StreamK":
        """The tiles of the last partial wave (plus ``sk_waves`` whole waves, where there are
        that many) shared out; none when the tiles fill whole waves or there are fewer k
        iterations to share than blocks (each block must get one)."""
        rem = tiles % blocks
        sk = rem + blocks * min(sk_waves, tiles // blocks) if rem else 0
        return cls(tiles, k_tiles, blocks, sk if sk * k_tiles >= blocks else 0)

    @property
    def sk_iters(self) -> int:
        return self.sk_tiles * self.k_tiles

    def first_iter(self, b):
        return b * self.sk_iters // self.blocks

    def owner(self, it):
        """The block whose iterations hold shared iteration ``it``."""
        return ((it + 1) * self.blocks - 1) // self.sk_iters

    @property
    def segments(self) -> int:
        if not self.sk_tiles:
            return 0
        return max((self.first_iter(b + 1) - 1) // self.k_tiles - self.first_iter(b) // self.k_tiles + 1
                   for b in range(self.blocks))

    @property
    def slots(self) -> int:
        if not self.sk_tiles:
            return 0
        return max(self.owner((t + 1) * self.k_tiles - 1) - self.owner(t * self.k_tiles) + 1
                   for t in range(self.sk_tiles))

    @property
    def units(self) -> int:
        """Work units of all blocks: each block's ``segments`` (some may be empty), then the
        whole tiles."""
        return self.blocks * self.segments + self.tiles - self.sk_tiles

    def unit(self, b, u, shared_first: bool):
        """(tile, k_lo, k_hi) of unit ``u`` of block ``b`` (``T.Persistent([units], blocks, b)``
        binds u = b, b + blocks, ...): its segments of shared tiles, then whole tiles
        (``shared_first``) — or the whole tiles first. A segment past the block's iterations is
        empty (k_lo >= k_hi)."""
        whole = self.tiles - self.sk_tiles          # a multiple of blocks when any is shared
        if shared_first:
            r, shared, tile = u // self.blocks, u < self.blocks * self.segments, \
                self.sk_tiles + u - self.blocks * self.segments
        else:
            r, shared, tile = (u - whole) // self.blocks, u >= whole, self.sk_tiles + u
        lo, n = self.first_iter(b), self.k_tiles
        t = T.if_then_else(shared, lo // n + r, tile)
        k_lo = T.if_then_else(shared, T.max(lo - t * n, 0), 0)
        k_hi = T.if_then_else(shared, T.min(self.first_iter(b + 1) - t * n, n), n)
        return t, k_lo, k_hi


@T.macro
def _k_range(A, B, A_s, B_s, C_f, by, bx, k_lo, k_hi, num_stages, precision):
    """C_f = the product of A's row tile ``by`` and B's column tile ``bx`` over k tiles
    [k_lo, k_hi), through a ``num_stages`` ring of A_s and B_s."""
    block_M, block_K = A_s.shape
    block_N = B_s.shape[1]
    T.clear(C_f)
    for k in T.Pipelined(k_lo, k_hi, num_stages=num_stages):
        T.copy(A[by * block_M, k * block_K], A_s)
        T.copy(B[k * block_K, bx * block_N], B_s)
        T.gemm(A_s, B_s, C_f, precision=precision)


@tilews.jit(out_idx=[-2, -1])
def stream_k(M, N, K, block_M=128, block_N=256, block_K=64, num_stages=3, threads=256,
             num_sms=132, group_size=16, sk_waves=0, shared_first=False, dtype=T.bfloat16,
             out_dtype=T.bfloat16, precision="tf32"):
    """C = A @ B on ``num_sms`` persistent blocks, the tiles of the last partial wave shared
    out by k iterations (``StreamK``), so no block idles while others finish a wave. Each block
    runs its whole tiles, then its segments of the shared tiles (``shared_first``: the other
    way round; on an H100 whole tiles first measured 1521 against 1577 us at 8192^3 and 205
    against 216 us at 4096^3, scripts/probe_stream_k.py). A segment covering part of a tile
    stores its float32 partial in W (slot =
    the block's rank among the tile's blocks) and counts itself in ``Arrivals[tile]``
    (acq_rel); the block arriving last sums the tile's partials in slot order, stores C and puts
    the count back to 0. Slot 0's segment (the tile's first k iterations, which its block runs
    last of all its shared work) usually arrives last: it first reads the count (acquire), and
    when every other slot is in, adds them to its own partial in registers without storing it,
    which saves a partial tile's write and read. Either way the sum is ((slot 0 + slot 1) +
    ...): the same bits whichever block is last. ``Arrivals`` and W follow ``split_k_fused``'s
    contract (zeros at launch, one launch at a time; W is scratch). M, N and K are build-time
    ints: the plan shares out a fixed number of tiles."""
    if not all(isinstance(d, int) for d in (M, N, K)):
        raise TypeError(f"stream_k: M, N and K must be ints known at build time, got {M!r}, "
                        f"{N!r}, {K!r}")
    tm, tn = -(-M // block_M), -(-N // block_N)
    ipt = -(-K // block_K)
    sk = StreamK.plan(tm * tn, ipt, num_sms, sk_waves)
    slots = max(sk.slots, 1)

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype),
             Arrivals: T.Tensor((ARRIVAL_SLOTS,), T.int32),
             W: T.Tensor((max(sk.sk_tiles, 1) * slots * block_M, block_N), T.float32),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(num_sms, threads=threads) as b:
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_f = T.alloc_fragment((block_M, block_N), T.float32)
            for u in T.Persistent([sk.units], num_sms, b):
                t, k_lo, k_hi = sk.unit(b, u, shared_first)
                by, bx = T.grouped_tile(t, [tm, tn], group_size)
                _k_range(A, B, A_s, B_s, C_f, by, bx, k_lo, k_hi, num_stages, precision)
                C_tile = C[by * block_M, bx * block_N]
                if k_hi - k_lo == ipt:
                    T.copy(C_f, C_tile)
                elif k_lo < k_hi:
                    first = sk.owner(t * ipt)
                    parts = sk.owner((t + 1) * ipt - 1) - first + 1
                    rows = t * slots * block_M          # the tile's slots in W
                    # only slot 0 reads the count first (an atomic per segment costs a round
                    # trip): the other slots always store and count
                    if b == first:
                        seen = T.atomic_add(Arrivals[t], 0, memory_order="acquire", return_prev=True)
                        if seen == parts - 1:
                            _sum_partials(C_f, W, rows, 1, parts)
                            T.copy(C_f, C_tile)
                            T.atomic_add(Arrivals[t], 1 - parts)
                        else:
                            _arrive_with_partial(C_f, W, rows, 0, parts, Arrivals[t], C_tile)
                    else:
                        _arrive_with_partial(C_f, W, rows, b - first, parts, Arrivals[t], C_tile)
    return main


@T.macro
def _arrive_with_partial(C_f, W, rows, slot, parts, count, C_tile):
    """Store this segment's partial C_f as slot ``slot`` of its tile's ``parts`` slots (C_f's
    shape, stacked in W from row ``rows``), count it in ``count`` (acq_rel); the segment arriving
    last sums the slots in order into C_tile and puts ``count`` back to 0."""
    block_M = C_f.shape[0]
    T.copy(C_f, W[rows + slot * block_M, 0])
    arrived = T.atomic_add(count, 1, memory_order="acq_rel", return_prev=True)
    if arrived == parts - 1:
        T.copy(W[rows, 0], C_f)
        _sum_partials(C_f, W, rows, 1, parts)
        T.copy(C_f, C_tile)
        T.atomic_add(count, -parts)


@T.macro
def _sum_partials(C_f, W, rows, start, stop):
    """C_f += slots start .. stop - 1 of the partials stacked in W from row ``rows``, in order."""
    block_M, block_N = C_f.shape
    for s in T.serial(start, stop):
        for i, j in T.Parallel(block_M, block_N):
            C_f[i, j] += W[rows + s * block_M + i, j]


@tilews.jit(out_idx=[-1])
def swap_ab(M, N, K, block_N=128, block_M=32, block_K=64, num_stages=6, threads=128,
            dtype=T.bfloat16, out_dtype=T.bfloat16, precision="tf32"):
    """C^T tiles: [block_N, block_M] = B[:, n-tile]^T @ A[m-tile, :]^T, stored transposed."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            Ct_f = T.alloc_fragment((block_N, block_M), T.float32)
            T.clear(Ct_f)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(B_s, A_s, Ct_f, transpose_A=True, transpose_B=True, precision=precision)
            for i, j in T.Parallel(block_N, block_M):
                C[by * block_M + j, bx * block_N + i] = Ct_f[i, j]
    return main
