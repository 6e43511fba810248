"""The TTGIR verifier (``triton_ext/passes``): real tilews kernels pass, edited ones fail per rule.

Kernels come from the frontend (``examples/gemm.py``'s ``matmul`` and ``persistent_matmul`` (the
pipelined k loop nested in a loop over output tiles), ``examples/ws_gemm.py``'s programs, and two
separate consumer roles written here, the case of docs/ws-semantics.md #4), are lowered
for ``HOPPER``, emitted and compiled for sm_90a without a GPU; the verifier reads ``asm["ttgir"]``.
A violating module is the real text edited: a wait moved or weakened, an arrive moved before its
wait, an allocation offset moved onto another partition's buffer, a warp count or warp-group start
changed (the last two in the text after ``allocate``, which carries Triton's offsets and starts).
``install()`` is checked in a child compile: the hook runs and rejects a Gluon kernel that Triton
alone compiles.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tilews.language as T
from tilews.lowering.errors import CompileError
from tilews.lowering.frontend import build_kernel
from tilews.lowering.pipeline import lower
from tilews.triton_ext.gluon.backend import HOPPER
from tilews.ops import gemm_programs
from tilews.ops.attention import mha_fwd_program
from tilews.triton_ext import passes
from tilews.lowering.plans import AsyncPlan
from tilews.triton_ext.gluon import GluonProgram
from tilews.triton_ext.toolchain import triton_version

from examples.gemm import matmul, persistent_matmul
from examples.ws_gemm import ws_matmul_program, ws_ring_matmul_program

from .helpers import gluon_program, services

COMPILE_SCRIPT = Path(passes.__file__).parents[1] / "gluon" / "compile.py"


def two_consumers(M=256, N=256, K=256, bm=64, bn=128, bk=64, dtype=T.float16):
    """A producer T.ws(0) and two consumers T.ws(1), T.ws(2), each with its own rows and C tile:
    the second consumer is a 4-warp worker partition holding wgmma."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, 2 * bm), threads=384) as (bx, by):
            A0 = T.alloc_shared((bm, bk), dtype)
            A1 = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C0 = T.alloc_fragment((bm, bn), T.float32)
            C1 = T.alloc_fragment((bm, bn), T.float32)
            ready = T.alloc_barrier(arrive_count=128)
            done = T.alloc_barrier(arrive_count=256)
            with T.ws(1):
                T.clear(C0)
            with T.ws(2):
                T.clear(C1)
            for ko in range(T.ceildiv(K, bk)):
                with T.ws(0):
                    T.barrier_wait(done, (ko + 1) % 2)
                    T.copy(A[by * 2 * bm, ko * bk], A0)
                    T.copy(A[by * 2 * bm + bm, ko * bk], A1)
                    T.copy(B[ko * bk, bx * bn], B_s)
                    T.barrier_arrive(ready)
                with T.ws(1):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A0, B_s, C0)
                    T.barrier_arrive(done)
                with T.ws(2):
                    T.barrier_wait(ready, ko % 2)
                    T.gemm(A1, B_s, C1)
                    T.barrier_arrive(done)
            with T.ws(1):
                T.copy(C0, C[by * 2 * bm, bx * bn])
            with T.ws(2):
                T.copy(C1, C[by * 2 * bm + bm, bx * bn])
    return main


