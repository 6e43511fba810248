"""TileLang's pass configs (``tilews.jit(pass_configs={...})``): the keys, and what each means here.

A pass config is a dict whose keys are ``PassConfigKey`` members or their strings
(``"tl.enable_fast_math"``). TileLang's compiler reads some fifty such switches; tilews gives four
of them a meaning and records the rest:

* ``tl.enable_fast_math``: fp32 division and square root use Triton's approximate forms
  (``x / y``: ``div.full.f32``; ``tl.sqrt``: ``sqrt.approx.f32``). Without it they are IEEE-rounded
  (``div_rn``, ``sqrt_rn``), as TileLang's CUDA is without ``--use_fast_math``. ``exp``/``exp2``
  and ``rsqrt`` are Triton's hardware approximations either way; ``log``/``log2`` are precise
  either way. The ``interpret`` target computes exactly either way.
* ``tl.disable_warp_specialized`` and ``tl.disable_tma_lower`` (deprecated in TileLang, which warns):
  on target ``hopper`` the warp-specialized Gluon path (TMA producer, wgmma consumers) is skipped
  and the kernel is compiled with ``triton.language``; other targets never warp-specialize.
* ``tl.enable_lower_ldgstg`` (TileLang: lower copies to plain global loads and shared stores): on
  target ``hopper``, a pipelined global -> shared copy that TMA cannot take (rows not a multiple
  of 16 bytes) is loaded by the producer's warp group through registers (``ld.global``,
  ``st.shared``, a proxy fence, then its arrival), so the program stays warp-specialized instead
  of falling back to ``triton.language``. Off by default: not yet timed on a GPU.
* Every other key of ``PassConfigKey``: accepted and recorded in the compile report ("no tilews
  meaning").

Unlike TileLang, which accepts any key, an unknown key is a ``ValueError`` listing the known ones,
so a misspelled switch is never silently ignored. A meaningful switch's value must be a bool.
"""
from __future__ import annotations

import difflib
import enum
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional


