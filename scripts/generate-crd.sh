#!/usr/bin/env bash
# Regenerates every committed copy of the InferenceService CRD from the spec model
# (tandem.core.spec): the chart's crds/, the kustomize base, and the field reference in
# docs/operator.md. Run it after changing the spec model; tests/operator fails until it is run.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/tandem crd > charts/tandem/crds/inferenceservices.tandem.dev.yaml
.venv/bin/tandem crd > deploy/kustomize/base/crd.yaml
.venv/bin/python - <<'PY'
from pathlib import Path

from tandem.operator.reference import BEGIN, END, reference_markdown

doc = Path("docs/operator.md")
text = doc.read_text()
start, end = text.index(BEGIN), text.index(END) + len(END) + 1
doc.write_text(text[:start] + reference_markdown() + text[end:])
PY
echo "regenerated: charts/tandem/crds/, deploy/kustomize/base/crd.yaml, docs/operator.md (reference)"
