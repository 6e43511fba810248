"""FP8 scaled matmul as a ready-made op: ``fp8_scaled_mm``, a drop-in for ``torch._scaled_mm``.

Built on the tile language's ``T.fp8_scaled_matmul`` (whole-GEMM form): on Hopper a
warp-specialized, persistent FP8 wgmma kernel when b is column-major (torch's convention: ``b =
w.t()`` with w [N, K] contiguous, i.e. K-major); a row-major b is read as it is, tile by tile
(``triton.language`` transposes tiles on Hopper). On CPU tensors it runs on the interpreter path.
"""
from __future__ import annotations

import torch

import tilews
import tilews.language as T
from tilews.lowering import dtypes
from tilews.lowering.fp8 import granularity, scale_blocks

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_OUT = (torch.bfloat16, torch.float16, torch.float32)


@tilews.jit(out_idx=[-1])
def scaled_mm_kernel(M, N, K, a_scale_shape, b_scale_shape, transpose_B, use_fast_accum,
                     a_dtype=T.float8_e4m3, b_dtype=T.float8_e4m3, out_dtype=T.bfloat16,
                     transpose_A_scale=False, tiles=()):
    """C = scaled (A @ B) for A [M, K] and B [N, K] (``transpose_B``) or [K, N]; the scale
    shapes choose the granularity (``tilews.lowering.fp8``); block-wise A scales
    k-block-major with ``transpose_A_scale``; ``tiles``: (name, value) pairs of the intrinsic's
    tile hints (none: the target's default tiles)."""
    @T.prim_func
    def main(A: T.Tensor((M, K), a_dtype), A_scale: T.Tensor(a_scale_shape, T.float32),
             B: T.Tensor((N, K) if transpose_B else (K, N), b_dtype),
             B_scale: T.Tensor(b_scale_shape, T.float32), C: T.Tensor((M, N), out_dtype)):
        T.fp8_scaled_matmul(A, A_scale, B, B_scale, C, transpose_B=transpose_B,
                            use_fast_accum=use_fast_accum, transpose_A_scale=transpose_A_scale,
                            **dict(tiles))
    return main


def _scales(M: int, N: int, K: int, scale_a: torch.Tensor, scale_b: torch.Tensor):
    """torch's scale conventions -> the intrinsic's: block-wise b scales are [K / 128, N / 128]
    in torch's orientation, [N / 128, K / 128] in the intrinsic's (a transposed view); block-wise
    a scales stored M-major, as torch's block-wise ``_scaled_mm`` takes them, go k-block-major
    (``transpose_A_scale``: [K / 128, M], a contiguous view), which lets the Hopper kernel
    bulk-copy each k-block's scales beside its tiles; row-major ones go as they are (copying
    them to the other layout cost more than it saved: H100, 4096^3 and 1024 x 14336 x 4096, 2.5%
    and 3.5% below the M-major call). With k-block-major a scales the b scales are bulk-copied
    too, as a contiguous [N / 128, K / 128] tensor: torch's layout for them (the transpose of
    one) is a view, any other a copy. Returns (a scales, b scales, whether the a scales are
    k-block-major)."""
    kb, nb = scale_blocks(K), scale_blocks(N)
    sa = scale_a.reshape(1) if scale_a.dim() == 0 else scale_a
    sb = scale_b.reshape(1) if scale_b.dim() == 0 else scale_b
    if tuple(sa.shape) == (M, kb) and tuple(sb.shape) == (kb, nb) and tuple(sb.shape) != (1, N):
        m_major = sa.t().is_contiguous()
        if not m_major:
            return sa, sb.t(), False
        return sa.t(), sb.t().contiguous(), True
    try:            # per tensor / row / column; block-wise b scales only in torch's orientation
        if not granularity(M, N, K, sa.shape, sb.shape).block_wise:
            return sa, sb, False
    except ValueError:
        pass
    raise ValueError(f"fp8_scaled_mm(): scale_a {list(scale_a.shape)} and scale_b "
                     f"{list(scale_b.shape)} match no granularity for M={M}, N={N}, K={K}; "
                     f"accepted: per tensor [] or [1] each; per row / column scale_a [{M}, 1] and "
                     f"scale_b [1, {N}]; block-wise scale_a [{M}, {kb}] (1 x 128 blocks of a) and "
                     f"scale_b [{kb}, {nb}] (128 x 128 blocks of b)")


def kernel_inputs(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype = torch.bfloat16, use_fast_accum: bool = False):
    """``fp8_scaled_mm``'s inputs checked and mapped onto its kernel: (the arguments of
    ``scaled_mm_kernel``, the operands its kernel takes before C). A column-major b is passed as
    the [N, K] tensor it is a view of (the K-major Hopper path); block-wise b scales as the
    intrinsic's [N / 128, K / 128] view. Reads only shapes, strides and dtypes (meta tensors do)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"fp8_scaled_mm(): '{name}' must be a 2-d tensor")
        if t.dtype not in _FP8:
            raise TypeError(f"fp8_scaled_mm(): '{name}' is {t.dtype}; a and b must be "
                            f"torch.float8_e4m3fn or torch.float8_e5m2")
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            raise TypeError(f"fp8_scaled_mm(): '{name}' must be a float32 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)}")
    if out_dtype not in _OUT:
        raise TypeError(f"fp8_scaled_mm(): out_dtype must be torch.bfloat16, torch.float16 or "
                        f"torch.float32, got {out_dtype}")
    (M, K), (K2, N) = a.shape, b.shape
    if K2 != K:
        raise ValueError(f"fp8_scaled_mm(): a is [{M}, {K}] but b is [{K2}, {N}]: K differs")
    sa, sb, sa_t = _scales(M, N, K, scale_a, scale_b)
    k_major = b.stride(0) == 1 and b.stride(1) == K          # b = w.t(), w [N, K] row-major
    B = b.t() if k_major else b.contiguous()
    args = (M, N, K, tuple(sa.shape), tuple(sb.shape), k_major, bool(use_fast_accum),
            dtypes.from_torch(a.dtype), dtypes.from_torch(b.dtype), dtypes.from_torch(out_dtype),
            sa_t)
    return args, (a.contiguous(), sa, B, sb)


def fp8_scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                  use_fast_accum: bool = False) -> torch.Tensor:
    """``(a @ b)`` scaled by ``scale_a`` / ``scale_b``, as ``torch._scaled_mm``: a [M, K], b
    [K, N] FP8 (float8_e4m3fn / float8_e5m2, may differ); float32 scales per tensor, per row of a /
    column of b, or block-wise; ``bias`` [N] is added to the result (after the kernel, not fused);
    ``use_fast_accum=False`` promotes the tensor cores' FP8 partial sums into float32 every 128
    of K."""
    args, operands = kernel_inputs(a, b, scale_a, scale_b, out_dtype, use_fast_accum)
    M, N, K = args[:3]
    if bias is not None and (bias.shape != (N,) or bias.device != a.device):
        raise ValueError(f"fp8_scaled_mm(): bias must be a [{N}] tensor on {a.device}")
    if M == 0 or N == 0 or K == 0:
        out = torch.zeros(M, N, dtype=out_dtype, device=a.device)
    else:
        out = scaled_mm_kernel(*args)(*operands)
    return out if bias is None else out.add_(bias.to(out_dtype))
