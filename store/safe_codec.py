"""A checkpoint format that cannot execute code: JSON for structure, raw numeric arrays for vectors.

Projection checkpoints used to be pickles, and unpickling a blob planted in the database runs
whatever code it names. This codec writes the same object graph as plain data instead:

- JSON scalars, lists, dicts (as [key, value] pairs, so insertion order and non-string keys
  survive), tuples, sets, bytes, non-finite floats, each tagged;
- numpy arrays as (dtype, shape, offset) into one raw buffer, rebuilt with `np.frombuffer` from an
  allow-list of numeric dtypes (no object arrays, so nothing is unpickled);
- objects of the projection's own classes as their attribute dicts, re-created with
  `object.__new__` (no `__init__`, `__setstate__` or any other method of the class runs); pydantic
  models through `model_validate`, which only validates data. A class is accepted only when it is
  defined in a grandrounds module that is already imported (nothing named in a blob is imported)
  and is a plain object (no custom `__new__`);
- hnswlib graphs through hnswlib's own serialised parameters (numeric arrays), checked for
  consistent sizes and in-range links before hnswlib is handed them.

Anything else is refused: a blob that does not decode raises `CheckpointFormatError`, and the
caller rebuilds from the log.
"""

from __future__ import annotations

from grandrounds.store.errors import GrandroundsError
import base64
import json
import math
import struct
import sys
from dataclasses import is_dataclass
from typing import Any

import numpy as np

try:  # hnswlib is a dependency, but keep the codec importable without it
    import hnswlib
except ImportError:  # pragma: no cover
    hnswlib = None  # type: ignore[assignment]

from pydantic import BaseModel

MAGIC = b"GRCK1\n"
_DTYPES = {np.dtype(t).str for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                     "uint64", "float16", "float32", "float64")}
_MODULE_PREFIXES = ("grandrounds.store.", "grandrounds.handlers.", "grandrounds.replay.")


class CheckpointFormatError(GrandroundsError, ValueError):
    """A checkpoint blob that is not a well-formed safe checkpoint (it is dropped and rebuilt)."""


# --- encoding ------------------------------------------------------------------------------------


class _Encoder:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # objects memoised by id() stay alive while encoding

    def array(self, a: np.ndarray) -> dict:
        a = np.ascontiguousarray(a)
        if a.dtype.str not in _DTYPES:
            raise CheckpointFormatError(f"array dtype {a.dtype} cannot go into a checkpoint")
        raw = a.tobytes()
        out = {"$a": [a.dtype.str, list(a.shape), self.size, len(raw)]}
        self.chunks.append(raw)
        self.size += len(raw)
        return out

    def enc(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) is int:
            return x
        if type(x) is float:
            return x if math.isfinite(x) else {"$f": repr(x)}
        if isinstance(x, np.generic):
            return {"$g": self.array(np.asarray(x))}
        if isinstance(x, bytes):
            return {"$b": base64.b64encode(x).decode("ascii")}
        if isinstance(x, tuple) and type(x) is tuple:
            return {"$t": [self.enc(v) for v in x]}
        if isinstance(x, (set, frozenset)):
            try:  # sorted where it can be: a set's iteration order depends on its history, its bytes should not
                items = sorted(x)
            except TypeError:
                items = list(x)
            return {"$s" if isinstance(x, set) else "$fs": [self.enc(v) for v in items]}
        # Mutable or identity-bearing values: a second reference to the same object stays shared.
        ref = self.memo.get(id(x))
        if ref is not None:
            return {"$r": ref}
        n = len(self.memo)
        self.memo[id(x)] = n
        self.keep.append(x)
        return {"$id": n, **self._shared(x)}

    def _shared(self, x: Any) -> dict:
        # Fast paths (most of a projection is lists of strings and str-keyed dicts): plain values go
        # into the JSON as they are, without a call per element.
        if type(x) is list:
            return {"$l": x if _plain(x) else [self.enc(v) for v in x]}
        if type(x) is dict:
            if all(type(k) is str for k in x):
                values = x.values()
                return {"$ds": x if _plain(values) else {k: self.enc(v) for k, v in x.items()}}
            if _plain(x) and _plain(x.values()):
                return {"$dp": [list(x), list(x.values())]}
            return {"$d": [[self.enc(k), self.enc(v)] for k, v in x.items()]}
        if isinstance(x, np.ndarray):
            return self.array(x)
        if hnswlib is not None and isinstance(x, hnswlib.Index):
            return {"$hnsw": self.enc(x.__getstate__()[0])}
        cls = type(x)
        name = _class_name(cls)
        if isinstance(x, BaseModel):
            return {"$m": name, "v": x.model_dump(mode="json")}
        if hasattr(x, "__dict__") and not hasattr(cls, "__slots__"):
            _allowed_class(cls)
            skip = getattr(cls, "_checkpoint_skip", ())
            return {"$o": name, "a": {k: self.enc(v) for k, v in vars(x).items() if k not in skip}}
        raise CheckpointFormatError(f"{cls.__module__}.{cls.__qualname__} cannot go into a checkpoint")


