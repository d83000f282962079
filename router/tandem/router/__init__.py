"""Tandem's OpenAI-compatible gateway (`tandem router`).

Package map, outermost first, in the order of the import-linter layers (pyproject.toml); the
composition root is `tandem.router.app.create_app` with `tandem.router.compose`:

- `app`, `compose`: the effective configuration in, every component built and started.
- `http`: the plain-ASGI shell for generation routes (`server`), FastAPI for the side routes (`side`).
- `pipeline`: a request's stages over its `RequestContext` (`stages` is the request's walk).
- `pd`: the P/D decision, the prefill step and the KV barrier; `upstream`: the engines' HTTP client,
  dispatch with retries, the relay, token counting.
- `admission`: the gate, the fair queues (`fairness`), rate limits and access; `observe`: metrics.
- `scheduling` (pure policies) → `discovery` (registry, capacity, scrapes, KV events) → `identity`
  (request ids, tenants, priority, API keys) → `request` (body parsing).
- `workers` (the bus between sibling processes, shared counters between replicas), `config`,
  `settings`, `errors`, `types`.

This file stays import-free so `tandem.router.scheduling` can be imported without the web stack.
"""
