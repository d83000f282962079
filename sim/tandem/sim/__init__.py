"""`tandem sim`: a vLLM-compatible engine simulator.

`tandem.sim.engine` is the pure core (profiles, the roofline time model, paged KV blocks with prefix
caching, the continuous-batching scheduler, deterministic generation) driven by an injected clock.
The modules beside it are the I/O shell: the FastAPI app, Prometheus metrics and the Redis KV pool.
"""
