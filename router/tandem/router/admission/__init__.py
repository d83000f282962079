"""Admission control in front of dispatch: who may go now, who waits, who is turned away (429).

- `policy` (pure): saturation, capacity, deadlines, early rejection, Retry-After, the `TTFTPredictor`
  seam and its conservative default `NoPrediction`.
- `headers` (pure): tenant, SLO and priority from request headers; the `TenantResolver` seam.
- `gate` (asyncio, no I/O): `AdmissionGate` over the fair queue (`tandem.router.admission.fairness`), `Grant`.
- `meter`: charges a grant's tenant for the answer as it is relayed.
- `metrics`: the admission and per-tenant metrics, with bounded tenant labels.
"""