class PassConfigKey(str, enum.Enum):
    """TileLang's pass-config keys (``tilelang.transform.PassConfigKey``); a member equals its
    string: ``PassConfigKey.TL_ENABLE_FAST_MATH == "tl.enable_fast_math"``."""

    # the keys tilews gives a meaning (module docstring)
    TL_ENABLE_FAST_MATH = "tl.enable_fast_math"
    TL_DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
    TL_DISABLE_TMA_LOWER = "tl.disable_tma_lower"
    # TileLang's other keys: accepted and recorded
    TL_SIMPLIFY = "tl.Simplify"
    TL_SIMPLIFY_TRANSITIVELY_PROVE_INEQUALITIES = "transitively_prove_inequalities"
    TL_SIMPLIFY_CONVERT_BOOLEAN_TO_AND_OF_ORS = "convert_boolean_to_and_of_ors"
    TL_SIMPLIFY_APPLY_CONSTRAINTS_TO_BOOLEAN_BRANCHES = "apply_constraints_to_boolean_branches"
    TL_SIMPLIFY_PROPAGATE_KNOWNS_TO_PROVE_CONDITIONAL = "propagate_knowns_to_prove_conditional"
    TL_SIMPLIFY_PROPAGATE_KNOWNS_TO_SIMPLIFY_EXPRESSIONS = "propagate_knowns_to_simplify_expressions"
    TL_SIMPLIFY_ENABLE_LET_INLINE = "enable_simplify_let_inline"
    TL_DISABLE_BUFFER_INIT_CHECK = "tl.disable_buffer_init_check"
    TL_DISABLE_DATA_RACE_CHECK = "tl.disable_data_race_check"
    TL_DISABLE_PRELOWER_SEMANTIC_CHECK = "tl.disable_prelower_semantic_check"
    TL_PTXAS_REGISTER_USAGE_LEVEL = "tl.ptxas_register_usage_level"
    TL_DEVICE_COMPILE_FLAGS = "tl.device_compile_flags"
    TL_EMIT_LINE_DIRECTIVES = "tl.emit_line_directives"
    TL_CONFIG_INDEX_BITWIDTH = "tl.config_index_bitwidth"
    TL_ENABLE_REDUCER_PLAN_VERBOSE = "tl.enable_reducer_plan_verbose"
    TL_LAYOUT_COST_MODEL = "tl.layout_cost_model"
    TL_REDUCER_FORCE_BASELINE = "tl.reducer_force_baseline"
    TL_DISABLE_SAFE_MEMORY_ACCESS = "tl.disable_safe_memory_legalize"
    TL_DISABLE_VECTORIZE_256 = "tl.disable_vectorize_256"
    TL_ENABLE_ASYNC_COPY = "tl.enable_async_copy"
    TL_ENABLE_LOWER_LDGSTG = "tl.enable_lower_ldgstg"
    TL_ENABLE_LOWER_LDGSTG_PREDICATED = "tl.enable_lower_ldgstg_predicated"
    TL_ENABLE_VECTORIZE_PLANNER_VERBOSE = "tl.enable_vectorize_planner_verbose"
    TL_DISABLE_WGMMA = "tl.disable_wgmma"
    TL_DEBUG_MERGE_SHARED_MEMORY_ALLOCATIONS = "tl.debug_merge_shared_memory_allocations"
    TL_ENABLE_AGGRESSIVE_SHARED_MEMORY_MERGE = "tl.enable_aggressive_shared_memory_merge"
    TL_DISABLE_SHARED_MEMORY_REUSE = "tl.disable_shared_memory_reuse"
    TL_DISABLE_SHUFFLE_ELECT = "tl.disable_shuffle_elect"
    TL_DISABLE_LOOP_UNSWITCHING = "tl.disable_loop_unswitching"
    TL_LOOP_UNSWITCHING_ALLOW_NON_TRIVIAL_ELSE = "tl.loop_unswitching_allow_non_trivial_else"
    TL_IF_STMT_BINDING_INLINE_REPLAYABLE_BINDS = "tl.if_stmt_binding_inline_replayable_binds"
    TL_DISABLE_THREAD_STORAGE_SYNC = "tl.disable_thread_storage_sync"
    TL_FORCE_LET_INLINE = "tl.force_let_inline"
    TL_AST_PRINT_ENABLE = "tl.ast_print_enable"
    TL_LAYOUT_VISUALIZATION_ENABLE = "tl.layout_visualization_enable"
    TL_LAYOUT_VISUALIZATION_FORMATS = "tl.layout_visualization_formats"
    TL_STORAGE_REWRITE_DETECT_INPLACE = "tl.storage_rewrite_detect_inplace"
    TL_DISABLE_OUT_OF_BOUND_WARNING = "tl.disable_out_of_bound_warning"
    TL_ENABLE_DUMP_IR = "tl.enable_dump_ir"
    TL_DUMP_IR_DIR = "tl.dump_ir_path"
    TL_PASS_PROFILE = "tl.pass_profile"
    TL_PASS_PROFILE_THRESHOLD_MS = "tl.pass_profile_threshold_ms"
    # an older TileLang member, still used by its sm100 FP8 example
    TL_ENABLE_PTXAS_VERBOSE_OUTPUT = "tl.enable_ptxas_verbose_output"
    TIR_ENABLE_EQUIV_TERMS_IN_CSE = "tir.enable_equiv_terms_in_cse_tir"
    TIR_DISABLE_CSE = "tirx.disable_cse_tir"
    TIR_SIMPLIFY = "tirx.Simplify"
    TIR_DISABLE_STORAGE_REWRITE = "tirx.disable_storage_rewrite"
    TIR_DISABLE_VECTORIZE = "tirx.disable_vectorize"
    TIR_USE_ASYNC_COPY = "tirx.use_async_copy"
    TIR_ENABLE_DEBUG = "tirx.enable_debug"
    TIR_MERGE_STATIC_SMEM = "tirx.merge_static_smem"
    TIR_ADD_LOWER_PASS = "tirx.add_lower_pass"
    TIR_NOALIAS = "tirx.noalias"
    CUDA_KERNELS_OUTPUT_DIR = "cuda.kernels_output_dir"

    def __str__(self) -> str:
        return self.value


