# The two commands of the README: `make up` (run the local stack) and `make test` (run every check).
.PHONY: setup up test lint

setup:
	bash scripts/bootstrap.sh

up: setup
	.venv/bin/tandem up -f deploy/examples/local-sim.yaml

test:
	bash scripts/test.sh