_PLAIN_TYPES = (str, int, bool, type(None))


def _plain(values) -> bool:
    """Whether every value goes into JSON as itself (no tag, no sharing to keep)."""
    for v in values:
        t = type(v)
        if t in _PLAIN_TYPES:
            continue
        if t is float and math.isfinite(v):
            continue
        return False
    return True


def encode(value: Any) -> bytes:
    enc = _Encoder()
    tree = enc.enc(value)
    header = json.dumps(tree, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    return MAGIC + struct.pack(">Q", len(header)) + header + b"".join(enc.chunks)


# --- decoding ------------------------------------------------------------------------------------


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _allowed_class(cls: type) -> type:
    if not cls.__module__.startswith(_MODULE_PREFIXES):
        raise CheckpointFormatError(f"class {_class_name(cls)} is not a grandrounds projection class")
    if cls.__new__ is not object.__new__ and not issubclass(cls, BaseModel):
        raise CheckpointFormatError(f"class {_class_name(cls)} has its own __new__")
    return cls


def _resolve(name: Any) -> type:
    """A class named in a blob: only one already imported from a grandrounds module (nothing is imported)."""
    if not isinstance(name, str) or name.count(":") != 1:
        raise CheckpointFormatError(f"bad class name {name!r}")
    module_name, qualname = name.split(":")
    module = sys.modules.get(module_name)
    if module is None or not module_name.startswith(_MODULE_PREFIXES):
        raise CheckpointFormatError(f"class {name!r} is not an imported grandrounds class")
    obj: Any = module
    for part in qualname.split("."):
        if part.startswith("__") or not part.isidentifier():
            raise CheckpointFormatError(f"bad class name {name!r}")
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or _class_name(obj) != name:
        raise CheckpointFormatError(f"{name!r} is not a class")
    return _allowed_class(obj)


class _Decoder:
    def __init__(self, buffer: memoryview):
        self.buffer = buffer
        self.memo: dict[int, Any] = {}
        self.depth = 0

    def array(self, spec: Any) -> np.ndarray:
        if not (isinstance(spec, list) and len(spec) == 4):
            raise CheckpointFormatError("bad array entry")
        dtype, shape, offset, n = spec
        if dtype not in _DTYPES or not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise CheckpointFormatError(f"array of dtype {dtype!r}, shape {shape!r} refused")
        if type(offset) is not int or type(n) is not int or offset < 0 or offset + n > len(self.buffer):
            raise CheckpointFormatError("array outside the checkpoint's buffer")
        dt = np.dtype(dtype)
        if math.prod(shape) * dt.itemsize != n:
            raise CheckpointFormatError("array size does not match its shape")
        return np.frombuffer(self.buffer[offset:offset + n], dtype=dt).reshape(shape).copy()

    def dec(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            raise CheckpointFormatError("untagged list")
        if not isinstance(x, dict):
            raise CheckpointFormatError(f"unexpected {type(x).__name__}")
        self.depth += 1
        if self.depth > 200:
            raise CheckpointFormatError("checkpoint nested too deeply")
        try:
            return self._tagged(x)
        finally:
            self.depth -= 1

    def _tagged(self, x: dict) -> Any:
        if "$r" in x:
            if x["$r"] not in self.memo:
                raise CheckpointFormatError("reference to an object not decoded yet")
            return self.memo[x["$r"]]
        if "$f" in x:
            if x["$f"] not in ("nan", "inf", "-inf"):
                raise CheckpointFormatError("bad float")
            return float(x["$f"])
        if "$g" in x:
            a = self.array(x["$g"].get("$a") if isinstance(x["$g"], dict) else None)
            if a.shape != ():
                raise CheckpointFormatError("numpy scalar with a shape")
            return a[()]
        if "$b" in x:
            return base64.b64decode(x["$b"], validate=True)
        if "$t" in x:
            return tuple(self.dec(v) for v in self._list(x["$t"]))
        if "$s" in x:
            return {self.dec(v) for v in self._list(x["$s"])}
        if "$fs" in x:
            return frozenset(self.dec(v) for v in self._list(x["$fs"]))
        ident = x.get("$id")
        if type(ident) is not int or ident in self.memo:
            raise CheckpointFormatError("bad object id")
        value = self._shared(x)
        self.memo[ident] = value
        return value

    @staticmethod
    def _list(v: Any) -> list:
        if not isinstance(v, list):
            raise CheckpointFormatError("expected a list")
        return v

    def _shared(self, x: dict) -> Any:
        if "$l" in x:
            items = self._list(x["$l"])
            return list(items) if _untagged(items) else [self.dec(v) for v in items]
        if "$ds" in x:
            d = x["$ds"]
            if not isinstance(d, dict):
                raise CheckpointFormatError("bad dict")
            return dict(d) if _untagged(d.values()) else {k: self.dec(v) for k, v in d.items()}
        if "$dp" in x:
            pair = x["$dp"]
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], list)
                    and isinstance(pair[1], list) and len(pair[0]) == len(pair[1])
                    and _untagged(pair[0]) and _untagged(pair[1])):
                raise CheckpointFormatError("bad dict")
            try:
                return dict(zip(pair[0], pair[1]))
            except TypeError:
                raise CheckpointFormatError("bad dict key") from None
        if "$d" in x:
            out = {}
            for pair in self._list(x["$d"]):
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise CheckpointFormatError("bad dict entry")
                out[self.dec(pair[0])] = self.dec(pair[1])
            return out
        if "$a" in x:
            return self.array(x["$a"])
        if "$hnsw" in x:
            return _hnsw_from(self.dec(x["$hnsw"]))
        if "$m" in x:
            cls = _resolve(x["$m"])
            if not issubclass(cls, BaseModel):
                raise CheckpointFormatError(f"{x['$m']} is not a model")
            return cls.model_validate(x["v"])
        if "$o" in x:
            cls = _resolve(x["$o"])
            if issubclass(cls, BaseModel):
                raise CheckpointFormatError(f"{x['$o']} is a model")
            attrs = x.get("a")
            if not isinstance(attrs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in attrs):
                raise CheckpointFormatError(f"bad attributes for {x['$o']}")
            state = {k: self.dec(v) for k, v in attrs.items()}
            obj = object.__new__(cls)
            for k, v in state.items():
                object.__setattr__(obj, k, v)  # frozen dataclasses too; no method of the class runs
            return obj
        raise CheckpointFormatError("unknown tag")


