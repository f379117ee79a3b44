"""Reading the tuned table beside a kernel module (`fusegen tune` writes it)."""

import json
import logging
import os

import torch

from .settings import TABLE_REACH

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


def device_identity(device):
    """(name, [major, minor]) of the GPU `device` names (its index, else the current
    one), as tuned tables record it."""
    index = torch.device(device).index
    return identity(torch.cuda.current_device() if index is None else index)


def nearest(found, wanted, rows, choose):
    """The entry of `found` whose key matches `wanted` in every field but `rows` (its row
    bucket), the nearest in rows and at most TABLE_REACH powers of two away (larger on a
    tie): (entry, choose(entry)), or None. choose(entry) checks the entry's GPU and
    makes what the launcher takes of it; an entry it returns None for, or that lacks a
    field or holds a wrong one (KeyError, TypeError, ValueError, AttributeError), is
    passed over. Farther entries' tiles can be far off (16-row tiles at 128 rows read the
    weights 8 times: 2x cuBLAS's time in a LLaMA at 16 x 8 tokens)."""
    close = []
    for entry in found:
        try:
            if any(entry["key"][n] != v for n, v in wanted.items() if n != rows):
                continue
            chosen = choose(entry)
            distance = abs(entry["key"][rows].bit_length() - wanted[rows].bit_length())
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if chosen is not None and distance <= TABLE_REACH:
            close.append((distance, -entry["key"][rows], entry, chosen))
    if not close:
        return None
    _, _, entry, chosen = min(close, key=lambda c: c[:2])
    return entry, chosen
