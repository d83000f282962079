"""What to send so that a live object matches a desired manifest: a minimal JSON merge patch.

"Matches" means the live object *covers* the desired one: every field we set has our value, while
fields we never set (server defaults such as `imagePullPolicy`, status, other controllers'
annotations) are left alone. Lists are compared element by element with the same rule and, when
they differ, replaced whole (RFC 7386 merge-patch semantics), which is what we want for the
containers, env and ports we own entirely. Pure.

    desired {"spec": {"replicas": 2, "template": {...}}}, live {"spec": {"replicas": 3, ...}}
    → {"spec": {"replicas": 2}}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tandem.core.quantity import parse_quantity
from tandem.operator.objects import FieldPath

#: Metadata fields that identify an object or record ownership; never patched (ownership is
#: checked before any patch, and another owner reference someone added must survive).
IDENTITY = ("name", "namespace", "ownerReferences")


def covers(live: Any, desired: Any, *, path: FieldPath = ()) -> bool:
    """True when `live` holds every field and value of `desired` (extra live fields allowed).

    `path` is where the two values sit in the object: the API server rewrites resource quantities
    in canonical form (`1024Mi` → `1Gi`, `0.5` → `500m`), so under `resources.requests` and
    `resources.limits` strings compare by amount.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and covers(live[key], value, path=(*path, key)) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(covers(a, b, path=path) for a, b in zip(live, desired, strict=True))
        )
    if _is_quantity_path(path) and isinstance(live, str | int) and isinstance(desired, str | int):
        return _same_amount(live, desired)
    # bool is an int in Python; `true` must not cover `1`.
    return bool(live == desired) and isinstance(live, bool) == isinstance(desired, bool)


def _is_quantity_path(path: FieldPath) -> bool:
    return len(path) >= 3 and path[-3] == "resources" and path[-2] in ("requests", "limits")


def _same_amount(live: str | int, desired: str | int) -> bool:
    try:
        return parse_quantity(str(live)) == parse_quantity(str(desired))
    except ValueError:
        return live == desired


def merge_patch(
    live: Mapping[str, Any], desired: Mapping[str, Any], *, path: FieldPath = ()
) -> dict[str, Any]:
    """The smallest merge patch that makes `live` cover `desired`; `{}` when it already does."""
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            nested = merge_patch(have, want, path=(*path, key))
            if nested:
                patch[key] = nested
        elif key not in live or not covers(have, want, path=(*path, key)):
            patch[key] = want
    return patch


def without(manifest: Mapping[str, Any], paths: Iterable[FieldPath]) -> dict[str, Any]:
    """A copy of `manifest` without the fields at `paths` (missing paths are ignored)."""
    result: dict[str, Any] = _copy(manifest)
    for path in paths:
        node: Any = result
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return result


def update_patch(
    live: Mapping[str, Any],
    desired: Mapping[str, Any],
    *,
    create_only: Iterable[FieldPath] = (),
    owned: Iterable[FieldPath] = (),
) -> dict[str, Any]:
    """The merge patch for an existing child: identity metadata and `create_only` fields excluded.

    `owned` fields are the operator's whole even where `desired` leaves them out (a pod template's
    `initContainers`, which only some specs have): a live value there that `desired` lacks is removed
    (`null` in the patch), and where both are maps, so are the live map's keys `desired` lacks (an
    engine pool Service's selector, which names the LeaderWorkerSet's leaders only while the pool is
    multi-node)."""
    wanted = without(desired, [("metadata", key) for key in IDENTITY] + list(create_only))
    wanted.pop("apiVersion", None)
    wanted.pop("kind", None)
    patch = merge_patch(live, wanted)
    for path in owned:
        have, want = _lookup(live, path), _lookup(desired, path)
        if have is not None and want is None:
            _set(patch, path, None)
        elif isinstance(have, Mapping) and isinstance(want, Mapping):
            for key in have.keys() - want.keys():  # a map owned whole: drop the keys no longer wanted
                _set(patch, (*path, key), None)
    return patch


def _set(patch: dict[str, Any], path: FieldPath, value: Any) -> None:
    node = patch
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _lookup(manifest: Mapping[str, Any], path: FieldPath) -> Any:
    """The value at `path`, or None where the path is missing."""
    node: Any = manifest
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
