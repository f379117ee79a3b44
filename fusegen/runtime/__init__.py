"""Launch support for the kernel modules fusegen writes, copied verbatim into each output
folder as `_fusegen_runtime/` beside them.

Each kernel module keeps what is its own (its config spaces, Triton kernels, checks,
launch arguments and PyTorch reference) and hands the rest to an object made from this
package: `chains.Kernels` for a chain, `attention.Attention` for an attention kernel.
A kernel module loads the folder's copy by its path under a name that carries
RUNTIME_HASH, so folders built by different fusegen versions keep their own, however
the module itself was imported.

Modules: settings (plain constants, shared with fusegen's tools), checks (what a call's
checks use), device (a GPU's facts, timing configs), ops (torch.compile's ops), tables
(tuned tables), chains and attention (the launchers), harness and equivalence (the
generated chain tests' machinery, which only those tests import, with pytest). Only torch
and triton are needed to run the launchers, and this file imports neither.
"""

# sha256 of this package as fusegen writes it (this line holding a placeholder): the
# kernel modules beside it name the runtime they were built with by it.
RUNTIME_HASH = "runtime-hash-hex"
