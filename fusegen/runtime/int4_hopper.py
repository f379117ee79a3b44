"""Decode's int4 SwiGLU on Hopper (compute capability 9.0), written in Gluon:
silu(x @ w_gate.T) * (x @ w_up.T) for a few rows of bf16 or fp16 x, the weights int4 as AWQ
stores them (unsigned, two a byte with the even K index in the low nibble, one scale and
one uint8 zero point per 128 values along K).

Why Gluon: at decode the weights' bytes are the cost, and the generated `tl` kernel's
tiles at 16 rows stream them at 1.4 TB/s (45.3 us at 4096 -> 14336 x 2 on an H200), its
loads latency-bound with the issue slots half idle. This kernel: 37.1 us [36.6-37.4]
there (benchmarks/experiments/int4_decode_gluon.py, its "words s6" variant; at one row
the generated GEMV stayed ahead, 28.6 us against 35.9); with the zero points subtracted
in the operands, the base bits held and 3 slots, 27.2 us at 16 rows and 26.5 at one
(benchmarks/RESULTS.md, 2026-12-07), ahead of the GEMV too. Its schedule:
  - a program takes 64 rows of both weights (wgmma's M; out's columns) over all of K; a
    one-warp producer streams each 128-value K step (one scale group) of both weights'
    packed tiles ([64, 64] bytes) and x's [16, 128] tile through a ring of STAGES slots
    with TMA (rows of x past M read as zeros);
  - one consumer warpgroup reads each packed tile as 32-bit words (ldmatrix): a thread's
    word for each 32 of K holds nibbles K 8t .. 8t + 7, and one shift and one LOP3
    ((w >> 4j) & 0x000F000F | 0x43004300) make a register of the bf16 pair 128 + q of
    nibbles j and j + 4 (fp16's 1024 + q: | 0x64006400), with no conversion
    instruction; one packed subtraction of the pair 128 + zero (sub.rn.bf16x2) makes it
    the operand q - zero, exact in bf16 and fp16 (|q - zero| <= 15). That pairs K values
    wgmma's order does not, so K is permuted within each 32 for the weights and, through
    a shared buffer a step, for x: the dots' sums do not change;
  - the dots run transposed (out.T = w @ x.T: x's rows are wgmma's N of 16), two a
    step (gate, up), and a group's sums times its scale are added to the accumulators:
    one FFMA an element of the [64, 16] sums;
  - the epilogue takes silu(gate) * up and stores out's [M, 64] columns. No split of K:
    every output's sum has one order, so calls are deterministic.

What it takes (QuantChain.hopper_fits checks): a module whose chain is this one (its
HOPPER chain "int4_swiglu"), 1 to ROWS rows of bf16 or fp16 x [M, K] row-major and 16-byte
aligned, K a multiple of 128, the packed weights [N, K / 2] uint8 likewise, scales [N, K
/ 128] of any float dtype and zero points [N, K / 128] uint8 with unit stride along K,
the gate's and the up's alike; out [M, N] bf16 or fp16 with unit stride along N.
"""

import triton

from . import launch, quant_hopper
from .gluon_hopper import AVAILABLE

if AVAILABLE:  # else (a Triton without Gluon) the `tl` kernel runs
    from .gluon_hopper import fence_async_shared, gl, gluon, mbarrier, tma, warpgroup_mma
    from .gluon_hopper import warpgroup_mma_wait

