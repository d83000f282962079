"""The kopf operator for InferenceService resources (`tandem operator`).

Pure core (no Kubernetes client, checked by import-linter):
- `resources`: builders, one module per child kind: spec in, manifests out;
- `crd` / `reference`: the CRD's structural schema and its docs table, generated from the spec model;
- `diff`: the merge patch that makes a live object cover a desired one;
- `status`: conditions and phase from what the Deployments report;
- `reconcile`: one level-triggered pass over a `cluster.Cluster`.
Shell: `kube` (the Cluster over Tandem's Kubernetes client, `tandem.core.kubeaccess`) and `handlers`
(kopf registration).
"""
