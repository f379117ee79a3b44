"""Constants the launchers and fusegen's own tools share (`fusegen tune` times configs
as the launcher's tuner does). Plain values: importing this imports neither torch nor
triton."""

# Rows above which tuning skips split-K configs: their partial sums' traffic outgrows
# what the extra programs win.
SPLIT_K_MAX_ROWS = 256
# Runtime tuning compiles and times only the SHORTLIST configs that the estimate ranks
# first for the kernel it favours, and the best one of the other: compiling is most of
# a first call (about 1 s a config on an H200, where both full spaces took 35-55 s).
# Three of each kernel's kept the fastest config, or one within 1%, on every anchor GEMM
# chain of an H200.
SHORTLIST = 3
TABLE_REACH = 1  # a tuned entry serves row buckets up to this many powers of two away
GRAPH_TIMED_UNDER_MS = 0.1  # tuning times shorter kernels from CUDA graphs (see graph_bench)
# Per SM of an H200, measured: bf16 tensor-core flops, and bytes from L2 and from HBM.
MMA_FLOPS_PER_US = 5.36e6
L2_BYTES_PER_US = 72e3
HBM_BYTES_PER_US = 32.6e3
WAVE_US = 1.5  # a wave's start and pipeline fill
TMA_US = 2.0  # the TMA kernel's descriptors, made in the kernel
# The longest row a row chain's backward kernel holds in registers (BLOCK_N); longer
# rows take the reference's autograd (logged once).
ROW_BACKWARD_MAX_COLS = 16384