# Weight rows a program (wgmma's M), x's rows at most (its N), K a step (a scale group),
# the ring's slots (12 KB each; 3 ran 9% faster than 4, 5 or 6 and tied 2: 27.7 us
# against 30.3 at 16 rows, H200), the launch's registers a thread (maxnreg; 128: two
# programs an SM, the 4 + 1 warps allocated as 8, setmaxnreg then moving the producer's
# warpgroup to 24 and the consumer to 232; 96 ran 4% slower, 80 three times slower).
BLOCK_N, ROWS, GROUP, STAGES, REGISTERS = 64, 16, 128, 3, 128
# The K steps ahead of its use a group's scales and zero points are loaded (global loads):
# 3 and 2 tie, 6 (the best before the subtraction and 3 slots) 2% slower (H200).
#
# What else was built and measured, and lost or tied (benchmarks/RESULTS.md, 2026-12-07;
# the code is in git history, before "int4 Gluon SwiGLU: the variants that lost
# removed"): the ones-dot's operand from shared memory (5% slower); x's group sums on the
# CUDA cores instead of the ones-dot (11%); a second consumer warpgroup on the odd K steps
# (8% at 80 registers, 43% at 128); the next step's operands made while a step's dots run
# (12%); two steps' loads issued together (a tie); the weights laid out as contiguous
# 4 KB tiles a step (a tie); x permuted along K by the launcher (a torch copy a call), so
# that TMA's tile is the dots' operand with no shared round trip and barrier a step (5%
# slower with the copy: "int4 Gluon SwiGLU: PERMUTED_X knob"). What holds it at 2.3 TB/s
# of the 3.8 a read of its 61.5 MB reaches (H200): RESULTS.md's profile.
AHEAD = 3
# x's rows a warp permutes at once (_permuted_x): with 2, a warp's 16 threads along K span
# both 128-byte halves of x's swizzled tile, and each shared store meets a 2-way bank
# conflict (Nsight Compute: 52% of the stores' wavefronts, H200); with 4 a warp's stores
# fall in one half, on 32 banks. Built without a GPU (the same SASS but for 8 fewer
# instructions); 2 until timed.
PERMUTE_ROWS = 2
# The rows of x's tile (wgmma's N) for calls of up to 8 rows: 16, or 8 (half of x's bytes
# a step, its permute and the dots' N; the step's loop 316 -> 305 SASS instructions a
# thread). Built without a GPU; 16 until timed.
X_ROWS = 16
# Whether calls that fit take the kernel without FUSEGEN_QUANT_HOPPER=1 (=0 turns it off):
# its float64 tests passed on an H100 and an H200, where it ran 1.6x the generated tiles at
# 16 rows and 1.08x the generated GEMV at one.
DEFAULT = True
# What `fusegen inspect` and last_launch show as the kernel's config.
CONFIG = {
    "BLOCK_M": ROWS,
    "BLOCK_N": BLOCK_N,
    "BLOCK_K": GROUP,
    "num_warps": 5,
    "num_stages": STAGES,
}

