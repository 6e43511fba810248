"""What a backend's passes are given: the machine's ``Capabilities``, the backend's pipeline, its
``SchedulePolicy`` and its ``CodegenOptions``, in one frozen ``BackendConfig``.

A backend is (capabilities, pipeline, options). ``tilews.backends.configure`` is the one place that
makes a backend's config from the machine, the settings and the pass configs; passes read it and
never decide whether they apply (that is the pipeline's business).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .capabilities import Capabilities
from .pipeline import Pipeline


@dataclass(frozen=True)
class SchedulePolicy:
    """Schedule choices of a warp-specialized backend (each measured; docs/performance.md)."""
    overlap_softmax: bool = True    # overlap_softmax's deferred form: a block's first gemm under
                                    # the previous block's fragment math (TILEWS_OVERLAP_SOFTMAX)
    overlap_gemms: bool = True      # overlap_gemms: a block's independent wgmmas in flight
                                    # together, each waited where first needed
                                    # (TILEWS_OVERLAP_GEMMS)
    merge_releases: bool = True     # merge_releases: ring slots released together share one
                                    # barrier (TILEWS_MERGE_RELEASES)
    overlap_promotion: bool = True  # overlap_promotion: an FP8 k-loop's wgmma in flight while
                                    # the previous k-block's product is promoted
                                    # (TILEWS_OVERLAP_PROMOTION)
    pingpong: bool = False          # split consumer warp groups take turns issuing their gemms
                                    # (opt-in: 1-5% slower for attention on an H100,
                                    # scripts/tune_attention.py)
    preload_slots: int = 2          # slots of a persistent kernel's per-tile preloads
                                    # (attention's Q): with 2 the next tile's are loaded while
                                    # this one computes (where they fit shared memory)
    staging_per_store: bool = True  # a persistent kernel's epilogue stores each result tile
                                    # through its own staging tile where shared memory holds them
                                    # (overlap_store keeps them in flight together), else one per
                                    # shape, each store waited for
    split_consumers: bool = True    # split_consumers applies (measurements turn it off to compare)
    split_partials: bool = True     # split_consumers also splits a consumer whose gemm sums over
                                    # the rows (attention backward's dQ): each role adds its own
                                    # partial (TILEWS_SPLIT_PARTIALS; D64 backward main kernel
                                    # 1.12 -> 0.96x cuDNN's backward time, H200)
    sum_partials: bool = False      # sum_partials: those roles' partials summed in shared memory,
                                    # one atomic add (opt-in, measured slower; TILEWS_SUM_PARTIALS)
    reduce_role: bool = True        # reduce_role: a consumer loop's bulk reduce-adds of a staged
                                    # tile issued by a warp of their own (attention backward's dQ;
                                    # TILEWS_REDUCE_ROLE)
    take_turns: bool = False        # where the roles' whole partials would not fit the registers
                                    # (D128 backward), split_consumers splits anyway and the roles
                                    # compute the whole product in turns (take_turns; opt-in,
                                    # TILEWS_TAKE_TURNS: the op's split-tail and causal kernels
                                    # spill that way and are slower, docs/performance.md)


@dataclass(frozen=True)
class CodegenOptions:
    """Code choices the user makes through pass configs (``tilews.pass_config``)."""
    fast_math: bool = False         # tl.enable_fast_math: fp32 division and square root in
                                    # Triton's approximate forms, else IEEE-rounded
    register_copies: bool = False   # tl.enable_lower_ldgstg: a producer's global -> shared copy
                                    # that TMA cannot take (rows not 16-byte aligned) goes through
                                    # its warp group's registers instead of refusing


@dataclass(frozen=True)
class BackendConfig:
    caps: Capabilities
    pipeline: Pipeline
    policy: SchedulePolicy = field(default_factory=SchedulePolicy)
    codegen: CodegenOptions = field(default_factory=CodegenOptions)

    @property
    def name(self) -> str:
        """The target's name, as messages give it."""
        return self.caps.name

    def field_owners(self) -> dict[str, str]:
        """Each field of the capabilities, policy and code options -> the part holding it."""
        return {f.name: part for part in ("caps", "policy", "codegen")
                for f in dataclasses.fields(getattr(self, part))}

    def replace(self, **changes) -> "BackendConfig":
        """This config with fields of its capabilities, policy or code options changed, each
        named by its own name (``config.replace(num_sms=4, pingpong=True)``)."""
        parts = {"caps": self.caps, "policy": self.policy, "codegen": self.codegen}
        owners = self.field_owners()
        unknown = sorted(set(changes) - set(owners))
        if unknown:
            raise TypeError(f"BackendConfig.replace: no field {', '.join(unknown)}; the fields are "
                            f"{', '.join(sorted(owners))}")
        for part in parts:
            mine = {k: v for k, v in changes.items() if owners[k] == part}
            if mine:
                parts[part] = dataclasses.replace(parts[part], **mine)
        return dataclasses.replace(self, **parts)
