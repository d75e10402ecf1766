"""LoRA adapters mounted on the served model and selected per request.

The input format is mlx-lm's (``adapter_config.json`` + ``adapters.safetensors``, what
``mlx_lm.lora`` writes): tensors named ``<module path>.lora_a`` ``(in, rank)`` and
``<module path>.lora_b`` ``(rank, out)``; ``lora_parameters.scale`` scales the delta, so a
targeted linear layer computes ``y = base(x) + scale * (x @ lora_a) @ lora_b``, exactly as
mlx-lm's ``LoRALinear`` does.

Nothing is fused or reloaded. The first adapter that targets a linear layer replaces it,
once, with a :class:`LoRAHost` that keeps the base layer and any number of mounted
adapters' ``(lora_a, lora_b, scale)``. Which adapters a forward applies is read from the
registry's :class:`Selection`, set by the engine before each model call:

* the serial lane selects the request's adapter set for the whole call;
* the batch lane selects, per adapter, a row mask ``(B, 1, 1)``: each row's delta is added
  to the rows that chose that adapter only, so requests with different adapters share a
  decode batch.

An adapter that no running row selected is not computed at all; with nothing selected a
wrapped layer costs one attribute check. A stacked set ``"a+b"`` adds both deltas.

Mounting by path over HTTP (``POST /v1/adapters``) is confined to the operator's adapter
roots (:meth:`AdapterRegistry.confine`: the ``--adapter-dir`` folders and the folder holding
``--adapter``), symlinks resolved first; a path outside them is refused with one text whether
or not it exists, so the route cannot be used to probe the server's disk. Without a root,
adapters are mounted only at start.

Mount and unmount change the model and run on the engine's worker, between decode steps;
an unmounted adapter stops being selectable at once and its arrays are dropped when the
last running row that chose it ends (no request is ever served with the wrong adapter).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from mlxrt.errors import InvalidRequest, NotFound

__all__ = ["Adapter", "AdapterRegistry", "LoRAHost", "Selection", "parse_adapter_spec",
           "ADAPTER_CONFIG", "ADAPTER_WEIGHTS"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapters.safetensors"
#: Words a request may use for "no adapter" (case-insensitive).
NO_ADAPTER = frozenset({"none", "base", ""})
_BAD_ID = re.compile(r"[+,/\\\s]")


@attrs.frozen
class Adapter:
    """A mounted adapter (what ``GET /v1/adapters`` lists)."""

    id: str
    #: Unique per mount (``id#n``): rows pin it at admission, so a remount under the same id
    #: never changes the adapter of a row already running.
    key: str
    path: str
    rank: int
    scale: float
    layers: tuple[str, ...]  # module paths it changes
    size_bytes: int
    base_model: str | None = None
    #: Who mounted it (:func:`mlxrt.api.auth.caller_of`): ``""`` for the server's own (``--adapter``,
    #: or any mount on a server without API keys), usable by every caller; else only by that key.
    owner: str = ""

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "path": self.path, "rank": self.rank, "scale": self.scale,
                "layers": len(self.layers), "mounted_layers": list(self.layers),
                "size_bytes": self.size_bytes, "base_model": self.base_model}


class Selection:
    """Which adapters the next model call applies: ``(id, mask)`` pairs, where ``mask`` is
    ``None`` (every row) or a ``(B, 1, 1)`` array of 1s for the rows that chose ``id``."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: tuple[tuple[str, Any], ...] = ()


class _Slot:
    """One wrapped layer's mounted deltas: id → (lora_a, lora_b, scale)."""

    __slots__ = ("deltas",)

    def __init__(self) -> None:
        self.deltas: dict[str, tuple[Any, Any, float]] = {}


def _host_class() -> type:
    import mlx.nn as nn

    class LoRAHost(nn.Module):
        """A linear layer plus the mounted adapters' low-rank deltas (applied when selected)."""

        def __init__(self, base: Any, slot: _Slot, selection: Selection) -> None:
            super().__init__()
            self.base = base
            # Plain attributes (not arrays, dicts or lists): they stay out of the model's
            # parameter tree, so mounting never changes what the model reports as weights.
            self._slot = slot
            self._selection = selection

        def __call__(self, x: Any) -> Any:
            y = self.base(x)
            for name, mask in self._selection.active:
                delta = self._slot.deltas.get(name)
                if delta is None:
                    continue
                a, b, scale = delta
                z = scale * ((x @ a) @ b)
                if mask is not None:
                    z = z * mask
                y = y + z.astype(x.dtype)
            return y

    return LoRAHost


