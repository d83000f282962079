"""Admission control in front of dispatch: who may go now, who waits, who is turned away (429).

- `policy` (pure): budgets, honest early rejection, Retry-After, the drain meter, the
  `TTFTPredictor` seam and its conservative default `NoPrediction`.
- `gate` (asyncio, no I/O): `AdmissionGate` over the fair queue (`tandem.router.admission.fairness`),
  `Grant` (a request's unit of capacity and its tenant's charges; handed over near its end).
- `access`: API keys → tenants, the rate limiter (`ratelimit`, pure), priority bands, their metrics.
- `metrics`: the admission and per-tenant metrics, with bounded tenant labels.
"""
