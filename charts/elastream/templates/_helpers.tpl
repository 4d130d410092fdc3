{{/*
Names and labels shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "elastream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the operator's resources: fullnameOverride, else the release name when it contains the chart
name, else "<release>-<chart>". Truncated to 63 characters (a DNS label).
*/}}
{{- define "elastream.fullname" -}}
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

{{/* "<chart>-<version>" for the helm.sh/chart label. */}}
{{- define "elastream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels. Call with (dict "context" $ "component" "operator").
*/}}
{{- define "elastream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "elastream.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Common labels. Call with (dict "context" $ "component" "operator").
*/}}
{{- define "elastream.labels" -}}
{{ include "elastream.selectorLabels" . }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
helm.sh/chart: {{ include "elastream.chart" .context }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "elastream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "elastream.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* kopf peering (more than one operator replica) or standalone. */}}
{{- define "elastream.peering" -}}
{{- if gt (int .Values.operator.replicas) 1 }}true{{ end }}
{{- end }}

{{/* The bundled Redis' StatefulSet, Service and Secret: "<release>-redis". */}}
{{- define "elastream.redisName" -}}
{{- printf "%s-redis" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret holding the Redis URL the operator reads (ELASTREAM_REDIS_URL), and its key. */}}
{{- define "elastream.redisSecretName" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecret }}
{{- else }}
{{- include "elastream.redisName" . }}
{{- end }}
{{- end }}

{{- define "elastream.redisSecretKey" -}}
{{- if and (not .Values.redis.enabled) .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecretKey | default "url" }}
{{- else }}url{{ end }}
{{- end }}

{{/* Checks across values that the schema cannot express; fails the render with what to set. */}}
{{- define "elastream.validateValues" -}}
{{- if not .Values.redis.enabled }}
{{- if and .Values.redis.external.url .Values.redis.external.existingSecret }}
{{- fail "redis.external: set either url or existingSecret, not both" }}
{{- end }}
{{- if not (or .Values.redis.external.url .Values.redis.external.existingSecret) }}
{{- fail "redis.enabled is false: set redis.external.url (the chart keeps it in a Secret) or redis.external.existingSecret (a Secret you made, key redis.external.existingSecretKey)" }}
{{- end }}
{{- end }}
{{- end }}