# the switches that turn off the warp-specialized (TMA-fed) Gluon path on Hopper
_NO_WARP_SPECIALIZATION = (PassConfigKey.TL_DISABLE_WARP_SPECIALIZED, PassConfigKey.TL_DISABLE_TMA_LOWER)
_MEANINGFUL = (PassConfigKey.TL_ENABLE_FAST_MATH, PassConfigKey.TL_ENABLE_LOWER_LDGSTG) \
    + _NO_WARP_SPECIALIZATION


@dataclass(frozen=True)
class PassOptions:
    """What a pass-config dict asks of tilews."""
    fast_math: bool = False
    no_warp_specialization: tuple[str, ...] = ()  # the keys (set true) that turn the Gluon path off
    recorded: tuple[str, ...] = ()                # keys given that have no tilews meaning
    register_copies: bool = False                 # tl.enable_lower_ldgstg

    @property
    def warp_specialization(self) -> bool:
        return not self.no_warp_specialization

    def notes(self, target: str, dropped: tuple[str, ...]) -> tuple[str, ...]:
        """Report notes for a compile for ``target`` (a resolved target name) whose chain lost the
        backends ``dropped`` to these options."""
        notes = []
        if self.fast_math:
            effect = ("no effect: the interpreter computes exactly" if target == "interpret" else
                      "fp32 division and square root use Triton's approximate forms")
            notes.append(f"{PassConfigKey.TL_ENABLE_FAST_MATH}: {effect}")
        if self.register_copies:
            effect = ("producer copies TMA cannot take go through registers" if target == "hopper"
                      else f"no effect: target '{target}' has no TMA producer")
            notes.append(f"{PassConfigKey.TL_ENABLE_LOWER_LDGSTG}: {effect}")
        for key in self.no_warp_specialization:
            effect = (f"the {', '.join(dropped)} backend (warp-specialized, TMA) is skipped; "
                      f"compiled with triton.language" if dropped else
                      f"no effect: target '{target}' does not warp-specialize")
            notes.append(f"{key}: {effect}")
        notes += [f"pass config {key} has no tilews meaning; recorded" for key in self.recorded]
        return tuple(notes)


def resolve(pass_configs: Optional[Mapping[Any, Any]]) -> PassOptions:
    """Validate ``pass_configs`` (keys: ``PassConfigKey`` members or their strings) and say what
    takes effect. An unknown key is a ``ValueError`` listing the known ones; a meaningful switch
    whose value is not a bool is a ``ValueError`` naming it. ``tl.disable_tma_lower`` warns with a
    ``DeprecationWarning``, as TileLang does."""
    fast_math, register_copies, no_ws, recorded = False, False, [], []
    for raw, value in (pass_configs or {}).items():
        key = _key(raw)
        if key is PassConfigKey.TL_DISABLE_TMA_LOWER:
            warnings.warn(f"pass config {key} is deprecated in TileLang (use T.copy(..., "
                          f"disable_tma=True)); in tilews it turns off the warp-specialized "
                          f"Hopper path", DeprecationWarning, stacklevel=3)
        if key not in _MEANINGFUL:
            recorded.append(key.value)
            continue
        if not isinstance(value, bool) and value not in (0, 1):
            raise ValueError(f"pass config {key}: expected True or False, got {value!r}")
        if key is PassConfigKey.TL_ENABLE_FAST_MATH:
            fast_math = bool(value)
        elif key is PassConfigKey.TL_ENABLE_LOWER_LDGSTG:
            register_copies = bool(value)
        elif value:
            no_ws.append(key.value)
    return PassOptions(fast_math, tuple(no_ws), tuple(recorded), register_copies)


def _key(raw: Any) -> PassConfigKey:
    if isinstance(raw, PassConfigKey):
        return raw
    if not isinstance(raw, str):
        raise ValueError(f"pass_configs: a key must be a PassConfigKey or its string, got "
                         f"{type(raw).__name__} {raw!r}")
    try:
        return PassConfigKey(raw)
    except ValueError:
        pass
    known = [k.value for k in PassConfigKey]
    close = difflib.get_close_matches(raw, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"pass_configs: unknown key {raw!r}{hint}; known keys: "
                     f"{', '.join(known)}") from None
