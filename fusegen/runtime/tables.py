"""Reading the tuned table beside a kernel module (`fusegen tune` writes it)."""

import json
import logging
import os

import torch

_log = logging.getLogger(__name__)


def entries(module, name):
    """The entries of the module's TUNED_TABLE measured on its kernels (KERNEL_HASH);
    [] where there is no table. One that cannot be read is ignored, with a warning;
    entries tuned for other kernel source are ignored, with a note."""
    path = os.path.join(os.path.dirname(os.path.abspath(module["__file__"])), module["TUNED_TABLE"])
    found = []
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                found = list(json.load(f)["entries"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("%s: ignoring %s: %s", name, path, exc)
    kernel_hash = module["KERNEL_HASH"]
    kept = [e for e in found if isinstance(e, dict) and e.get("kernel_hash") == kernel_hash]
    if len(kept) < len(found):
        _log.info(
            "%s: %d of %d entries in %s were tuned for other kernel source and are ignored; "
            "run `fusegen tune` to measure them again",
            name,
            len(found) - len(kept),
            len(found),
            path,
        )
    return kept


def identity(index):
    """(name, [major, minor]) as tuned tables record a GPU."""
    return torch.cuda.get_device_name(index), list(torch.cuda.get_device_capability(index))
