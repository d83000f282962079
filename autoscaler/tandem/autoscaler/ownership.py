"""Whether a pool's workload belongs to its InferenceService, checked before the autoscaler scales it.

The autoscaler finds a pool's workload (a Deployment, or a LeaderWorkerSet for a multi-node pool; "the
Deployment" below stands for either) by name (`<service>-<pool>` in the service's namespace), and
a name proves nothing: whoever may create Deployments there can make one by that name, or the name
may be taken by a workload that has nothing to do with Tandem. So before a scale patch,
`OwnerCheck.verify` requires an `ownerReferences` entry of `kind: InferenceService` whose uid is the
service's (`tandem.autoscaler.cluster.owners_of`). Otherwise it refuses: no patch, a warning log line
naming the service and the Deployment, `refused(ref, pool)` (the composition root counts it in
`tandem_autoscaler_scale_refused_total`), and `ScaleRefused` raised, so the round records no scale
action and no Event.

The scale subresource carries the Deployment's uid but not its ownerReferences, so the Deployment is
read whole (`GET deployments/<name>`) once per Deployment uid: the verdict is kept per (namespace,
name) with the uid it was made for, and made again when the scale subresource shows another uid (the
Deployment was deleted and created again). The patch carries the checked uid as a precondition, so a
Deployment replaced between the check and the patch is not scaled either (the API server answers 409).
Example: one Deployment scaled ten times in an hour: one GET of it in all; deleted and created again
by someone: the next scale reads it again. A change of ownerReferences alone (same uid) is not seen:
it takes the right to edit the Deployment, which is the right to scale it anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.autoscaler.cluster import (
    DEPLOYMENT,
    ClusterAPI,
    Owners,
    ScaleRefused,
    ServiceRef,
    WorkloadKind,
    owners_of,
)
from tandem.core.endpointslices import pool_workload_name

log = logging.getLogger(__name__)


def _not_counted(ref: ServiceRef, pool: str) -> None:
    return None


@dataclass(kw_only=True)
class OwnerCheck:
    """The ownership verdicts of every autoscaled pool's Deployment (module docstring); one per
    process, shared by the pools' actuators."""

    cluster: ClusterAPI
    #: Called once per refused scale with the service and the pool (the refusal counter).
    refused: Callable[[ServiceRef, str], None] = _not_counted
    #: (namespace, Deployment name) → the owners found the last time it was read whole.
    known: dict[tuple[str, str], Owners] = field(default_factory=dict)

    async def verify(
        self, ref: ServiceRef, *, pool: str, deployment: str, uid: str, kind: WorkloadKind = DEPLOYMENT
    ) -> str:
        """The uid of the workload `deployment` (of `kind`) once it is known to be `ref`'s, for the
        patch's precondition. `uid` is its uid as the scale subresource last showed it ("": unknown,
        read again). Raises `ScaleRefused` when `ref` does not own it, `ClusterError` when it cannot be
        read."""
        key = (ref.namespace, deployment)
        owners = self.known.get(key)
        if owners is None or not uid or owners.workload_uid != uid:
            owners = owners_of(await self.cluster.get_workload(ref.namespace, deployment, kind=kind))
            self.known[key] = owners
        if owners.include(ref):
            return owners.workload_uid
        self.refused(ref, pool)
        log.warning(
            f"{kind.kind.lower()} not owned by its InferenceService; not scaled",
            extra={
                "service": ref.key,
                "kind": kind.kind,
                "deployment": deployment,
                "pool": pool,
                "service_uid": ref.uid,
                "owner_uids": sorted(owners.services),
            },
        )
        raise ScaleRefused(
            f"{kind.kind.lower()} {ref.namespace}/{deployment} has no ownerReference to InferenceService "
            f"{ref.key} (uid {ref.uid or 'unknown'}): not scaled"
        )

    def observe(self, namespace: str, name: str, workload: Mapping[str, Any]) -> None:
        """Keep the owners of a workload read whole for another reason (a LeaderWorkerSet's status),
        so that `verify` need not read it again for the same uid."""
        self.known[(namespace, name)] = owners_of(workload)

    def forget(self, ref: ServiceRef) -> None:
        """Drop the verdicts on a service's pool Deployments (it is gone or no longer autoscaled)."""
        for pool in ("prefill", "decode"):
            self.known.pop((ref.namespace, pool_workload_name(ref.name, pool)), None)
