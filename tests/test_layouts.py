"""Property tests of the layouts the compiler produces (lowering/layouts.py)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tilews.lowering import layouts

bits = st.sampled_from([8, 16, 32])


@st.composite
def accumulator_cases(draw):
    groups = draw(st.sampled_from([1, 2]))
    warps = 4 * groups
    M = 64 * groups * draw(st.integers(1, 2))
    N = 8 * draw(st.integers(1, 32))
    return M, N, warps, draw(bits)


@settings(max_examples=60, deadline=None)
@given(accumulator_cases())
def test_accumulator_is_a_bijection_and_splits_m_by_warp_group(case):
    M, N, warps, b = case
    lay = layouts.accumulator_for(M, N, warps, b)
    assert layouts.warp_partition_ok(*lay.warps_per_cta, warps, M, N)
    assert lay.instr_shape[0] == 16 and lay.instr_shape[1] % 8 == 0 and lay.instr_shape[1] <= 256
    assert lay.instr_shape[2] * b == 256
    regs = layouts.registers_per_thread(lay, M, N)
    seen = {}
    for i in range(M):
        for j in range(N):
            t, r = layouts.element_to_thread(lay, M, N, i, j)
            assert 0 <= t < 32 * warps and 0 <= r < regs
            assert (t, r) not in seen, f"({i},{j}) and {seen[(t, r)]} share thread {t} register {r}"
            seen[(t, r)] = (i, j)
    assert len(seen) == 32 * warps * regs == M * N
    if lay.warps_per_cta[1] == 1:     # merged groups: warp group g holds 64-row slabs g, g + G, ...
        G = warps // 4
        for (t, _), (i, _) in seen.items():
            assert (i // 64) % G == t // 128


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([0, 32, 64, 128]), bits, st.integers(1, 4), st.integers(1, 4))
def test_swizzle_is_a_permutation_of_the_tile(swizzle, b, row_blocks, col_atoms):
    width = max(swizzle, 16)
    rows, cols = 8 * row_blocks, col_atoms * width * 8 // b
    lay = layouts.NVMMAShared(swizzle, b)
    offsets = [layouts.element_to_offset(lay, rows, cols, i, j) for i in range(rows) for j in range(cols)]
    elem = b // 8
    assert sorted(offsets) == [k * elem for k in range(rows * cols)]
    # 16-byte chunks move as a whole: elements of one chunk stay contiguous
    for i in range(rows):
        for j in range(0, cols, 16 // elem):
            base = layouts.element_to_offset(lay, rows, cols, i, j)
            assert base % 16 == 0
            assert [layouts.element_to_offset(lay, rows, cols, i, j + d) for d in range(16 // elem)] == \
                [base + d * elem for d in range(16 // elem)]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.sampled_from([4, 8, 12, 16]),
       st.integers(1, 16).map(lambda x: 16 * x), st.integers(1, 32).map(lambda x: 8 * x), st.booleans())
def test_warp_partition_rule(m, n, warps, M, N, wgmma):
    ok = layouts.warp_partition_ok(m, n, warps, M, N, wgmma)
    # accept exactly when every warp gets whole 16 x 8 pieces and all warps are used
    rows_each, cols_each = M / m, N / n
    expect = (m * n == warps and rows_each == int(rows_each) and cols_each == int(cols_each)
              and int(rows_each) % 16 == 0 and int(cols_each) % 8 == 0 and (not wgmma or m % 4 == 0))
    assert ok == expect
    if ok:   # a valid partition leaves no output column unwritten
        owned = {(wi, wj) for wi in range(m) for wj in range(n)}
        assert len(owned) == warps


@st.composite
def operand_cases(draw):
    groups = draw(st.sampled_from([1, 2]))
    M = 64 * groups * draw(st.integers(1, 2))
    N = 16 * draw(st.integers(1, 16))
    K = 16 * draw(st.integers(1, 16))
    return M, N, K, 4 * groups


@settings(max_examples=40, deadline=None)
@given(operand_cases())
def test_p_cast_to_16_bits_is_a_register_a_operand_in_place(case):
    """Attention's P: element (i, k) of an M x K accumulator (S = Q K^T, computed as an M x K
    wgmma tile) is held by the thread that holds element (i, k) of the A operand of the next
    gemm (P V, accumulator M x N), so the conversion moves no data between threads."""
    M, N, K, warps = case
    s_layout = layouts.accumulator_for(M, K, warps, 16)
    o_layout = layouts.accumulator_for(M, N, warps, 16)
    a = layouts.WgmmaOperandA(o_layout, 2)
    for i in range(M):
        for k in range(K):
            assert layouts.element_to_thread(s_layout, M, K, i, k)[0] == \
                layouts.operand_a_to_thread(a, M, K, i, k)


@settings(max_examples=40, deadline=None)
@given(accumulator_cases(), st.sampled_from([0, 1]))
def test_row_slice_is_held_by_one_row_of_threads(case, dim):
    """A reduction along a row of a wgmma accumulator needs only the 4 lanes of a quad (the
    threads holding that row): each row is spread over 4 threads of one warp per warp column;
    a column over 8 lanes of each warp along M."""
    M, N, warps, b = case
    lay = layouts.accumulator_for(M, N, warps, b)
    sl = layouts.RowSlice(dim, lay)
    for index in range(0, M if dim == 1 else N, 7):
        threads = layouts.row_slice_threads(sl, M, N, index)
        if dim == 1:
            assert len(threads) == 4 * lay.warps_per_cta[1]
            assert len({t // 32 for t in threads}) == lay.warps_per_cta[1]
        else:
            assert len(threads) == 8 * lay.warps_per_cta[0]     # 8 lanes of each warp along M


def test_holds_twice_finds_patterns_wider_than_their_tile():
    acc = layouts.WgmmaAccumulator((8, 1), (16, 64, 16))
    assert layouts.holds_twice(acc, (128, 32))            # D96's 32 columns in a 64-wide pattern
    assert not layouts.holds_twice(acc, (128, 64)) and not layouts.holds_twice(acc, (128, 128))
    assert layouts.holds_twice(acc, (8, 64))              # rows r and r + 8 of 8 rows
    wide = layouts.WgmmaAccumulator((4, 2), (16, 32, 16))
    assert not layouts.holds_twice(wide, (64, 32))        # the second warp column repeats: other threads
    assert layouts.holds_twice(layouts.RowSlice(0, acc), (32,))
    assert not layouts.holds_twice(layouts.RowSlice(1, acc), (128,))
    assert layouts.holds_twice(layouts.Blocked(2, 4, vector=8), (16, 4))
    assert not layouts.holds_twice(layouts.Blocked(2, 4, vector=8), (16, 64))
