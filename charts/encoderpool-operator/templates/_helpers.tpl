{{/*
Names are cut to 63 characters because Kubernetes names of many kinds (and every label value)
are DNS-1123 labels of at most 63; a long release name would otherwise make the install fail.
The trailing "-" a cut can leave is trimmed, since a name must end with an alphanumeric.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "encoderpool-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "encoderpool-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart label value: name-version, "+" is not allowed in labels. */}}
{{- define "encoderpool-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels the selector uses (immutable once installed: never add to these). */}}
{{- define "encoderpool-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "encoderpool-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the chart. */}}
{{- define "encoderpool-operator.labels" -}}
helm.sh/chart: {{ include "encoderpool-operator.chart" . }}
{{ include "encoderpool-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: encoderpool
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "encoderpool-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "encoderpool-operator.fullname" .) .Values.serviceAccount.name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The full name plus a suffix, still at most 63 characters: the full name is cut first.
     Usage: include "encoderpool-operator.suffixed" (list . "-leader-election") */}}
{{- define "encoderpool-operator.suffixed" -}}
{{- $ctx := index . 0 }}{{- $suffix := index . 1 }}
{{- printf "%s%s" (include "encoderpool-operator.fullname" $ctx | trunc (int (sub 63 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{/* An alert's runbook annotations: always where it is documented, and runbook_url when
     metrics.prometheusRule.runbookBaseURL is set. Usage: include "encoderpool-operator.runbook" (list .Values.metrics.prometheusRule "anchor") */}}
{{- define "encoderpool-operator.runbook" -}}
{{- $rule := index . 0 }}{{- $anchor := index . 1 -}}
runbook: docs/observability.md#{{ $anchor }}
{{- with $rule.runbookBaseURL }}
runbook_url: {{ printf "%s#%s" (trimSuffix "/" .) $anchor }}
{{- end }}
{{- end }}