def _untagged(values) -> bool:
    """JSON scalars only: nothing in them to decode."""
    for v in values:
        if isinstance(v, (dict, list)):
            return False
    return True


def decode(blob: bytes) -> Any:
    """The object graph `encode` wrote; `CheckpointFormatError` for anything else (a pickle, say)."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CheckpointFormatError("checkpoint is not bytes")
    view = memoryview(bytes(blob))
    if bytes(view[:len(MAGIC)]) != MAGIC or len(view) < len(MAGIC) + 8:
        raise CheckpointFormatError("not a safe checkpoint (no GRCK1 header)")
    (n,) = struct.unpack(">Q", view[len(MAGIC):len(MAGIC) + 8])
    start = len(MAGIC) + 8
    if start + n > len(view):
        raise CheckpointFormatError("truncated checkpoint")
    try:
        tree = json.loads(bytes(view[start:start + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointFormatError(f"checkpoint header is not JSON: {exc}") from None
    return _Decoder(view[start + n:]).dec(tree)


# --- hnswlib graphs ------------------------------------------------------------------------------


def _hnsw_from(params: Any) -> Any:
    """An hnswlib index from its serialised parameters, after checking they describe a sane graph."""
    if hnswlib is None:
        raise CheckpointFormatError("hnswlib is not installed")
    _check_hnsw(params)
    index = hnswlib.Index.__new__(hnswlib.Index)
    index.__setstate__((params,))
    return index


def _check_hnsw(p: Any) -> None:
    """Sizes and links in range: hnswlib trusts its input, so a crafted graph is refused here first."""
    need = {"ser_version": int, "space": str, "dim": int, "max_elements": int, "cur_element_count": int,
            "size_data_per_element": int, "size_links_per_element": int, "offset_level0": int, "max_M": int,
            "max_M0": int, "enterpoint_node": int, "max_level": int, "label_lookup_external": np.ndarray,
            "label_lookup_internal": np.ndarray, "element_levels": np.ndarray, "data_level0": np.ndarray,
            "link_lists": np.ndarray}
    if not isinstance(p, dict) or any(not isinstance(p.get(k), t) for k, t in need.items()):
        raise CheckpointFormatError("hnswlib parameters incomplete")
    if p["ser_version"] != 1 or p["space"] not in ("cosine", "ip", "l2") or p["offset_level0"] != 0:
        raise CheckpointFormatError("hnswlib parameters of an unknown layout")
    n, cap, dim = p["cur_element_count"], p["max_elements"], p["dim"]
    m, m0 = p["max_M"], p["max_M0"]
    per, links_per = p["size_data_per_element"], p["size_links_per_element"]
    if not (0 <= n <= cap and 0 < dim and 0 < m <= 4096 and 0 < m0 <= 8192):
        raise CheckpointFormatError("hnswlib sizes out of range")
    level0_links = 4 + 4 * m0
    if links_per != 4 + 4 * m or per != level0_links + 4 * dim + 8:
        raise CheckpointFormatError("hnswlib element layout inconsistent")
    if p.get("offset_data") != level0_links or p.get("label_offset") != level0_links + 4 * dim:
        raise CheckpointFormatError("hnswlib element layout inconsistent")
    if p["data_level0"].size != n * per or p["element_levels"].shape != (cap,):
        raise CheckpointFormatError("hnswlib arrays of the wrong size")
    if p["label_lookup_external"].shape != p["label_lookup_internal"].shape or p["label_lookup_external"].size > n:
        raise CheckpointFormatError("hnswlib label tables inconsistent")
    if n and not (0 <= p["enterpoint_node"] < n) or p["label_lookup_internal"].size and \
            int(p["label_lookup_internal"].max()) >= max(n, 1):
        raise CheckpointFormatError("hnswlib entry point or label out of range")
    levels = p["element_levels"][:n].astype(np.int64)
    if levels.size and (levels.min() < 0 or levels.max() > p["max_level"] or p["max_level"] > 64):
        raise CheckpointFormatError("hnswlib levels out of range")
    rows = np.frombuffer(p["data_level0"].tobytes(), dtype=np.uint8).reshape(n, per)[:, :level0_links]
    _check_links(rows, m0, n)
    blob = p["link_lists"].tobytes()
    if len(blob) != int(levels.sum()) * links_per:
        raise CheckpointFormatError("hnswlib upper-level links of the wrong size")
    if blob:
        _check_links(np.frombuffer(blob, dtype=np.uint8).reshape(-1, links_per), m, n)


def _check_links(rows: np.ndarray, most: int, n: int) -> None:
    if not rows.size:
        return
    counts = rows[:, 0].astype(np.int64) | (rows[:, 1].astype(np.int64) << 8)
    if counts.max() > most:
        raise CheckpointFormatError("hnswlib node with too many links")
    ids = np.ascontiguousarray(rows[:, 4:]).view("<u4").reshape(len(rows), most)
    used = np.arange(most)[None, :] < counts[:, None]
    if used.any() and int(ids[used].max()) >= n:
        raise CheckpointFormatError("hnswlib link to a node that does not exist")
