"""The bulk (TMA) reduce-add of a shared tile into a global tile, as a Gluon builtin: Triton 3.6
builds the operation (``ttng.async_tma_reduce``, ``cp.reduce.async.bulk.tensor`` on sm_90) but
its Gluon language has no function for it. Called like ``tma.async_copy_shared_to_global``, and
waited for like it (``tma.store_wait``): the emitted source imports it where a kernel adds a
tile (``emit``, ``stmts._bulk_reduce_add``)."""
from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental.gluon.language._core import builtin


@builtin
def async_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[tile of ``tensor_desc`` at ``coord``] += ``src`` (a shared tile), elementwise and
    atomically per element, issued asynchronously."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              coord, src.handle)
