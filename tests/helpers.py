"""Shared test utilities: locating marked source lines, random inputs, references."""
from __future__ import annotations

import inspect
import json
import re

import torch

from tilews.lowering import ir
from tilews.testing import poison_, rel_err  # noqa: F401  (rel_err re-exported for tests)


def roles(kernel) -> dict:
    """The roles of a warp-specialized kernel's ``WarpSpecialize``, by their warp groups."""
    ws = next(s for s in kernel.body.stmts if isinstance(s, ir.WarpSpecialize))
    return {r.warpgroups: r for r in ws.roles}


def marked_line(fn, marker: str = "# <- error") -> int:
    """The absolute line number of the line of ``fn``'s source containing ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if marker in text]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


def randn(*shape, dtype=torch.float32, seed=None, device="cpu"):
    """Random normal input, never all zeros."""
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 2**31)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).to(device)


def poisoned(*shape, dtype=torch.float32, device="cpu"):
    """An output buffer full of NaN (or a sentinel for integers) before launch."""
    return poison_(torch.empty(*shape, dtype=dtype, device=device))


# ----------------------------------------------------------------------------------------------
# loading lowered IR through one backend (tests build IR directly, without tilews.jit)


def services():
    from tilews import targets
    from tilews.cache import DiskCache
    from tilews.lowering.backend import Services
    from tilews.lowering.settings import Settings
    settings = Settings.from_env()
    return Services(DiskCache.from_settings(settings), settings, targets.machine())


class CheckedProgram:
    """A loaded program whose ``launch`` checks its arguments first, as a kernel call does."""

    def __init__(self, kernel, program):
        self.kernel, self.program = kernel, program

    def launch(self, args) -> None:
        from tilews.lowering import arguments
        arguments.check(self.kernel, args, self.program.rules)
        self.program.launch(args)

    def __getattr__(self, name):
        return getattr(self.program, name)


def load(kernel, backend: str, config=None) -> CheckedProgram:
    """``kernel`` (frontend IR) lowered, emitted and loaded by ``backend`` ("interpret", "tl",
    "gluon"), with ``config`` if given (else the backend's own for this machine)."""
    from tilews import backends
    b = backends.make(backend, services())
    if config is not None:
        b = type(b)(config, b.services)
    lowered = b.lower(kernel)
    return CheckedProgram(lowered, b.load(lowered, b.emit(lowered), {}))


def gluon_program(lowered) -> CheckedProgram:
    """Emit and load an already lowered Hopper kernel (compile-only without a GPU)."""
    from tilews.triton_ext.gluon import GluonProgram, emit
    from tilews.triton_ext.toolchain import triton_version
    return CheckedProgram(lowered, GluonProgram(emit(lowered), lowered, services().store,
                                                triton_version()))


def tuned_entries(root, op: str) -> list[dict]:
    """The tuned winners ``op`` has written to disk under the tilews cache folder ``root``."""
    return [json.loads(p.read_text()) for p in (root / "ops" / op).glob("*.json")]


def innermost_loops(sass: str) -> list[list[str]]:
    """The opcodes (predicates dropped) of each innermost loop of ``cuobjdump -sass`` text
    (``toolchain.sass``): a backward branch and what it jumps over, holding no other loop."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass)
    at = {int(a, 16): n for n, (a, _) in enumerate(lines)}
    spans = []
    for n, (a, text) in enumerate(lines):
        m = re.search(r"\bBRA\s+.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < int(a, 16) and int(m.group(1), 16) in at:
            spans.append((at[int(m.group(1), 16)], n))
    return [[t.split()[1] if t.startswith("@") else t.split()[0] for _, t in lines[s:e + 1]]
            for s, e in spans if not any(s <= s2 and e2 < e for s2, e2 in spans)]


GRID_WAIT = "griddepcontrol.wait"
_NON_GLOBAL_SPACES = ("shared", "param", "local", "const")


def touches_global(opcode: str) -> bool:
    """Whether a PTX instruction reads or writes global memory: a load, store, reduction or
    atomic not in another state space (generic ones may be global), or an asynchronous (TMA /
    bulk) copy or reduction with a global side."""
    parts = opcode.split(".")
    if parts[0] in ("ld", "ldu", "st", "red", "atom", "multimem"):
        return not any(p.startswith(_NON_GLOBAL_SPACES) for p in parts[1:])
    return parts[0] == "cp" and "global" in parts


def unwaited_global_accesses(ptx: str) -> list[str]:
    """The global memory accesses of the kernel entry of ``ptx`` reachable from its start along
    some path that passes no ``griddepcontrol.wait`` (what may run before the previous grid of a
    programmatic dependent launch completes), in text order. Follows branches, ``brx.idx`` tables
    and the scopes of labels local to ``{ }`` blocks (inline asm's ``waitLoop``)."""
    body = ptx[ptx.index(".entry"):]
    body = body[body.index("\n{") + 2:]
    instrs: list[tuple[str, tuple]] = []          # (statement, its scope path)
    labels: dict = {}                              # (scope path, name) -> index of the next instruction
    tables: dict = {}                              # branch table name -> target labels
    scopes, fresh, table = [0], 1, None
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if table is not None:                      # a .branchtargets list, ended by ';'
            tables[table] += [t for t in re.split(r"[,;\s]+", line) if t]
            table = None if line.endswith(";") else table
            continue
        if line == "{":
            scopes.append(fresh)
            fresh += 1
            continue
        if line == "}":
            scopes.pop()
            if not scopes:
                break                              # the end of the entry function
            continue
        m = re.match(r"([$\w]+):\s*(\.branchtargets)?(.*)", line)
        if m:
            if m.group(2):
                table = m.group(1)
                tables[table] = [t for t in re.split(r"[,;\s]+", m.group(3)) if t]
                table = None if m.group(3).strip().endswith(";") else table
            else:
                labels[(tuple(scopes), m.group(1))] = len(instrs)
            continue
        if not line or line.startswith("."):
            continue
        instrs += [(s.strip(), tuple(scopes)) for s in line.split(";") if s.strip()]

    def target(name: str, path: tuple) -> int:
        for n in range(len(path), 0, -1):          # the innermost scope defining it
            if (path[:n], name) in labels:
                return labels[(path[:n], name)]
        raise AssertionError(f"PTX label {name} not found")

    def successors(i: int) -> list[int]:
        text, path = instrs[i]
        predicated = text.startswith("@")
        words = text.split()[1:] if predicated else text.split()
        op = words[0].split(".")[0]
        nxt = [i + 1] if (predicated or op not in ("bra", "brx", "ret", "exit", "trap")) else []
        if op == "bra":
            return nxt + [target(words[-1], path)]
        if op == "brx":
            return nxt + [target(t, path) for t in tables[words[-1]]]
        return nxt

    seen, todo, found = set(), [0], set()
    while todo:
        i = todo.pop()
        if i in seen or i >= len(instrs):
            continue
        seen.add(i)
        text = instrs[i][0]
        opcode = (text.split()[1] if text.startswith("@") else text.split()[0])
        if opcode == GRID_WAIT:
            continue                               # what follows runs after the previous grid
        if touches_global(opcode):
            found.add(i)
        todo += successors(i)
    return [instrs[i][0] for i in sorted(found)]
