{{/*
The operator's permissions on pools, their children and pods: exactly what it uses
(operator/encoderpool_operator/rbac.py lists each rule and why; a chart test checks that the
rendered rules match that table). Granted by a ClusterRole, or with watchNamespaces by a Role in
each watched namespace.
*/}}
{{- define "encoderpool-operator.rules" -}}
# kopf watches pools and keeps its progress in their annotations; reconcile reads each pool afresh.
- apiGroups: [encoderpool.io]
  resources: [encoderpools]
  verbs: [get, list, watch, patch]
# Status is written only through the subresource.
- apiGroups: [encoderpool.io]
  resources: [encoderpools/status]
  verbs: [patch]
# Children carry blockOwnerDeletion, checked against this by OwnerReferencesPermissionEnforcement.
- apiGroups: [encoderpool.io]
  resources: [encoderpools/finalizers]
  verbs: [update]
# Server-side apply (create when absent, dry run first), the watch cache and drift detection.
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch]
# Deleted and re-created when a hand edit (a port changed in place) cannot be applied over.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# The PodDisruptionBudget exists only while replicas > 1 or autoscaling is on, so it is also deleted.
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# The HorizontalPodAutoscaler of spec.autoscaling, deleted when autoscaling is turned off.
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
# The watch cache status is computed from; pod events trigger a status refresh.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# Events on pools, by the operator and by kopf.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
