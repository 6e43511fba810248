"""The tilews tile language: ``import tilews.language as T``."""
from .allreduce import attr, comm_reducer, evaluate, tvm_thread_allreduce
from .copy import copy, tma_copy
from .eager import const, empty
from .elementwise import (Cast, abs, atomic_add, cast, ceildiv, clear, exp, exp2, fill,
                          if_then_else, infinity, log, log2, max, min, rsqrt, sqrt)
from .elementwise import ceil, clamp, floordiv, floormod, reinterpret, shift_left
from .fp8 import fp8_scaled_matmul
from .gemm import GemmWarpPolicy, gemm
from .hints import (annotate_layout, dec_max_nreg, disable_warp_group_reg_alloc, inc_max_nreg,
                    no_set_max_nreg, set_max_nreg)
from .kernel import Kernel, macro, prim_func, use_swizzle, ws
from .loops import (Parallel, Persistent, Pipelined, Serial, Unroll, Vectorized, grouped_tile,
                    serial, unroll, vectorized)
from .memory import (alloc_barrier, alloc_fragment, alloc_global, alloc_local, alloc_shared,
                     alloc_var, create_list_of_mbarrier, get_mbarrier, make_tensor, ptr)
from .reduce import reduce_abssum, reduce_max, reduce_min, reduce_sum
from .reduce import alloc_reducer, cumsum, finalize_reducer, reduce_absmax
from .extern import access_ptr, call_extern, import_source
from .threads import (get_block_binding, get_thread_binding, get_thread_bindings, sync_threads,
                      thread_binding)
from .sync import barrier_arrive, barrier_wait, mbarrier_arrive, mbarrier_wait_parity
from .warp import (dp4a, shfl_down, shfl_sync, shfl_up, shfl_xor, warp_reduce_max,
                   warp_reduce_min, warp_reduce_sum)
from .types import (Buffer, DType, Tensor, bfloat16, boolean, dtype, dynamic, float8_e4m3,
                    float8_e4m3fn, float8_e5m2, float16, float32, float64, half, int8, int16,
                    int32, int64, tfloat32, uint8, uint16, uint32, uint64)
from tilews.layout import Layout

from . import unsupported

bool = boolean  # noqa: A001  (TileLang spelling T.bool)
float = float32  # noqa: A001  (TileLang's "float")
int = int32  # noqa: A001  (TileLang's C names of dtypes)
uint = uint32
short = int16
long = int64
double = float64


def __getattr__(name: str):
    """TileLang's names tilews does not provide say why (``unsupported``)."""
    return unsupported.missing(name)
