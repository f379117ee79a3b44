"""How large a spec may be: every bound fusegen puts on its input, in one place.

A spec is untrusted input: it is copied between repositories, and YAML can make a small
file stand for a huge value (aliases re-used inside aliases), nest without end, or hold
numbers and strings no kernel needs. Each limit below is far above what real specs hold
(specs/ and benchmarks/specs/: at most 3 kernels in a file, 8 in a build, 5 chain
steps, 4 inputs, 3 dims, 1 KB and under 100 YAML values a file), and low enough that
the worst input within all of them is read and rejected in about a second and a few
tens of MB. Exceeding one is an ordinary spec error (file:line:col, what is allowed),
reported before any work grows with the input. docs/spec.md ("Limits") lists them.
"""

from __future__ import annotations

# -- what one build reads ------------------------------------------------------------

# Spec files in one build, counted before any is read: a folder of thousands is refused
# at once. Real builds have 5.
MAX_FILES = 256

# Bytes of spec text one build reads, all files together; each file's size is checked
# (stat) before it is read, and no more than this is read from any file. Real specs are
# about 1 KB; PyYAML's pure-Python scanner reads a MiB in under a second.
MAX_BYTES = 1 << 20

# YAML values (scalars, lists, mappings, merge keys) in one build, counted while composing
# and again while reading with every alias expanded: an alias counts all the values it
# stands for, each time it is used, so "billion laughs" files stop here. A real spec has
# under 100; 20,000 take PyYAML about a second to compose.
MAX_NODES = 20_000

# Levels of nested lists and mappings (a `<<` merge counts as one). A spec needs 6
# (kernels, a kernel, autotune, configs, a config, a value); past a few hundred PyYAML's
# composer and the reader's recursion would overflow the stack.
MAX_DEPTH = 32

# Characters in one scalar (a name, a doc, a key). The longest real doc has 230; 4096 also
# keeps integer text below Python's 4,300-digit conversion limit.
MAX_SCALAR_CHARS = 4096

# Magnitude of an integer anywhere in a spec: int64, the widest integer torch and Triton
# take. Nothing in a spec counts further.
MAX_INT = 2**63 - 1

# -- what one spec holds ---------------------------------------------------------------

# Kernels in one file and in one build. Generating and formatting (black) a kernel takes
# about 0.9 s, so 128 valid kernels build in two minutes (115 s, 71 MB measured); real
# specs have 1-3 a file and 8 a build.
MAX_KERNELS_PER_FILE = 64
MAX_KERNELS = 128

# Steps of one chain. Each becomes an expression in the kernel and the reference; real
# chains have 2-5 steps.
MAX_CHAIN_STEPS = 64

# Inputs of one kernel: each is a pointer and its strides in the kernel's signature and an
# argument of the launcher. Real kernels have 1-4.
MAX_INPUTS = 32

# Dims of one kernel. Inputs have at most 2 dims and a chain uses 3 (M, K, N); 16 leaves
# room for names that only document.
MAX_DIMS = 16

# Configs of an `autotune.configs` space. The built-in spaces have at most 14, and the
# launcher times each config at each new shape.
MAX_CONFIGS = 64

# Characters of a kernel, input, dim or output name (ASCII: Python would read other
# letters in NFKC form, `ｘ` as `x`). Names become identifiers and file names (NAME.py,
# test_NAME.py, NAME.tuned.json, far under the 255-byte limit of file systems); real
# names have under 20.
MAX_NAME_CHARS = 64

# A fixed dim's size: the largest int Triton passes as a 32-bit argument. Fixed dims are
# weights' sizes (768, 4096, 14336, a 256k vocabulary); rows are `dynamic`.
MAX_DIM_SIZE = 2**31 - 1

# Any value in a config (block sizes, GROUP_M, warps, stages, ...): 2**20 is the most
# elements a Triton tile may have, so no block, group or count of a config is larger.
MAX_CONFIG_VALUE = 2**20
