#!/usr/bin/env bash
# Regenerates every committed copy of the InferenceService and InferenceGateway CRDs from their
# spec models (tandem.core.spec, tandem.core.gateway): the chart's crds/, the kustomize base, and the
# field references in docs/operator.md. Run it after changing a spec model; tests/operator fails
# until it is run.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/tandem crd > charts/tandem/crds/inferenceservices.tandem.dev.yaml
.venv/bin/tandem crd > deploy/kustomize/base/crd.yaml
.venv/bin/tandem crd --gateway > charts/tandem/crds/inferencegateways.tandem.dev.yaml
.venv/bin/tandem crd --gateway > deploy/kustomize/base/crd-gateway.yaml
.venv/bin/python - <<'PY'
from pathlib import Path

from tandem.operator.reference import MARKERS, reference_markdown

doc = Path("docs/operator.md")
text = doc.read_text()
for kind, (begin, end) in MARKERS.items():
    start, stop = text.index(begin), text.index(end) + len(end) + 1
    text = text[:start] + reference_markdown(kind) + text[stop:]
doc.write_text(text)
PY
echo "regenerated: charts/tandem/crds/, deploy/kustomize/base/crd*.yaml, docs/operator.md (references)"