KERNELS = {
    "auto_1wg": lambda: matmul.fn(512, 512, 256, block_M=128, block_N=128, block_K=64, num_stages=3),
    "auto_merged": lambda: matmul.fn(512, 512, 256, block_M=128, block_N=256, block_K=64,
                                     num_stages=3, threads=256),
    "explicit_merged": lambda: ws_matmul_program(256, 512, 256, block_M=128, block_N=128, block_K=64),
    "explicit_ring": lambda: ws_ring_matmul_program(512, 512, 512, stages=3),
    # 8 tiles over 3 blocks (3, 3, 2), 4 k steps per tile over 3 stages: the stage of step k of a
    # tile is (tile_iter * 4 + k) % 3
    "persistent": lambda: persistent_matmul.fn(512, 512, 256, block_M=128, block_N=256, block_K=64,
                                               num_sms=3),
    "two_consumers": two_consumers,
    # P @ V (P from registers) of block k - 1 in flight under block k's softmax (overlap_softmax);
    # the peeled first and last iterations and the loop reuse SSA names in sibling regions
    "attention": lambda: mha_fwd_program(1, 2, 1000, 64, True, block_M=128, block_N=128,
                                         num_stages=2, threads=256),
    # the last block's sum over the slices is a loop inside an `if`, whose SSA names repeat the
    # k loop's (sibling regions): a use must resolve to its own region's definition
    "split_k_fused": lambda: gemm_programs.split_k_fused.fn(T.dynamic("M"), 512, 1024, splits=4,
                                                            block_M=64, block_N=128, block_K=64),
}


@functools.lru_cache(maxsize=None)
def program(name: str):
    kernel = lower(build_kernel(KERNELS[name]()), HOPPER)
    assert kernel.find_plan(AsyncPlan) is not None
    return gluon_program(kernel)


@functools.lru_cache(maxsize=None)
def placed(name: str) -> str:
    return passes.allocate(program(name).asm["ttgir"])


def rejected(text: str, allocated=None) -> str:
    with pytest.raises(CompileError) as e:
        passes.verify_ttgir(text, "main", allocated=allocated)
    msg = str(e.value)
    assert msg.startswith("TTGIR verifier: kernel 'main': ")
    return msg


def post_loop_wait(lines: list) -> int:
    return next(i for i, line in enumerate(lines)
                if "ttng.warp_group_dot_wait" in line and "pendings = 0" in line)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_real_kernels_pass(name):
    ttgir, allocated = program(name).asm["ttgir"], placed(name)
    # the replayed allocation is the one Triton made: same total, every buffer placed, groups set
    assert int(re.search(r"ttg\.shared = (\d+)", allocated).group(1)) == program(name).metadata["shared"]
    assert "ttg.local_alloc :" not in allocated and "warpGroupStartIds" in allocated
    passes.verify_ttgir(ttgir, "main", allocated=allocated)
    passes.verify_ttgir(ttgir, "main")


def test_overlapping_partitions_fail():
    """docs/ws-semantics.md #4: each consumer's C tile placed on the other's bytes."""
    a = placed("two_consumers")
    c0 = re.search(r"%C0_stage0 = ttg\.local_alloc \{allocation\.offset = (\d+)", a).group(1)
    bad = re.sub(r"(%C1_stage1 = ttg\.local_alloc \{allocation\.offset = )\d+", rf"\g<1>{c0}", a)
    msg = rejected(program("two_consumers").asm["ttgir"], bad)
    assert "partitions 'default' (4 warps) and 'partition1' (4 warps) run concurrently" in msg
    assert re.search(r"C0_stage0 \[\d+, \d+\) overlaps C1_stage1", msg)


@pytest.mark.parametrize("edit", ["raw_accumulator", "wait_keeps_one"])
def test_accumulator_read_before_wait_fails(edit):
    lines = program("auto_1wg").asm["ttgir"].splitlines()
    i = post_loop_wait(lines)
    if edit == "raw_accumulator":       # the epilogue reads the loop's accumulator, not the wait's
        res, src = re.match(r"\s*(%\S+) = ttng\.warp_group_dot_wait (%\S+) ", lines[i]).groups()
        use = next(j for j in range(i + 1, len(lines)) if re.search(re.escape(res) + r"\b", lines[j]))
        lines[use] = re.sub(re.escape(res) + r"\b", src, lines[use])
        assert "arith.truncf" in lines[use]
    else:                               # the last wgmma stays in flight
        lines[i] = lines[i].replace("pendings = 0", "pendings = 1")
    msg = rejected("\n".join(lines))
    assert re.search(r"partition 'default' \(4 warps\) reads the result of `%\S+ = "
                     r"ttng\.warp_group_dot [^`]*` in `%\S+ = arith\.truncf", msg)


