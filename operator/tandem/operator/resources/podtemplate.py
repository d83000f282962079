"""Merging a user's pod template onto a pod the operator built. Pure.

The rules, as Kubernetes' strategic merge and Dynamo's `podTemplate` apply them:
- maps are merged key by key (labels, annotations, nodeSelector, resources, securityContext, ...);
- lists whose items all carry a `name` (containers, initContainers, volumes, env, volumeMounts,
  imagePullSecrets, ports) are merged by name: an item of the template whose name the operator's
  list has takes its place (containers and init containers are merged into it, field by field;
  any other item replaces it whole, so `env` may swap `value` for `valueFrom`), and new items are
  appended in the template's order (sidecars, extra volumes);
- any other list (tolerations, topologySpreadConstraints, args) and every scalar is replaced.

    merge({"containers": [{"name": "engine", "image": "v", "env": [{"name": "A", "value": "1"}]}]},
          {"containers": [{"name": "engine", "env": [{"name": "B", "value": "2"}]}, {"name": "proxy"}]})
    → {"containers": [{"name": "engine", "image": "v", "env": [A=1, B=2]}, {"name": "proxy"}]}

What the template may not touch is refused before this runs (`tandem.core.podtemplate.template_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tandem.core.podtemplate import PodTemplate

#: Lists whose named items are merged field by field rather than replaced.
DEEP_MERGED = frozenset({"containers", "initContainers"})


def merge(base: Any, overlay: Any, *, key: str = "") -> Any:
    """`overlay` merged onto `base` (module docstring); `key` is the field both sit under. Neither
    argument is modified."""
    if isinstance(base, Mapping) and isinstance(overlay, Mapping):
        merged = dict(base)
        for name, value in overlay.items():
            merged[name] = merge(base[name], value, key=name) if name in base else _copy(value)
        return merged
    if isinstance(base, list) and isinstance(overlay, list) and _named(base) and _named(overlay):
        return _merge_named(base, overlay, deep=key in DEEP_MERGED)
    return _copy(overlay)


def _named(items: Sequence[Any]) -> bool:
    return all(isinstance(item, Mapping) and "name" in item for item in items)


def _merge_named(base: list[Any], overlay: list[Any], *, deep: bool) -> list[Any]:
    merged = [dict(item) for item in base]
    index = {item["name"]: i for i, item in enumerate(merged)}
    for item in overlay:
        at = index.get(item["name"])
        if at is None:
            index[item["name"]] = len(merged)
            merged.append(_copy(item))
        else:
            merged[at] = merge(merged[at], item) if deep else _copy(item)
    return merged


def apply_templates(pod: Mapping[str, Any], templates: Sequence[PodTemplate | None]) -> dict[str, Any]:
    """The pod template (`{"metadata": ..., "spec": ...}`) with each of `templates` merged onto it in
    order (shared first, then the pool's); None entries are skipped."""
    result: dict[str, Any] = dict(pod)
    for template in templates:
        if template is not None:
            result = merge(result, template.document())
    return result


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