_LORA_HOST: type | None = None


def LoRAHost(base: Any, slot: _Slot, selection: Selection) -> Any:
    """Wrap ``base`` (``nn.Linear`` or ``nn.QuantizedLinear``); MLX imports on first use."""
    global _LORA_HOST
    if _LORA_HOST is None:
        _LORA_HOST = _host_class()
    return _LORA_HOST(base, slot, selection)


def parse_adapter_spec(value: str) -> tuple[str, ...]:
    """``"a+b"`` / ``"a,b"`` → ``("a", "b")``; ``"none"`` → ``()``. Duplicates collapse."""
    if value.strip().lower() in NO_ADAPTER:
        return ()
    names: list[str] = []
    for part in re.split(r"[+,]", value):
        name = part.strip()
        if not name:
            raise InvalidRequest(f"adapter {value!r} has an empty name; use \"id\", \"a+b\" or \"none\"",
                                 param="adapter")
        if name.lower() in NO_ADAPTER:
            raise InvalidRequest(f"adapter {value!r}: \"none\" cannot be stacked with other adapters",
                                 param="adapter")
        if name not in names:
            names.append(name)
    return tuple(names)


def _linear_dims(module: Any) -> tuple[int, int] | None:
    """``(in, out)`` of a linear layer (quantized too); None for anything else."""
    import mlx.nn as nn

    if isinstance(module, nn.QuantizedLinear):
        out, packed = module.weight.shape
        return packed * 32 // module.bits, out
    if isinstance(module, nn.Linear):
        out, inp = module.weight.shape
        return inp, out
    return None


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """Check a folder holds an mlx-lm adapter; its ``adapter_config.json`` (400s name what is wrong)."""
    if not folder.is_dir():
        raise InvalidRequest(f"adapter dir not found: {folder}", param="path", code="adapter_not_found")
    config_file = folder / ADAPTER_CONFIG
    if not config_file.is_file():
        raise InvalidRequest(f"no {ADAPTER_CONFIG} in {folder}", param="path", code="invalid_adapter")
    if not (folder / ADAPTER_WEIGHTS).is_file():
        peft = " (a PEFT adapter_model.safetensors is not mlx-lm's format)" \
            if (folder / "adapter_model.safetensors").is_file() else ""
        raise InvalidRequest(f"no adapter weights at {folder / ADAPTER_WEIGHTS}{peft}", param="path",
                             code="invalid_adapter")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{config_file}: not valid JSON ({exc})", param="path", code="invalid_adapter") from None
    if not isinstance(config, dict):
        raise InvalidRequest(f"{config_file}: not a JSON object", param="path", code="invalid_adapter")
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise InvalidRequest(f"{config_file}: fine_tune_type {kind!r} is not supported (only \"lora\")",
                             param="path", code="invalid_adapter")
    params = config.get("lora_parameters")
    if not isinstance(params, dict):
        raise InvalidRequest(f"{config_file}: lora_parameters (rank, scale) is missing", param="path",
                             code="invalid_adapter")
    for key in ("rank", "scale"):
        value = params.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            hint = " (mlx-lm uses scale, not alpha)" if key == "scale" and "alpha" in params else ""
            raise InvalidRequest(f"{config_file}: lora_parameters.{key} must be a number{hint}", param="path",
                                 code="invalid_adapter")
    if int(params["rank"]) != params["rank"] or params["rank"] < 1:
        raise InvalidRequest(f"{config_file}: lora_parameters.rank must be a positive integer", param="path",
                             code="invalid_adapter")
    return config


def qualified(owner: str, adapter_id: str) -> str:
    """The registry's name of ``owner``'s adapter ``adapter_id``: the id itself for the server's
    (owner ``""``), ``<owner prefix>/<id>`` for an API key's (``/`` is never in a client's id)."""
    return f"{owner[:16]}/{adapter_id}" if owner else adapter_id


