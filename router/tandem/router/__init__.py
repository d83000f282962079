"""Tandem's OpenAI-compatible gateway (`tandem router`).

Package map, outermost first (the composition root is `tandem.router.app.create_app`):

- `app`, `routes`, `middleware`: the HTTP shell (FastAPI wiring, request ids, per-request metrics).
- `gateway`: one generation request end to end: P/D decision, prefill, decode, reply.
- `disagg` (prefill step) and `handoff` (pure body rewrites): the P/D protocol.
- `dispatch` (pick + retry), `proxy` (httpx I/O and exception translation), `relay` (streams).
- `discovery` → `endpoints` (registry: rotation, in-flight, failures) → `scheduling` (pure policies).
- `catalog` (`/v1/models`), `metrics`, `settings`, `errors`, `types`.

This file stays import-free so `tandem.router.scheduling` can be imported without the web stack.
"""
