"""Hints a program gives about how it should be compiled, which tilews mostly decides itself.

A hint tilews applies changes the IR (a register request becomes the ``num_regs`` of the
``T.ws`` role it is made in, which the Gluon path passes to Triton); any other is recorded in the
kernel's notes (``ir.Kernel.notes``, shown in the compile report), never an error unless its
value is out of range.
"""
from __future__ import annotations

from .context import builder, current_loc
from .semantic import err

# setmaxnreg's range (PTX): registers per thread, a multiple of 8
MIN_REGS, MAX_REGS = 24, 256


def note(what: str) -> None:
    """Record, at the current line, a hint tilews does not apply."""
    builder().notes.append(f"line {current_loc().line}: {what}")


def set_max_nreg(count, is_inc) -> None:
    """A register count for the threads of the enclosing ``T.ws`` role; outside every role, a
    note (tilews budgets the roles it makes itself)."""
    if not isinstance(count, int) or isinstance(count, bool) or not MIN_REGS <= count <= MAX_REGS \
            or count % 8:
        raise err(f"T.set_max_nreg({count!r}, ...): the register count must be a multiple of 8 "
                  f"from {MIN_REGS} to {MAX_REGS}")
    if is_inc not in (0, 1):
        raise err(f"T.set_max_nreg(..., is_inc={is_inc!r}): must be 1 (increase) or 0 (decrease)")
    b = builder()
    if not b.roles:
        note(f"T.set_max_nreg({count}, {int(is_inc)}) outside every T.ws block is recorded, not "
             f"applied: tilews decides the register counts of the roles it makes")
        return
    role = b.roles[-1]
    earlier = b.register_requests.setdefault(role, count)
    if earlier != count:
        raise err(f"T.set_max_nreg({count}, ...): this role already asked for {earlier} registers")


def no_set_max_nreg() -> None:
    """TileLang's switch that keeps every warp at the launch's register count."""
    note("T.no_set_max_nreg() / T.disable_warp_group_reg_alloc() is recorded, not applied: "
         "Triton's warp specialization gives each partition its own register count, which "
         "tilews budgets")
