"""The Gluon backend: warp-specialized Hopper (sm_90a) kernels.

It lowers for sm_90 (with the machine's SM count, for persistent grids) and refuses a program
whose lowering made an ``AsyncRefusal`` instead of an ``AsyncPlan`` (the next backend of the
chain, ``tl``, compiles it). Loading compiles the source for sm_90a (compile-only on a machine
without a GPU), so the program's shared memory as Triton counts it is known before any launch
(``shared_bytes``: the compiler lowers again where it exceeds the machine's). Its output
depends on the Triton version and on our TTGIR passes, both part of its fingerprint.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from tilews.lowering import ir
from tilews.lowering.backend import Backend, Machine
from tilews.lowering.capabilities import SM90, Capabilities
from tilews.lowering.config import BackendConfig
from tilews.lowering.passes import (check_barriers, coarsen_handshakes, infer_layouts, legalize,
                                    legalize_wgmma, longest_first, mask_after_gemm, merge_releases,
                                    overlap_gemms, overlap_mma, overlap_promotion, overlap_softmax,
                                    overlap_store, panel_grid, persist, pingpong, plan_buffers,
                                    plan_pipeline, reduce_role, registerize, ring_handshakes,
                                    runtime_clear, split_consumers,
                                    split_extents, sum_partials, swizzle_grid, take_turns,
                                    uniform_selects, warp_specialize)
from tilews.lowering.pipeline import Pass, Phase, Pipeline
from tilews.lowering.plans import AsyncRefusal

from ..toolchain import triton_version
from .emit import emit
from .launch import GluonProgram


PIPELINE = Pipeline((
    # The roles as written, before passes rewrite them: a deadlock hangs the GPU, so it is
    # refused at the user's lines.
    Phase("check", (Pass.of(check_barriers),)),
    # Before the pipeline is planned: a mask written into a gemm's accumulator before the gemm
    # (TileLang's attention scores) is applied to its result instead, so nothing branches
    # between the previous block's P and its P V wgmma; a mask that is the same over a whole tile
    # (causal attention below the diagonal) becomes a scalar branch, and tiles whose extents are
    # not powers of two (head dim 192) become power-of-two pieces, which every later pass plans,
    # rings and legalizes as written; then a branch zeroing a gemm's accumulator (the blocks
    # uniform_selects found unmasked) becomes the gemm's run-time choice to overwrite it.
    Phase("shape", (Pass.of(mask_after_gemm), Pass.of(uniform_selects), Pass.of(split_extents),
                    Pass.of(runtime_clear))),
    # Before layouts and buffers: warp specialization decides which buffers become rings and
    # which roles exist, so later passes plan for the buffers and roles that really exist.
    # A large GEMM becomes persistent first, so the pipeline is planned inside its tile loop;
    # a kernel left one block per tile starts its longest blocks (causal attention's last query
    # blocks) first.
    # An explicit program's one-slot handshake steps through K in 128-byte rows, then becomes a
    # ring, before its roles are split (both rewrite the loop the roles share, and the ring's
    # buffers are what the later passes plan);
    # then one consumer role per warp group where their rows are independent, or each with its
    # own partial of a gemm over the rows (attention backward's dQ at D64; opted in, where
    # those partials do not fit the registers (D128) the roles compute the whole product in
    # turns, or the roles sum their partials before one add).
    # Shared buffers left as one role's scratch then become register tiles.
    Phase("specialize", (Pass.of(persist), Pass.of(longest_first), Pass.of(plan_pipeline),
                         Pass.of(coarsen_handshakes), Pass.of(ring_handshakes),
                         Pass.of(warp_specialize), Pass.of(split_consumers), Pass.of(take_turns),
                         Pass.of(sum_partials), Pass.of(registerize))),
    # Rings and roles are final: place shared buffers and check the budget, then layouts.
    Phase("plan memory", (Pass.of(plan_buffers), Pass.of(infer_layouts))),
    # The copy mechanisms, then Hopper's choices (TMA, wgmma, register budgets) or the reason to
    # use triton.language (the tl backend of the chain).
    Phase("legalize", (Pass.of(legalize), Pass.of(legalize_wgmma))),
    # After the instruction choice: the next block's first gemm under this block's fragment math
    # (attention's Q K^T under the softmax), the split consumer warp groups taking turns to issue
    # those gemms, an FP8 k-loop's wgmma in flight under the previous k-block's promotion, one
    # wgmma in flight across iterations of a GEMM main loop, and a tile's result store in flight
    # under the next tile's main loop (persistent kernels).
    # Then, in what those left as written, each block's independent wgmmas in flight together
    # under its fragment math (the attention backward's five gemms); then ring slots those
    # release together share one barrier (the backward's Q and dO slots), and a warp of its own
    # issues the reduce-adds a consumer's loop makes from a staged tile (the backward's dQ),
    # handed over by that release.
    Phase("overlap", (Pass.of(overlap_softmax), Pass.of(pingpong), Pass.of(overlap_promotion),
                      Pass.of(overlap_mma), Pass.of(overlap_store), Pass.of(overlap_gemms),
                      Pass.of(merge_releases), Pass.of(reduce_role))),
    # Last: persist made its own panels, and legalize read block ranges from the 2-d grid. A
    # grid of GEMM tiles left in launch order by the program gets panels as T.use_swizzle's.
    Phase("grid", (Pass.of(panel_grid), Pass.of(swizzle_grid))),
))


class GluonBackend(Backend):
    name = "gluon"
    pipeline = PIPELINE

    @classmethod
    def capabilities(cls, machine: Machine) -> Capabilities:
        return dataclasses.replace(SM90, num_sms=machine.num_sms)

    def refuses(self, lowered: ir.Kernel) -> Optional[str]:
        refusal = lowered.find_plan(AsyncRefusal)
        return None if refusal is None else refusal.reason

    def emit(self, lowered: ir.Kernel) -> str:
        return emit(lowered, self.config.codegen.fast_math)

    def load(self, lowered: ir.Kernel, source: str, options: dict) -> GluonProgram:
        return GluonProgram(source, lowered, self.services.store, triton_version())

    def shared_bytes(self, program: GluonProgram) -> int:
        """Triton's total for the compiled kernel: our arena (the ``SharedMemoryPlan``) and
        Triton's own scratch beside it (layout conversions: the D192 attention backward's
        ``convert_layout`` between dot operands of two mma parents takes 4 KB)."""
        return program.metadata["shared"]

    def fingerprint(self) -> tuple:
        from tilews.triton_ext import passes as ttgir_passes
        return super().fingerprint() + (triton_version(), ttgir_passes.cache_key_part())


HOPPER = BackendConfig(SM90, PIPELINE)   # the backend's config without pass configs, SM count unknown