@pytest.mark.parametrize("edit", ["after_loop", "in_loop"])
def test_stage_released_before_wait_fails(edit):
    lines = program("auto_1wg").asm["ttgir"].splitlines()
    if edit == "after_loop":            # the last stage's arrive moved above the final wait(0)
        i = post_loop_wait(lines)
        assert "ttng.arrive_barrier" in lines[i + 1]
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    else:                               # wait(1) moved below the arrive releasing the previous stage
        i = next(i for i, line in enumerate(lines) if "pendings = 1" in line)
        end = next(j for j in range(i, len(lines)) if "scf.yield" in lines[j])
        assert any("ttng.arrive_barrier" in line for line in lines[i:end])
        lines.insert(end - 1, lines.pop(i))
    msg = rejected("\n".join(lines))
    assert re.search(r"partition 'default' \(4 warps\) releases [AB]_s \(arrive on empty\) while "
                     r"`%\S+ = ttng\.warp_group_dot", msg)
    assert "partition 'partition0' (1 warp) overwrites" in msg


@pytest.mark.parametrize("edit", ["in_loop_keeps_two", "after_loop_keeps_one", "after_loop_moved"])
def test_persistent_stage_released_before_wait_fails(edit):
    """The persistent kernel (k loop inside the tile loop), edited: the arrive inside the k loop
    releases the previous step's stage, which wait(2) leaves in flight (two wgmma of different
    iterations, stages (x + 2) % 3 and x % 3 of different x); or the arrive after the k loop
    releases the last step's stage while its wgmma is in flight."""
    lines = program("persistent").asm["ttgir"].splitlines()
    if edit == "in_loop_keeps_two":
        i = next(i for i, line in enumerate(lines) if "pendings = 1" in line)
        lines[i] = lines[i].replace("pendings = 1", "pendings = 2")
    elif edit == "after_loop_keeps_one":
        i = post_loop_wait(lines)
        lines[i] = lines[i].replace("pendings = 0", "pendings = 1")
    else:                               # the final wait(0) moved below the last stage's arrive
        i = post_loop_wait(lines)
        j = next(j for j in range(i, len(lines)) if "ttng.arrive_barrier" in lines[j])
        lines.insert(j, lines.pop(i))
    msg = rejected("\n".join(lines))
    assert re.search(r"partition 'default' \(8 warps\) releases [AB]_s \(arrive on empty\) while "
                     r"`%\S+ = ttng\.warp_group_dot", msg)
    assert "partition 'partition0' (1 warp) overwrites" in msg


@pytest.mark.parametrize("edit", ["two_warps", "unaligned_start", "default_two_warps"])
def test_wgmma_partition_not_whole_warp_group_fails(edit):
    name = "auto_1wg" if edit == "default_two_warps" else "two_consumers"
    a = placed(name)
    if edit == "two_warps":
        bad = re.sub(r"(partition1\(.*) num_warps\(4\)", r"\1 num_warps(2)", a)
        want = "partition 'partition1' (2 warps), starting at warp 4, holds wgmma"
    elif edit == "unaligned_start":
        starts = re.search(r"warpGroupStartIds = array<i32: ([\d, ]+)>", a)
        ids = [int(v) for v in starts.group(1).split(",")]
        assert ids[1] % 4 == 0
        ids[1] += 2
        bad = a.replace(starts.group(0), f"warpGroupStartIds = array<i32: {', '.join(map(str, ids))}>")
        want = f"partition 'partition1' (4 warps), starting at warp {ids[1]}, holds wgmma"
    else:
        bad = a.replace('"ttg.num-warps" = 4', '"ttg.num-warps" = 2')
        want = "partition 'default' (2 warps), starting at warp 0, holds wgmma"
    assert bad != a
    assert want in rejected(program(name).asm["ttgir"], bad)


