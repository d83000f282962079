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

from tandem.operator.objects import FieldPath

#: Metadata fields that identify an object or record ownership; never patched (ownership is
#: checked before any patch, and another owner reference someone added must survive).
IDENTITY = ("name", "namespace", "ownerReferences")


def covers(live: Any, desired: Any) -> bool:
    """True when `live` holds every field and value of `desired` (extra live fields allowed)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and covers(live[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(covers(a, b) for a, b in zip(live, desired, strict=True))
        )
    # bool is an int in Python; `true` must not cover `1`.
    return bool(live == desired) and isinstance(live, bool) == isinstance(desired, bool)


def merge_patch(live: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The smallest merge patch that makes `live` cover `desired`; `{}` when it already does."""
    patch: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key)
        if isinstance(want, Mapping) and isinstance(have, Mapping):
            nested = merge_patch(have, want)
            if nested:
                patch[key] = nested
        elif not covers(have, want) or key not in live:
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
    live: Mapping[str, Any], desired: Mapping[str, Any], *, create_only: Iterable[FieldPath] = ()
) -> dict[str, Any]:
    """The merge patch for an existing child: identity metadata and `create_only` fields excluded."""
    wanted = without(desired, [("metadata", key) for key in IDENTITY] + list(create_only))
    wanted.pop("apiVersion", None)
    wanted.pop("kind", None)
    return merge_patch(live, wanted)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