class AdapterRegistry:
    """The served model's mounted adapters and the selection its LoRA layers read.

    :meth:`mount`, :meth:`unmount`, :meth:`select`, :meth:`select_rows` and :meth:`release`
    run on the engine's worker only. :meth:`resolve`, :meth:`list` and :meth:`available` are
    safe from the event loop (the mounted table is replaced, never changed in place).

    Adapters belong to the caller that mounted them: with API keys, a key's mounts are in its
    own namespace (:func:`qualified`), which only that key lists, selects (:meth:`qualify`) and
    unmounts; the server's own (``--adapter``) every key may use.
    """

    def __init__(self, dirs: Sequence[str | Path] = ()) -> None:
        self.selection = Selection()
        self.dirs = [Path(d).expanduser() for d in dirs]
        self.default: tuple[str, ...] = ()
        self._mounted: dict[str, Adapter] = {}
        self._slots: dict[str, _Slot] = {}  # module path → its wrapper's slot
        self._retiring: set[str] = set()  # keys unmounted while rows still use them
        self._mounts = 0

    # -- any thread --------------------------------------------------------------------------

    def list(self, owner: str | None = None) -> list[Adapter]:
        """Every mounted adapter (``owner`` ``None``), or those ``owner`` may use: its own and
        the server's."""
        return [a for a in self._mounted.values() if owner is None or a.owner in ("", owner)]

    def get(self, adapter_id: str, owner: str = "") -> Adapter | None:
        return self._mounted.get(qualified(owner, adapter_id))

    def qualify(self, value: str | None, owner: str) -> str | None:
        """A request's ``adapter`` field as ``owner`` means it, in registry names: each id is the
        caller's own adapter, else the server's; any other (another key's) is unknown (400)."""
        if value is None or not owner:
            return value
        names = parse_adapter_spec(value)
        if not names:
            return value
        out = []
        for name in names:
            own = qualified(owner, name)
            if "/" not in name and own in self._mounted:
                out.append(own)
            elif "/" not in name and name in self._mounted:
                out.append(name)
            else:
                listed = ", ".join(sorted({a.id for a in self.list(owner)})) or "(none)"
                raise InvalidRequest(f"unknown adapter \"{name}\" — mounted: {listed}", param="adapter",
                                     code="unknown_adapter")
        return "+".join(out)

    def resolve(self, value: str | None) -> tuple[str, ...]:
        """A request's ``adapter`` field → the adapter set it runs with (``None``: the
        server's default). Unknown ids are a 400 listing what is mounted."""
        names = self.default if value is None else parse_adapter_spec(value)
        self.check(names)
        return names

    def selection_needed(self) -> bool:
        """Whether any adapter is mounted (or still in use after its unmount)."""
        return bool(self._mounted or self._retiring)

    def check(self, names: Iterable[str]) -> None:
        self.keys(names)

    def keys(self, names: Iterable[str]) -> tuple[str, ...]:
        """The mount keys of adapter ids ``names`` (what a row pins); 400 for an unknown id."""
        mounted = self._mounted
        keys = []
        for name in names:
            if name not in mounted:
                listed = ", ".join(sorted(n for n in mounted if "/" not in n)) or "(none)"
                raise InvalidRequest(f"unknown adapter \"{name}\" — mounted: {listed}", param="adapter",
                                     code="unknown_adapter")
            keys.append(mounted[name].key)
        return tuple(keys)

    def available(self, owner: str = "") -> list[dict[str, Any]]:
        """Adapter folders directly under the configured directories (or given as one); a folder
        a symlink leads out of every root is not listed (it could not be mounted either).
        ``mounted``: the id ``owner`` (or the server) has it mounted under."""
        found: list[dict[str, Any]] = []
        seen: set[Path] = set()
        mine = sorted(self.list(owner), key=lambda a: a.owner != owner)  # its own before the server's
        mounted_paths: dict[str, str] = {}
        for adapter in mine:
            mounted_paths.setdefault(adapter.path, adapter.id)
        for root in self.dirs:
            candidates = [root] if (root / ADAPTER_CONFIG).is_file() else (
                sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
            for folder in candidates:
                folder = folder.resolve()
                if folder in seen or not self._inside_roots(folder) or not (folder / ADAPTER_CONFIG).is_file():
                    continue
                seen.add(folder)
                row: dict[str, Any] = {"id": folder.name, "path": str(folder),
                                       "mounted": mounted_paths.get(str(folder))}
                try:
                    config = read_adapter_config(folder)
                    params = config["lora_parameters"]
                    row.update(rank=int(params["rank"]), scale=float(params["scale"]),
                               base_model=config.get("model"), error=None)
                except InvalidRequest as exc:
                    row.update(rank=None, scale=None, base_model=None, error=exc.message)
                found.append(row)
        return found

    def confine(self, path: str) -> Path:
        """The folder ``path`` names (``~`` expanded, symlinks resolved), if it lies under one
        of the adapter roots.

        :raises InvalidRequest: a NUL byte, no root configured, or a folder outside every root
            (one text for existing and missing paths alike).
        """
        if "\x00" in path:
            raise InvalidRequest("adapter path may not contain a NUL byte", param="path", code="invalid_adapter")
        if not self.dirs:
            raise InvalidRequest("this server mounts adapters only at start: mounting by path needs --adapter-dir "
                                 "(the folders adapters may be mounted from)", param="path",
                                 code="adapter_path_not_allowed")
        refused = InvalidRequest("adapter path is not inside an adapter folder of this server (--adapter-dir)",
                                 param="path", code="adapter_path_not_allowed")
        try:
            folder = Path(path).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # a symlink loop, an unknown ~user
            raise refused from None
        if self._inside_roots(folder):
            return folder
        raise refused

    def _inside_roots(self, folder: Path) -> bool:
        """Whether the resolved ``folder`` lies under a resolved adapter root."""
        for root in self.dirs:
            try:
                if folder.is_relative_to(root.resolve()):
                    return True
            except (OSError, RuntimeError):
                continue
        return False

    # -- worker thread -----------------------------------------------------------------------

    def mount(self, model: Any, adapter_id: str, path: str | Path, owner: str = "") -> Adapter:
        """Validate ``path`` against ``model`` and mount it as ``owner``'s ``adapter_id``.

        :raises InvalidRequest: a bad id, an id or a folder ``owner`` already has mounted, a
            folder that is not an mlx-lm adapter, tensors that name no linear layer of the model
            or whose shapes do not fit it (every problem is listed).
        """
        import mlx.core as mx
        from mlx.utils import tree_unflatten

        if not adapter_id or _BAD_ID.search(adapter_id) or adapter_id.lower() in NO_ADAPTER:
            raise InvalidRequest(f"adapter id {adapter_id!r} may not be empty, \"none\", or contain '+', ',', "
                                 "'/' or spaces", param="id", code="invalid_adapter")
        if qualified(owner, adapter_id) in self._mounted:
            raise InvalidRequest(f"adapter \"{adapter_id}\" is already mounted; unmount it first", param="id",
                                 code="adapter_exists")
        folder = Path(path).expanduser().resolve()
        again = next((a for a in self._mounted.values() if a.owner == owner and a.path == str(folder)), None)
        if again is not None:  # one folder, one mount: another id would only double its memory
            raise InvalidRequest(f"adapter folder {folder} is already mounted as \"{again.id}\"; use that id, or "
                                 "unmount it first", param="path", code="adapter_exists")
        config = read_adapter_config(folder)
        rank = int(config["lora_parameters"]["rank"])
        scale = float(config["lora_parameters"]["scale"])
        try:
            weights = mx.load(str(folder / ADAPTER_WEIGHTS))
        except Exception as exc:
            raise InvalidRequest(f"{folder / ADAPTER_WEIGHTS}: cannot be read ({exc})", param="path",
                                 code="invalid_adapter") from None
        modules = dict(model.named_modules())
        pairs: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        for key in sorted(weights):
            layer, _, leaf = key.rpartition(".")
            if leaf not in ("lora_a", "lora_b"):
                errors.append(f"{key}: not a LoRA tensor (expected <layer>.lora_a / <layer>.lora_b)")
                continue
            pairs.setdefault(layer, {})[leaf] = weights[key]
        deltas: dict[str, tuple[Any, Any]] = {}
        for layer, pair in pairs.items():
            module = modules.get(layer)
            base = module.base if _LORA_HOST is not None and isinstance(module, _LORA_HOST) else module
            dims = _linear_dims(base) if base is not None else None
            if dims is None:
                errors.append(f"{layer}: unknown layer key — the model has no linear layer there")
                continue
            if set(pair) != {"lora_a", "lora_b"}:
                errors.append(f"{layer}: adapter has only one of lora_a/lora_b")
                continue
            a, b = pair["lora_a"], pair["lora_b"]
            inp, out = dims
            if a.ndim != 2 or b.ndim != 2 or a.shape != (inp, rank) or b.shape != (rank, out):
                errors.append(f"{layer}: shape mismatch — lora_a {list(a.shape)} / lora_b {list(b.shape)} vs "
                              f"base [in {inp}, out {out}] at rank {rank}; was this adapter trained for a "
                              "different base model?")
                continue
            deltas[layer] = (a, b)  # kept in the file's dtype, as mlx-lm's LoRALinear keeps them
        if not errors and not deltas:
            errors.append("no tensors match the model's linear layers")
        if errors:
            raise InvalidRequest(f"adapter \"{adapter_id}\" at {folder} does not fit the served model: "
                                 + "; ".join(errors), param="path", code="invalid_adapter")
        mx.eval([t for pair in deltas.values() for t in pair])
        wrap = []
        for layer in deltas:
            if layer not in self._slots:
                self._slots[layer] = _Slot()
                wrap.append((layer, LoRAHost(modules[layer], self._slots[layer], self.selection)))
        if wrap:
            model.update_modules(tree_unflatten(wrap))
        self._mounts += 1
        key = f"{adapter_id}#{self._mounts}"
        for layer, (a, b) in deltas.items():
            self._slots[layer].deltas[key] = (a, b, scale)
        adapter = Adapter(
            id=adapter_id, key=key, path=str(folder), rank=rank, scale=scale, layers=tuple(sorted(deltas)),
            size_bytes=sum(a.nbytes + b.nbytes for a, b in deltas.values()),
            base_model=config.get("model") if isinstance(config.get("model"), str) else None, owner=owner,
        )
        self._mounted = {**self._mounted, qualified(owner, adapter_id): adapter}
        return adapter

    def unmount(self, adapter_id: str, in_use: Iterable[str] = (), owner: str = "") -> Adapter:
        """Make ``owner``'s ``adapter_id`` unselectable (another caller's is not found); its
        arrays go now, or when the rows in ``in_use`` (mount keys of running rows) no longer
        need them (:meth:`release`)."""
        name = qualified(owner, adapter_id)
        adapter = self._mounted.get(name)
        if adapter is None:
            raise NotFound(f"adapter {adapter_id} not mounted", param="id", code="adapter_not_found")
        self._mounted = {k: v for k, v in self._mounted.items() if k != name}
        if name in self.default:
            self.default = ()
        self._retiring.add(adapter.key)
        self.release(in_use)
        return adapter

    def release(self, in_use: Iterable[str]) -> None:
        """Drop the arrays of unmounted adapters no running row uses any more."""
        if not self._retiring:
            return
        busy = set(in_use)
        for key in [r for r in self._retiring if r not in busy]:
            for slot in self._slots.values():
                slot.deltas.pop(key, None)
            self._retiring.discard(key)

    @contextmanager
    def select(self, names: Sequence[str]) -> Iterator[None]:
        """Apply mount keys ``names`` to every row of the model calls inside the block (serial lane)."""
        self.selection.active = tuple((n, None) for n in names)
        try:
            yield
        finally:
            self.selection.active = ()

    def select_rows(self, rows: Sequence[Sequence[str]]) -> None:
        """Per-row selection for the next batched call: ``rows[i]`` is row i's mount keys."""
        wanted = sorted({n for names in rows for n in names})
        if not wanted:
            self.selection.active = ()
            return
        if all(tuple(r) == tuple(rows[0]) for r in rows):
            self.selection.active = tuple((n, None) for n in rows[0])
            return
        import mlx.core as mx

        active = []
        for name in wanted:
            mask = mx.array([1.0 if name in names else 0.0 for names in rows]).reshape(len(rows), 1, 1)
            active.append((name, mask))
        self.selection.active = tuple(active)


def adapter_id_for(path: str | Path) -> str:
    """The id a folder mounts under by default: its base name."""
    return os.path.basename(str(path).rstrip("/\\")) or "adapter"