if AVAILABLE:
    # fmt: off
    @gluon.jit
    def _produce(descs, bufs, M, N, K, num_warps: gl.constexpr):
        """The producer warp: each K step's packed tiles of both weights and x's tile into
        the ring, a slot once the consumer has released it (a fresh mbarrier counts as
        having completed the phase before 0)."""
        wg_desc, wu_desc, x_desc = descs
        wg_bufs, wu_bufs, x_bufs, ready, empty = bufs[:5]
        BN: gl.constexpr = wg_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        nbytes: gl.constexpr = (wg_desc.block_type.nbytes + wu_desc.block_type.nbytes
                                + x_desc.block_type.nbytes)
        n0 = gl.program_id(0) * BN
        for i in range(K // BK):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            k = i * BK
            tma.async_copy_global_to_shared(wg_desc, [n0, k // 2], ready.index(s),
                                            wg_bufs.index(s))
            tma.async_copy_global_to_shared(wu_desc, [n0, k // 2], ready.index(s),
                                            wu_bufs.index(s))
            tma.async_copy_global_to_shared(x_desc, [0, k], ready.index(s), x_bufs.index(s))

    @gluon.constexpr_function
    def _words_layout(layout):
        """The shared layout of a byte tile's bytes read as 32-bit words (the same
        swizzle)."""
        return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width,
                                    element_bitwidth=32, rank=2)

    @gluon.constexpr_function
    def _nibble_base(dtype):
        """The bits of the float BASE in dtype whose mantissa's last bits a nibble q is
        OR-ed into, making BASE + q (bf16: 128, fp16: 1024)."""
        return 0x6400 if str(dtype) == "fp16" else 0x4300

    @gluon.constexpr_function
    def _subtract_pair(dtype):
        """PTX subtracting two packed pairs of dtype."""
        return f"sub.rn.{'f16x2' if str(dtype) == 'fp16' else 'bf16x2'} $0, $1, $2;"

    @gluon.constexpr_function
    def _word_layout(rows, words):
        """A [rows, words] tile of 32-bit words as _word_floats reads it: words w = 4c + t
        of a row: registers row 8 and words 4, 8; lanes words 1, 2 (t) and rows 1, 2, 4;
        warps rows 16, 32."""
        return gl.DistributedLinearLayout(
            reg_bases=[[8, 0], [0, 4], [0, 8]],
            lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[rows, words])

    @gluon.jit
    def _pair(words, j: gl.constexpr, base_bits, zero_bits, dtype: gl.constexpr):
        """Nibbles j and j + 4 of each word as dtype's q - zero: [rows, words, 2]
        (base_bits: BASE's bits in both halves of an int32; zero_bits: [rows] BASE +
        zero's likewise). BASE + q less BASE + zero, on the packed pair so that it stays
        one register (a subtraction of the two halves made 137 PRMTs a step)."""
        bits = ((words >> (4 * j)) & 0x000F000F) | base_bits
        bits, zero_bits = gl.broadcast(bits, zero_bits[:, None])
        bits = gl.inline_asm_elementwise(_subtract_pair(dtype), "=r,r,r", [bits, zero_bits],
                                         dtype=gl.int32, is_pure=True, pack=1)
        lo = bits.to(gl.int16).to(dtype, bitcast=True)
        hi = (bits >> 16).to(gl.int16).to(dtype, bitcast=True)
        return gl.join(lo, hi)

    @gluon.jit
    def _word_floats(packed, base_bits, zero_bits, a_layout: gl.constexpr, dtype: gl.constexpr):
        """A [rows, K / 2] shared tile of bytes as [rows, K] dtype q - zero in wgmma's
        register-operand layout, K permuted within each 32 (as _permuted_x permutes x): a
        thread reads, for each 32 of K, one 32-bit word (8 nibbles: K 8t + p, p < 8) and
        makes its four operand registers with one shift, one LOP3 and one subtraction
        each, pairing nibbles j and j + 4. With j = 2s + h, the pair stands at K 16s + 8h
        + 2t + e (e: 0 low, 1 high) of the operand's order. base_bits, zero_bits: as
        _pair's (zero_bits in the words' row layout, _word_layout's)."""
        R: gl.constexpr = packed.type.shape[0]
        KB: gl.constexpr = packed.type.shape[1]
        words = packed._reinterpret(gl.int32, [R, KB // 4], _words_layout(packed.type.layout))
        words = words.load(_word_layout(R, KB // 4))
        z = zero_bits
        both = gl.join(gl.join(_pair(words, 0, base_bits, z, dtype),  # row, word, e, h, s
                               _pair(words, 1, base_bits, z, dtype)),
                       gl.join(_pair(words, 2, base_bits, z, dtype),
                               _pair(words, 3, base_bits, z, dtype)))
        both = gl.reshape(both, [R, KB // 16, 4, 2, 2, 2])  # row, c, t, e, h, s
        both = gl.reshape(gl.permute(both, (0, 1, 5, 4, 2, 3)), [R, 2 * KB])  # c, s, h, t, e
        return gl.convert_layout(both, a_layout)

    @gluon.jit
    def _permuted_x(x_smem, xp_smem, ROWS_A_WARP: gl.constexpr):
        """x's [rows, K] tile into xp_smem with K permuted within each 32 as _word_floats
        orders the weights: K 32c + 8t + 4e + 2s + h to 32c + 16s + 8h + 2t + e, a warp
        ROWS_A_WARP rows at once (PERMUTE_ROWS). Every thread's stores are made visible
        to wgmma before it returns."""
        R: gl.constexpr = x_smem.type.shape[0]
        BK: gl.constexpr = x_smem.type.shape[1]
        warp_rows: gl.constexpr = min(4, R // ROWS_A_WARP)  # the warps over R, then K
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8],
                                                threads_per_warp=[ROWS_A_WARP, 32 // ROWS_A_WARP],
                                                warps_per_cta=[warp_rows, 4 // warp_rows],
                                                order=[1, 0])
        x = gl.reshape(x_smem.load(layout), [R, BK // 32, 2, 2, 2, 2, 2])  # row, c, t1, t0, e, s, h
        x = gl.reshape(gl.permute(x, (0, 1, 5, 6, 2, 3, 4)), [R, BK])  # c, s, h, t1, t0, e
        xp_smem.store(x)
        fence_async_shared()
        gl.thread_barrier()

    @gluon.jit
    def _row_quant(s_ptr, z_ptr, where, group):
        """Group `group`'s scales (fp32) and zero points (int32) of these weight rows;
        where: (rows, the same rows in the zero points' layout, N, the strides)."""
        rows, zero_rows, N, stride_s_n, stride_z_n = where
        scale = gl.load(s_ptr + rows * stride_s_n + group, mask=rows < N, other=0.0)
        zero = gl.load(z_ptr + zero_rows * stride_z_n + group, mask=zero_rows < N, other=0)
        return scale.to(gl.float32), zero.to(gl.int32)

    @gluon.jit
    def _consume(descs, bufs, ptrs, M, N, K, AHEAD: gl.constexpr, PERMUTE_ROWS: gl.constexpr,
                 num_warps: gl.constexpr):
        """The consumer warpgroup: each step's packed tiles into registers as wgmma's
        operand q - zero, two dots (gate, up) against x's permuted tile transposed, the
        group's scales (loaded AHEAD steps before, with the zero points) applied to the
        sums; then out's columns."""
        wg_desc, wu_desc, x_desc = descs
        wg_bufs, wu_bufs, x_bufs, ready, empty, xp_smem = bufs
        sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr, stride_s_n, stride_z_n, stride_out_m = ptrs
        BN: gl.constexpr = wg_desc.block_type.shape[0]
        BK: gl.constexpr = x_desc.block_type.shape[1]
        R: gl.constexpr = x_desc.block_type.shape[0]
        STAGES: gl.constexpr = x_bufs.type.shape[0]
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, R, 16])  # one warpgroup
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                                     k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
        dtype: gl.constexpr = x_desc.dtype
        BITS: gl.constexpr = _nibble_base(dtype)
        # BASE's bits in both halves, held in a register: a LOP3 takes one immediate, so
        # with both the mask and the base immediate ptxas makes the mask-and-OR two LOP3s
        # an operand register; with the base a value it cannot fold (N >> 31 is 0, but not
        # to the compiler) one, as the generated GEMV does (377 -> 314 SASS instructions a
        # thread a step, 13% faster).
        base_bits = (N >> 31) | (BITS * 0x00010001)
        zero_acc = gl.zeros([BN, R], gl.float32, layout=acc_layout)
        steps = K // BK
        rows = gl.program_id(0) * BN + gl.arange(0, BN, layout=row_layout)  # out's columns
        row_ok = rows < N
        # The zero points where _word_floats's words are.
        zero_layout: gl.constexpr = gl.SliceLayout(1, _word_layout(BN, BK // 8))
        zero_rows = gl.program_id(0) * BN + gl.arange(0, BN, layout=zero_layout)
        where = (rows, zero_rows, N, stride_s_n, stride_z_n)
        acc_g = zero_acc
        acc_u = zero_acc
        # The scales and zero points of the next AHEAD groups, nearest first.
        qg = (_row_quant(sg_ptr, zg_ptr, where, 0),)
        qu = (_row_quant(su_ptr, zu_ptr, where, 0),)
        for j in gl.static_range(1, AHEAD):
            group = gl.minimum(j, steps - 1)
            qg = qg + (_row_quant(sg_ptr, zg_ptr, where, group),)
            qu = qu + (_row_quant(su_ptr, zu_ptr, where, group),)
        xt = xp_smem.permute((1, 0))
        for i in range(steps):
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            # BASE + zero's bits in both halves
            a_g = _word_floats(wg_bufs.index(s), base_bits, base_bits | (qg[0][1] * 0x00010001),
                               a_layout, dtype)
            a_u = _word_floats(wu_bufs.index(s), base_bits, base_bits | (qu[0][1] * 0x00010001),
                               a_layout, dtype)
            _permuted_x(x_bufs.index(s), xp_smem, PERMUTE_ROWS)
            mbarrier.arrive(empty.index(s))  # the slot is in registers and xp_smem now
            p_g = warpgroup_mma(a_g, xt, zero_acc, use_acc=False, is_async=True)
            p_u = warpgroup_mma(a_u, xt, zero_acc, use_acc=False, is_async=True)
            # The scales and zero points AHEAD steps on load while the dots run.
            group = gl.minimum(i + AHEAD, steps - 1)
            qg_n = _row_quant(sg_ptr, zg_ptr, where, group)
            qu_n = _row_quant(su_ptr, zu_ptr, where, group)
            p_g, p_u, a_g, a_u = warpgroup_mma_wait(0, deps=(p_g, p_u, a_g, a_u))
            acc_g += qg[0][0][:, None] * p_g
            acc_u += qu[0][0][:, None] * p_u
            qg = qg[1:] + (qg_n,)
            qu = qu[1:] + (qu_n,)
        cols = gl.arange(0, R, layout=gl.SliceLayout(0, acc_layout))  # x's rows
        out = acc_g / (1.0 + gl.exp2(-1.4426950408889634 * acc_g)) * acc_u  # silu * up
        gl.store(out_ptr + cols[None, :] * stride_out_m + rows[:, None],
                 out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & (cols < M)[None, :])

    @gluon.jit
    def _int4_swiglu(wg_desc, wu_desc, x_desc, sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr, M, N,
                     K, stride_s_n, stride_z_n, stride_out_m, STAGES: gl.constexpr,
                     AHEAD: gl.constexpr, PERMUTE_ROWS: gl.constexpr, num_warps: gl.constexpr):
        """out [M, N] (M <= 16) over programs of 64 weight rows (the module docstring's
        schedule); the weights packed [N, K / 2] in tiles of [64, 64] bytes, x [M, K] in
        tiles of [16, 128] (or [8, 128]: X_ROWS); scales and zero points [N, K / 128],
        both weights' with the same strides, unit stride along K."""
        wg_bufs = gl.allocate_shared_memory(wg_desc.dtype, [STAGES] + wg_desc.block_type.shape,
                                            wg_desc.layout)
        wu_bufs = gl.allocate_shared_memory(wu_desc.dtype, [STAGES] + wu_desc.block_type.shape,
                                            wu_desc.layout)
        x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape,
                                           x_desc.layout)
        # x's tile with K permuted as the weights' words give it, a step's.
        xp_smem = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_type.shape,
                                            x_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        descs = (wg_desc, wu_desc, x_desc)
        bufs = (wg_bufs, wu_bufs, x_bufs, ready, empty, xp_smem)
        ptrs = (sg_ptr, zg_ptr, su_ptr, zu_ptr, out_ptr, stride_s_n, stride_z_n, stride_out_m)
        gl.warp_specialize([
            (_consume, (descs, bufs, ptrs, M, N, K, AHEAD, PERMUTE_ROWS, num_warps)),
            (_produce, (descs, bufs, M, N, K, num_warps)),
        ], [1], [24])
    # fmt: on


def int4_swiglu(x, wg, sg, zg, wu, su, zu, out, launches=None, **knobs):
    """out = silu(x @ wg.T) * (x @ wu.T), x [M, K] bf16 or fp16 (M <= ROWS), the weights packed
    int4 [N, K / 2] uint8 dequantized as (q - zero) * scale by their scales sg, su and
    zero points zg, zu [N, K / 128]; out [M, N] bf16 or fp16. launches: the
    launch.Described its caller keeps for calls like this one; knobs: AHEAD, STAGES,
    REGISTERS, PERMUTE_ROWS and X_ROWS by other values (what
    benchmarks/int4_decode_rows.py varies). Returns the compiled kernel."""
    shipped = {"AHEAD": AHEAD, "STAGES": STAGES, "REGISTERS": REGISTERS,
               "PERMUTE_ROWS": PERMUTE_ROWS, "X_ROWS": X_ROWS}  # fmt: skip
    knobs = shipped | knobs

    def first():
        m, k = x.shape
        n = wg.shape[0]
        x_rows = 8 if knobs["X_ROWS"] == 8 and m <= 8 else ROWS
        descs = (
            quant_hopper.descriptor(wg, [BLOCK_N, GROUP // 2]),
            quant_hopper.descriptor(wu, [BLOCK_N, GROUP // 2]),
            quant_hopper.descriptor(x, [x_rows, GROUP]),
        )
        scalars = (m, n, k, sg.stride(0), zg.stride(0), out.stride(0))
        meta = {
            "STAGES": knobs["STAGES"],
            "AHEAD": knobs["AHEAD"],
            "PERMUTE_ROWS": knobs["PERMUTE_ROWS"],
            "num_warps": 4,
            "maxnreg": knobs["REGISTERS"],
        }
        return _int4_swiglu, (triton.cdiv(n, BLOCK_N),), descs, scalars, meta

    launches = launches or launch.Described()
    return launches((wg, wu, x), (sg, zg, su, zu, out), first)
