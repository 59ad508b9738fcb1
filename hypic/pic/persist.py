"""Persist segment entries to disk (one safetensors file) and load them back.

Tensors go into the safetensors body; everything else (keys, positions, metadata and the shape of
each payload tree) goes into a JSON manifest in the file's metadata. Payload trees may hold
tensors, ``None``, scalars, dtypes, tuples/lists and dataclasses; a dataclass is rebuilt by its
``module:qualname`` only when the module is under an allowed prefix (default ``hypic.``), so a file
cannot make the loader import arbitrary code. Loading with a :class:`Keyer` recomputes every digest
and rejects a file whose keys do not match (corruption, or another hash function).

Usage::

    save_entries(store.snapshot(), "cache.safetensors")
    for entry in load_entries("cache.safetensors", keyer=keyer):
        store.insert(entry)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import torch
from safetensors.torch import load_file, save_file

from hypic.pic.keys import KIND_PREFIX, KIND_SEGMENT, Keyer, KeyNamespace, StoreKey
from hypic.pic.payload import SegmentEntry

FORMAT_VERSION = 1
_MANIFEST = "hypic.pic.entries"
PathLike = Union[str, "os.PathLike[str]"]


def _encode_tree(obj: Any, tensors: Dict[str, torch.Tensor], prefix: str, to_cpu: bool = True) -> Any:
    if obj is None:
        return {"t": "none"}
    if isinstance(obj, (bool, int, float, str)):
        return {"t": "scalar", "v": obj}
    if isinstance(obj, torch.dtype):
        return {"t": "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.Tensor):
        name = f"{prefix}.{len(tensors)}"
        # A private contiguous CPU copy: safetensors refuses tensors that share storage. Kept on
        # its device (to_cpu=False) for a transfer between processes (hypic.runner.segment_parallel).
        tensors[name] = obj.detach().to("cpu", copy=True).contiguous() if to_cpu else obj.detach().contiguous()
        return {"t": "tensor", "name": name}
    if isinstance(obj, (tuple, list)):
        return {"t": type(obj).__name__, "items": [_encode_tree(o, tensors, prefix, to_cpu) for o in obj]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        # A class whose constructor does not take its fields as they are stored says what it
        # takes (``payload_fields()``): a DenseSummary with packed T is rebuilt from its packed
        # storage and flag, never from T's unpacked values.
        fields = (obj.payload_fields() if hasattr(obj, "payload_fields")
                  else {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init})
        return {
            "t": "dataclass",
            "cls": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {name: _encode_tree(value, tensors, prefix, to_cpu) for name, value in fields.items()},
        }
    raise ValueError(f"cannot persist a payload object of type {type(obj).__name__}")


def _resolve_class(path: str, allowed_modules: Sequence[str]):
    module, _, qualname = path.partition(":")
    if not any(module == p.rstrip(".") or module.startswith(p) for p in allowed_modules):
        raise ValueError(f"class {path!r} is outside the allowed modules {tuple(allowed_modules)}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"{path!r} is not a dataclass")
    return obj


def _decode_tree(node: Any, tensors: Dict[str, torch.Tensor], allowed: Sequence[str]) -> Any:
    t = node.get("t") if isinstance(node, dict) else None
    if t == "none":
        return None
    if t == "scalar":
        return node["v"]
    if t == "dtype":
        return getattr(torch, node["v"])
    if t == "tensor":
        if node["name"] not in tensors:
            raise ValueError(f"manifest names a missing tensor {node['name']!r}")
        return tensors[node["name"]]
    if t in ("tuple", "list"):
        items = [_decode_tree(o, tensors, allowed) for o in node["items"]]
        return tuple(items) if t == "tuple" else items
    if t == "dataclass":
        cls = _resolve_class(node["cls"], allowed)
        return cls(**{k: _decode_tree(v, tensors, allowed) for k, v in node["fields"].items()})
    raise ValueError(f"bad manifest node {node!r}")


def _encode_key(key: StoreKey) -> dict:
    ns = key.namespace
    out = {"digest": key.digest.hex(), "kind": key.kind, "model_id": ns.model_id, "dtype": ns.dtype,
           "tenant_salt": ns.tenant_salt, "body_start": key.body_start}
    if key.kind == KIND_PREFIX:
        # the whole chain, root first: each checkpoint's token count and digest, and the root's
        chain = []
        k = key
        while k is not None:
            chain.append(k)
            k = k.parent
        chain.reverse()
        out["material"] = list(key.prefix_token_ids())
        out["chain_lengths"] = [c.num_tokens for c in chain]
        out["chain_digests"] = [c.digest.hex() for c in chain]
        out["root_digest"] = chain[0].parent_digest.hex()
    else:
        out["material"] = list(key.material)
    return out


def _decode_key(d: dict, keyer: Optional[Keyer]) -> StoreKey:
    ns = KeyNamespace(d["model_id"], d["dtype"], d["tenant_salt"])
    kind = d["kind"]
    tokens = tuple(int(t) for t in d["material"])
    if kind == KIND_SEGMENT:
        key = StoreKey(bytes.fromhex(d["digest"]), kind, ns, int(d["body_start"]), tokens)
        if keyer is not None and Keyer(ns, keyer.hash_fn).segment_key(tokens, key.body_start) != key:
            raise ValueError(f"key {key.short}: stored digest does not match its contents")
        return key
    if kind != KIND_PREFIX:
        raise ValueError(f"unknown key kind {kind!r}")
    lengths = [int(n) for n in d["chain_lengths"]]
    digests = [bytes.fromhex(x) for x in d["chain_digests"]]
    if len(lengths) != len(digests) or not lengths or sum(lengths) != len(tokens) or min(lengths) < 1:
        raise ValueError("a prefix key's chain does not cover its tokens")
    parent, parent_digest, at = None, bytes.fromhex(d["root_digest"]), 0
    for n, digest in zip(lengths, digests):
        parent = StoreKey(digest, KIND_PREFIX, ns, 0, (parent, tokens[at:at + n], parent_digest))
        parent_digest, at = digest, at + n
    if parent.digest != bytes.fromhex(d["digest"]):
        raise ValueError("a prefix key's chain does not end at its digest")
    if keyer is not None:
        check = Keyer(ns, keyer.hash_fn)
        expect, at = None, 0
        for n in lengths:
            expect = check.prefix_key(expect, tokens[at:at + n])
            at += n
        if expect != parent or expect.digest != parent.digest:
            raise ValueError(f"key {parent.short}: stored digest does not match its contents")
    return parent


def encode_entries(entries: Iterable[SegmentEntry], *, to_cpu: bool = True) -> tuple:
    """``(manifest, tensors)``: a JSON-serialisable description of ``entries`` (keys, positions,
    metadata, each payload tree with tensors by name) and the named tensors, contiguous, on the
    CPU or (``to_cpu=False``) where they are."""
    tensors: Dict[str, torch.Tensor] = {}
    manifest: List[dict] = []
    for i, e in enumerate(entries):
        if not isinstance(e, SegmentEntry):
            raise ValueError(f"entries[{i}]: expected SegmentEntry, got {type(e).__name__}")
        try:
            metadata = json.loads(json.dumps(dict(e.metadata)))
        except TypeError as exc:
            raise ValueError(f"entries[{i}]: metadata is not JSON-serialisable ({exc})") from None
        manifest.append({
            "key": _encode_key(e.key),
            "origin_position": e.origin_position,
            "metadata": metadata,
            "linear": {str(k): _encode_tree(v, tensors, f"e{i}.l{k}", to_cpu) for k, v in e.linear.items()},
            "attention": {str(k): _encode_tree(v, tensors, f"e{i}.a{k}", to_cpu) for k, v in e.attention.items()},
        })
    return manifest, tensors


def decode_entries(manifest: Sequence[dict], tensors: Dict[str, torch.Tensor], *, keyer: Optional[Keyer] = None,
                   allowed_modules: Sequence[str] = ("hypic.",)) -> List[SegmentEntry]:
    """The entries :func:`encode_entries` described (with a ``keyer``, every digest checked)."""
    out = []
    for d in manifest:
        out.append(SegmentEntry(
            key=_decode_key(d["key"], keyer),
            linear={int(k): _decode_tree(v, tensors, allowed_modules) for k, v in d["linear"].items()},
            attention={int(k): _decode_tree(v, tensors, allowed_modules)
                       for k, v in d["attention"].items()},
            origin_position=int(d["origin_position"]),
            metadata=d["metadata"],
        ))
    return out


def save_entries(entries: Iterable[SegmentEntry], path: PathLike) -> int:
    """Write entries to ``path`` (safetensors). Returns how many were written."""
    manifest, tensors = encode_entries(entries)
    header = json.dumps({"version": FORMAT_VERSION, "entries": manifest})
    save_file(tensors, os.fspath(path), metadata={_MANIFEST: header})
    return len(manifest)


def load_entries(
    path: PathLike,
    *,
    keyer: Optional[Keyer] = None,
    allowed_modules: Sequence[str] = ("hypic.",),
    device: Union[str, torch.device] = "cpu",
) -> List[SegmentEntry]:
    """Read entries written by :func:`save_entries`."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as f:
        meta = f.metadata() or {}
    if _MANIFEST not in meta:
        raise ValueError(f"{os.fspath(path)!r} holds no hypic segment entries")
    header = json.loads(meta[_MANIFEST])
    if header.get("version") != FORMAT_VERSION:
        raise ValueError(f"unsupported entry file version {header.get('version')!r}")
    tensors = load_file(os.fspath(path), device=str(torch.device(device)))
    return decode_entries(header["entries"], tensors, keyer=keyer, allowed_modules=allowed_modules)
