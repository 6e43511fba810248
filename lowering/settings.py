"""Every ``TILEWS_*`` environment switch, read in one place with one truth rule.

``Settings.from_env()`` is called at the ``tilews.jit`` boundary (once per compile or per kernel
object) and the result is passed to whatever needs it: the frontend, the pass pipeline, the
artifact store, the backends. No other module reads a ``TILEWS_*`` variable.

Truth rule for on/off switches: "1", "true", "yes" and "on" (any case, surrounding blanks ignored)
are on; "0", "false", "no" and "off" are off; unset or empty is the switch's default (off,
except ``TILEWS_OVERLAP_SOFTMAX`` and ``TILEWS_OVERLAP_GEMMS``); any other value is a ``ValueError`` naming the variable (a
typo never silently means "off").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, MutableMapping, Optional

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

# (variable, what it does): the README's table of switches is checked against this.
SWITCHES = (
    ("TILEWS_CACHE_DIR", "on-disk compile cache (default: the platform user cache dir, "
                         "`~/.cache/tilews`)"),
    ("TILEWS_DISABLE_CACHE", "no on-disk cache: nothing is read from or written to it"),
    ("TILELANG_DISABLE_CACHE", "the same, under TileLang's name (its examples set it)"),
    ("TILEWS_PRINT_SOURCE", "print the generated source at each compile"),
    ("TILEWS_DUMP_IR", "write the IR after every pass to this folder (created if missing; "
                       "one that cannot be written is a `ValueError` at the compile)"),
    ("TILEWS_POISON_OUTPUTS", "outputs tilews allocates (`out_idx`) start as NaN (the tests set it)"),
    ("TILEWS_DEBUG_FRONTEND", "re-raise the raw Python error behind a frontend `CompileError`"),
    ("TILEWS_OVERLAP_SOFTMAX", "Hopper: keep a block's P V gemm in flight under the next block's "
                               "softmax (overlap_softmax; on unless set to an off value)"),
    ("TILEWS_OVERLAP_GEMMS", "Hopper: issue a block's independent wgmmas together and wait for "
                             "each where its result is first needed (overlap_gemms; on unless "
                             "set to an off value)"),
    ("TILEWS_MERGE_RELEASES", "Hopper: ring slots a role releases at the same point share one "
                              "barrier, one arrival per release (merge_releases; on unless set "
                              "to an off value)"),
    ("TILEWS_SPLIT_PARTIALS", "Hopper: split_consumers also gives each warp group of a consumer "
                              "whose gemm sums over its rows (attention backward's dQ) its own "
                              "role, each adding its own partial product (on unless set to an "
                              "off value)"),
    ("TILEWS_SUM_PARTIALS", "Hopper: with TILEWS_SPLIT_PARTIALS, the roles hand their partial "
                            "products to the first, which adds their sum once (sum_partials; "
                            "off unless set to an on value)"),
    ("TILEWS_REDUCE_ROLE", "Hopper: a warp of its own issues the bulk reduce-adds a consumer's "
                           "loop makes from a staged tile (attention backward's dQ), the "
                           "consumer only storing the tile and arriving (reduce_role; on unless "
                           "set to an off value)"),
    ("TILEWS_TAKE_TURNS", "Hopper: where the split roles' own partials would not fit their "
                          "registers (attention backward's dQ at D128), the roles compute the "
                          "whole product in turns, one per iteration (take_turns; off unless set "
                          "to an on value)"),
    ("TILEWS_OVERLAP_PROMOTION", "Hopper: issue an FP8 k-block's wgmma before the previous "
                                 "k-block's product is promoted, the products in two fragments "
                                 "by turns (overlap_promotion; on unless set to an off value)"),
    ("TILEWS_TUNE", "`tilews.ops.matmul` and `tilews.ops.fp8_scaled_mm` tune each new shape "
                    "bucket at its first call (winners kept on disk) instead of using their "
                    "heuristics"),
    ("TILEWS_COMPILE_WORKERS", "threads that compile a space of configurations at once (the "
                               "autotuner, `par_compile`, the ops' tuning; default: the CPU "
                               "count; `1`: one after the other on the calling thread)"),
    ("TILEWS_COMPILE_PROCESSES", "those workers build in forked child processes whose builds the "
                                 "parent loads from the on-disk cache (off unless set to an on "
                                 "value; needs the cache and `os.fork`)"),
    ("TILEWS_CXX", "the C++17 compiler of the Metal CPU harness (default: `g++`, else `clang++`)"),
)


def set_cache_disabled(disabled: bool, environ: MutableMapping[str, str] = os.environ) -> None:
    """Turn the on-disk cache off or on for this process and its children from now on (TileLang's
    ``env.disable_cache()``): both switches that turn it off are set or cleared."""
    for name in ("TILEWS_DISABLE_CACHE", "TILELANG_DISABLE_CACHE"):
        if disabled:
            environ[name] = "1"
        else:
            environ.pop(name, None)


def flag(name: str, environ: Mapping[str, str] = os.environ, default: bool = False) -> bool:
    """The on/off switch ``name`` under the truth rule above; ``default`` when it is unset or empty."""
    value = environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"environment variable {name}={environ[name]!r}: use one of "
                     f"{', '.join(_ON)} (on) or {', '.join(_OFF)} (off)")


def _text(name: str, environ: Mapping[str, str]) -> Optional[str]:
    value = environ.get(name, "").strip()
    return value or None


def _count(name: str, environ: Mapping[str, str]) -> Optional[int]:
    """A whole number of at least 1, or None where unset or empty; else ``ValueError`` naming
    the variable."""
    value = environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"environment variable {name}={environ[name]!r}: use a whole number of "
                         f"at least 1 (1: one after the other)")
    return int(value)


def _path(name: str, environ: Mapping[str, str]) -> Optional[Path]:
    value = environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


@dataclass(frozen=True)
class Settings:
    cache_dir: Optional[Path] = None      # None: the platform's user cache dir
    disable_cache: bool = False
    print_source: bool = False
    dump_ir: Optional[Path] = None
    poison_outputs: bool = False
    debug_frontend: bool = False
    overlap_softmax: bool = True
    overlap_gemms: bool = True
    merge_releases: bool = True
    split_partials: bool = True
    sum_partials: bool = False
    reduce_role: bool = True
    take_turns: bool = False
    overlap_promotion: bool = True
    tune: bool = False
    compile_workers: Optional[int] = None  # TILEWS_COMPILE_WORKERS; None: the CPU count
    compile_processes: bool = False       # TILEWS_COMPILE_PROCESSES: workers compile in forked children
    cxx: Optional[str] = None             # TILEWS_CXX: the Metal CPU harness's C++ compiler

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "Settings":
        return cls(cache_dir=_path("TILEWS_CACHE_DIR", environ),
                   disable_cache=flag("TILEWS_DISABLE_CACHE", environ)
                   or flag("TILELANG_DISABLE_CACHE", environ),
                   print_source=flag("TILEWS_PRINT_SOURCE", environ),
                   dump_ir=_path("TILEWS_DUMP_IR", environ),
                   poison_outputs=flag("TILEWS_POISON_OUTPUTS", environ),
                   debug_frontend=flag("TILEWS_DEBUG_FRONTEND", environ),
                   overlap_softmax=flag("TILEWS_OVERLAP_SOFTMAX", environ, default=True),
                   overlap_gemms=flag("TILEWS_OVERLAP_GEMMS", environ, default=True),
                   merge_releases=flag("TILEWS_MERGE_RELEASES", environ, default=True),
                   split_partials=flag("TILEWS_SPLIT_PARTIALS", environ, default=True),
                   sum_partials=flag("TILEWS_SUM_PARTIALS", environ),
                   reduce_role=flag("TILEWS_REDUCE_ROLE", environ, default=True),
                   take_turns=flag("TILEWS_TAKE_TURNS", environ),
                   overlap_promotion=flag("TILEWS_OVERLAP_PROMOTION", environ, default=True),
                   tune=flag("TILEWS_TUNE", environ),
                   compile_workers=_count("TILEWS_COMPILE_WORKERS", environ),
                   compile_processes=flag("TILEWS_COMPILE_PROCESSES", environ),
                   cxx=_text("TILEWS_CXX", environ))

    def ready_dump_folder(self) -> Optional[Path]:
        """``dump_ir`` created where missing, ready for the pipeline to write the IR into (None
        when unset); a ``ValueError`` naming ``TILEWS_DUMP_IR`` and the path where no dump can
        be written there (a file, a folder without write permission): a dump the user asked for
        is never dropped silently."""
        if self.dump_ir is None:
            return None
        try:
            self.dump_ir.mkdir(parents=True, exist_ok=True)
            reason = None if os.access(self.dump_ir, os.W_OK | os.X_OK) else "no write permission"
        except OSError as e:
            reason = e.strerror or type(e).__name__
        if reason is not None:
            raise ValueError(f"environment variable TILEWS_DUMP_IR={str(self.dump_ir)!r}: cannot "
                             f"write the IR dump there ({reason}); set it to a folder you can "
                             f"write to, or unset it")
        return self.dump_ir

    def cache_root(self) -> Path:
        """Where caches live: ``cache_dir``, else the platform's user cache dir
        (``~/.cache/tilews``; the XDG default where ``platformdirs`` is missing)."""
        if self.cache_dir is not None:
            return self.cache_dir
        try:
            import platformdirs
        except ImportError:  # minimal environments (e.g. a bare GPU image): the XDG default
            base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            return Path(base) / "tilews"
        return Path(platformdirs.user_cache_dir("tilews", appauthor=False))
