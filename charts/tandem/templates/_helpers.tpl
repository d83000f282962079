{{/* Chart name, truncated to fit label values. */}}
{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object name prefix: <release>-tandem, or <release> when it already contains the chart name. */}}
{{- define "tandem.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The control-plane image reference. */}}
{{- define "tandem.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Labels of every object; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tandem
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end }}

{{/* Selector labels of one component; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* ServiceAccount name of one component; pass (dict "ctx" $ "component" "operator"). */}}
{{- define "tandem.serviceAccountName" -}}
{{- if .ctx.Values.serviceAccount.create }}
{{- printf "%s-%s" (include "tandem.fullname" .ctx) .component }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/* Namespaces the operator watches, as a JSON list; [] means every namespace. They are
operator.watchNamespaces when set; else every namespace with operator.clusterWide; else (the default)
the release's namespace only, so that a default install holds no cluster-wide right. */}}
{{- define "tandem.operatorNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | toJson }}
{{- else if .Values.operator.clusterWide }}
{{- list | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/* Namespaces whose pods may scrape engines and gateways through the NetworkPolicies the
operator renders: operator.metricsNamespaces, and the release's, where the operator (which reads the
engine pods' adapter sidecars) and the autoscaler (which scrapes the engines) run. */}}
{{- define "tandem.metricsNamespaces" -}}
{{- $namespaces := .Values.operator.metricsNamespaces | default list }}
{{- if not (has .Release.Namespace $namespaces) }}
{{- $namespaces = append $namespaces .Release.Namespace }}
{{- end }}
{{- $namespaces | toJson }}
{{- end }}

{{/* Namespaces the autoscaler watches, as a JSON list; [] means every namespace. It is
autoscaler.namespace when set (which must then be one the operator watches: the autoscaler only
scales pools the operator manages), else the operator's namespaces. */}}
{{- define "tandem.autoscalerNamespaces" -}}
{{- $watched := include "tandem.operatorNamespaces" . | fromJsonArray }}
{{- with .Values.autoscaler.namespace }}
{{- if and $watched (not (has . $watched)) }}
{{- fail (printf "autoscaler.namespace %q must be one of the operator's namespaces %v (operator.watchNamespaces, else the release's unless operator.clusterWide): the operator does not manage the pools of other namespaces" . $watched) }}
{{- end }}
{{- list . | toJson }}
{{- else }}
{{- $watched | toJson }}
{{- end }}
{{- end }}

{{/* Where each component the chart runs holds its rights, as JSON {component: namespaces}: a Role
and a RoleBinding in each of the namespaces, or, for [], a ClusterRole and a ClusterRoleBinding
(every namespace). docs/security.md, "Namespaced install". */}}
{{- define "tandem.rbacScopes" -}}
{{- $scopes := dict "operator" (include "tandem.operatorNamespaces" . | fromJsonArray) }}
{{- if .Values.autoscaler.enabled }}
{{- $_ := set $scopes "autoscaler" (include "tandem.autoscalerNamespaces" . | fromJsonArray) }}
{{- end }}
{{- $scopes | toJson }}
{{- end }}

{{/* The operator's rules on namespaced resources: its ClusterRole's, or its Role's in each watched
namespace. One YAML list item per rule, each with the comment saying what it is for. */}}
{{- define "tandem.operatorRules" -}}
# kopf lists and watches InferenceServices (every reconcile starts from a watch event, a resume
# or its timer) and patches them for its bookkeeping: the finalizer and its annotations
# (last-handled configuration, handler progress). `get` has no caller today (kopf reads
# through list and watch); it is the one read kept beyond need, see docs/security.md.
- apiGroups: [tandem.dev]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
# The status: conditions, replica counts, endpoint (kopf patches the status subresource; it
# never reads it separately, the watch delivers it).
- apiGroups: [tandem.dev]
  resources: [inferenceservices/status]
  verbs: [patch]
# Children carry an owner reference with blockOwnerDeletion, which the API server's
# OwnerReferencesPermissionEnforcement admission plugin allows only with this.
- apiGroups: [tandem.dev]
  resources: [inferenceservices/finalizers]
  verbs: [update]
# InferenceGateways: kopf lists and watches them (each gateway's reconcile starts from a watch
# event, a resume or its timer) and patches them for its bookkeeping; each reconcile of an
# InferenceService lists those of its namespace to find the one that serves it, and a changed
# InferenceService patches an annotation of the gateways it concerns so that they reconcile at once.
- apiGroups: [tandem.dev]
  resources: [inferencegateways]
  verbs: [list, watch, patch]
# A gateway's status: its conditions, models and services (the status subresource, as above).
- apiGroups: [tandem.dev]
  resources: [inferencegateways/status]
  verbs: [patch]
# A gateway's children carry an owner reference with blockOwnerDeletion (as above).
- apiGroups: [tandem.dev]
  resources: [inferencegateways/finalizers]
  verbs: [update]
# Children: the prefill, decode, Redis and router Deployments. Each reconcile gets each child
# by name (no list or watch), creates it if missing or patches what differs; delete: the
# reconcile prunes a child the spec no longer asks for (the managed Redis once an external
# Redis URL is given).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
# Children: the pool and router Services, the LMCache and router ConfigMaps, the router's
# ServiceAccount; verbs as for Deployments (pruned: the managed Redis's Service, the LMCache
# ConfigMap once engine.kind is sim).
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, create, patch, delete]
# Children: the router's Role and RoleBinding (read EndpointSlices in its own namespace);
# verbs as for Deployments (delete: the prune path covers every managed child).
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
# Children: the Secrets it generates (the managed Redis' password, the engines' API key), created
# once and never rotated by a reconcile. `get` also reads the Secrets a spec names, to refuse those
# without the label tandem.dev/usable: "true" before mounting them. No list or watch: the operator
# reads a Secret only by the name a spec gives.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch, delete]
# Children: the NetworkPolicies that leave open only the documented paths into the gateway,
# engine and Redis pods; verbs as for Deployments (pruned when spec.networkPolicy.enabled is off).
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
# Children: a PodDisruptionBudget per engine pool (spec.<pool>.maxUnavailable); verbs as for
# Deployments.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch, delete]
# Children: the LeaderWorkerSet of a multi-node engine pool (spec.<pool>.nodesPerReplica > 1),
# in place of its Deployment; verbs as for Deployments (pruned when the pool is single-node again).
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, create, patch, delete]
# Kubernetes lets the operator grant only what it holds itself (RBAC escalation prevention):
# the router's Role grants get/list/watch on EndpointSlices, so the operator holds them too.
# The operator itself never reads EndpointSlices.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
# Escalation prevention again: the router's Role grants list/watch on Pods (the engines'
# tandem.dev/kv-layout labels, which EndpointSlices do not carry), so the operator holds them too.
# The operator lists a service's engine pods itself for one thing: the adapters-fetch init
# containers' results (status.adapters of hf:// and s3:// adapters).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# status.adapters of pvc:// adapters: whether each named claim exists and is Bound. Read only.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get]
# Warning events on InferenceServices (invalid spec, blocked apply), posted through kopf.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/* The autoscaler's rules: its ClusterRole's, or its Role's in each namespace it watches. */}}
{{- define "tandem.autoscalerRules" -}}
# Which pools to scale, within which bounds, to which targets (spec.*.autoscaling): listed, then
# watched. No `get`: the autoscaler never reads one InferenceService by name.
- apiGroups: [tandem.dev]
  resources: [inferenceservices]
  verbs: [list, watch]
# status.autoscaling (desired, ready, reason, lastScaleTime, panic per pool), a merge patch.
- apiGroups: [tandem.dev]
  resources: [inferenceservices/status]
  verbs: [patch]
# A pool's replica count, and nothing else of its Deployment: read each round, patched on a
# decision that differs from it.
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch]
# A pool's Deployment read by name, once per Deployment uid, before it is first scaled: the scale
# subresource has no ownerReferences, and only a Deployment owned by the InferenceService is scaled.
# No list or watch.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get]
# A multi-node pool's replica count (nodesPerReplica > 1: groups of its LeaderWorkerSet), patched
# through the scale subresource on a decision that differs from it; nothing else of it is written.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets/scale]
  verbs: [patch]
# A multi-node pool's LeaderWorkerSet read by name, at most every few seconds: its replicas, ready
# groups (status.readyReplicas) and ownerReferences in one GET. No list or watch.
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get]
# The ready engine and gateway pods to scrape (the pool Services' EndpointSlices, as the router
# finds them): listed, then watched.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
# ScaledUp / ScaledDown Events on the InferenceService, one per scale action.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