_CHILD = textwrap.dedent("""
    import importlib.util, json, sys
    from tilews.lowering.errors import CompileError
    from tilews.triton_ext import passes
    spec = json.loads(sys.argv[1])
    loader = importlib.util.spec_from_file_location("tilews_gluon_compile", spec.pop("script"))
    compile_py = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(compile_py)

    def build(source):
        try:
            compile_py._compile({**spec, "source": source})
            return "ok"
        except CompileError as e:
            return str(e)
    install = passes.install
    passes.install = lambda: None        # compile.py installs the hook: bypass it once
    out = {"plain": build(spec["broken"])}
    passes.install = install
    passes.install()
    passes.install()
    out.update(good=build(spec["good"]), broken=build(spec["broken"]), verified=passes.verified)
    print(json.dumps(out))
""")


def test_install_runs_the_verifier_in_a_compile(tmp_path):
    """Triton compiles a kernel whose epilogue reads the accumulator without the final wait;
    with install() the same compile fails (and a Triton cache entry made without the hook is
    not reused)."""
    good = program("auto_1wg").source
    wait = "    C_f = warpgroup_mma_wait(num_outstanding=0, deps=(C_f,))\n"
    assert good.count(wait) == 1
    (tmp_path / "good.py").write_text(good)
    (tmp_path / "broken.py").write_text(good.replace(wait, ""))
    spec = {"script": str(COMPILE_SCRIPT), "good": str(tmp_path / "good.py"),
            "broken": str(tmp_path / "broken.py"), "fn": "main", "args_fn": "main_args",
            "num_warps": 4, "target": ["cuda", 90, 32],
            "params": [{"kind": "buffer", "shape": s, "dtype": "float16"}
                       for s in ([512, 256], [256, 512], [512, 512])]}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True,
                          text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["plain"] == "ok" and out["good"] == "ok"
    assert out["verified"] == ["main"]          # installed twice, ran once per compile
    assert re.search(r"TTGIR verifier: kernel 'main': partition 'default' \(4 warps\) ", out["broken"])
    assert "reads the result of" in out["broken"] and "'partition0' (1 warp)" in out["broken"]
    assert (tmp_path / "triton-cache" / passes.cache_key_part()).is_dir()
    assert passes.cache_key_part() == passes.cache_key_part().strip()
    assert passes.cache_key_part().startswith(f"tilews-ttgir-passes-v{passes.HOOK_VERSION}-")


def test_a_verifier_finding_reaches_the_user_as_a_compile_error():
    good = program("auto_1wg")
    wait = "    C_f = warpgroup_mma_wait(num_outstanding=0, deps=(C_f,))\n"
    with pytest.raises(CompileError) as e:
        GluonProgram(good.source.replace(wait, ""), good.kernel, services().store, triton_version())
    assert "TTGIR verifier: kernel 'main'" in e.value.message
    assert e.value.loc == good.kernel.loc          # located at the user's kernel


@pytest.mark.parametrize("edit", ["scores", "output"])
def test_attention_gemm_results_read_before_their_wait_fail(edit):
    """The loop issues Q K^T of block k, then P V of block k - 1; its first wait (pendings = 1)
    completes Q K^T before the softmax reads S, its second (pendings = 0) completes P V before
    the output's rescale. Leaving one more gemm outstanding at either lets a read of S (or of
    the output) race its wgmma."""
    lines = program("attention").asm["ttgir"].splitlines()
    loop = next(i for i, line in enumerate(lines) if "scf.for" in line and "iter_args" in line)
    waits = [i for i in range(loop, len(lines)) if "ttng.warp_group_dot_wait" in lines[i]][:2]
    assert "pendings = 1" in lines[waits[0]] and "pendings = 0" in lines[waits[1]]
    if edit == "scores":
        lines[waits[0]] = lines[waits[0]].replace("pendings = 1", "pendings = 2")
    else:
        lines[waits[1]] = lines[waits[1]].replace("pendings = 0", "pendings = 1")
    msg = rejected("\n".join(lines))
    acc = "acc_s" if edit == "scores" else "acc_o"
    assert re.search(rf"reads the result of `%{acc}\w* = ttng\.warp_group_dot ", msg), msg
