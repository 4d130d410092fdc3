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

{{/*
The Lease the operator takes with operator.leaderElection.enabled, in the release namespace (a fixed name: the
operator's own default; it creates the Lease when it is missing).
*/}}
{{- define "elastream.leaseName" -}}elastream-operator{{- end }}

{{/*
The namespaces the operator watches, as a JSON list (read it with `include ... | fromJsonArray`): empty for every
namespace. operator.watchNamespaces wins; else operator.watchNamespace, the one-namespace form of chart 0.1 (a string,
or a list as watchNamespaces is).
*/}}
{{- define "elastream.watchNamespaces" -}}
{{- $single := .Values.operator.watchNamespace }}
{{- if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | toJson }}
{{- else if kindIs "string" $single }}
{{- compact (list $single) | toJson }}
{{- else }}
{{- $single | default (list) | toJson }}
{{- end }}
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

{{/* Whether the bundled Redis serves TLS. */}}
{{- define "elastream.redisTLS" -}}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled }}true{{ end }}
{{- end }}

{{/* The Secret with the bundled Redis' tls.crt, tls.key and ca.crt: redis.tls.existingSecret or "<release>-redis-tls". */}}
{{- define "elastream.redisTLSSecretName" -}}
{{- .Values.redis.tls.existingSecret | default (printf "%s-tls" (include "elastream.redisName" . | trunc 59 | trimSuffix "-")) }}
{{- end }}

{{/* The DNS names the bundled Redis' certificate holds: its Service's names, and localhost for redis-cli in its pod. */}}
{{- define "elastream.redisDNSNames" -}}
{{- $name := include "elastream.redisName" . }}
{{- $ns := .Release.Namespace }}
{{- list $name (printf "%s.%s" $name $ns) (printf "%s.%s.svc" $name $ns) (printf "%s.%s.svc.cluster.local" $name $ns) "localhost" | toJson }}
{{- end }}

{{/* Where the operator finds the CA that signed Redis' certificate (named in the URL: ssl_ca_certs). */}}
{{- define "elastream.redisCAPath" -}}/etc/elastream/redis-tls/ca.crt{{- end }}

{{/* A Prometheus duration (1h30m, 15s, 500ms; the values schema checks the form) in milliseconds. */}}
{{- define "elastream.durationMs" -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+(ms|[smhdwy])" . -1 }}
{{- $unit := regexFind "(ms|[smhdwy])$" . }}
{{- $total = add $total (mul (trimSuffix $unit . | int64) (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/* Checks across values that the schema cannot express; fails the render with what to set. */}}
{{- define "elastream.validateValues" -}}
{{- $election := .Values.operator.leaderElection }}
{{- if and (gt (int .Values.operator.replicas) 1) (not $election.enabled) }}
{{- fail (printf "operator.replicas is %d: more than one operator replica needs operator.leaderElection.enabled=true (only the Lease holder works)" (int .Values.operator.replicas)) }}
{{- end }}
{{- if $election.enabled }}
{{- if ge (int $election.renewDeadlineSeconds) (int $election.leaseDurationSeconds) }}
{{- fail (printf "operator.leaderElection: renewDeadlineSeconds (%d) must be less than leaseDurationSeconds (%d)" (int $election.renewDeadlineSeconds) (int $election.leaseDurationSeconds)) }}
{{- end }}
{{- if le (mul 10 (int $election.renewDeadlineSeconds)) (mul 12 (int $election.retryPeriodSeconds)) }}
{{- fail (printf "operator.leaderElection: renewDeadlineSeconds (%d) must be more than 1.2 x retryPeriodSeconds (%d)" (int $election.renewDeadlineSeconds) (int $election.retryPeriodSeconds)) }}
{{- end }}
{{- end }}
{{- if and .Values.networkPolicy.enabled .Values.spark.master (not .Values.networkPolicy.sparkFrom) }}
{{- fail "spark.master is set: its executors connect back to the operator (the Spark driver), which networkPolicy.enabled closes; set networkPolicy.sparkFrom to their pods or namespace, or networkPolicy.enabled=false" }}
{{- end }}
{{- if and (include "elastream.redisTLS" .) .Values.redis.tls.existingSecret .Values.redis.tls.certManager.enabled }}
{{- fail "redis.tls: set either existingSecret (your own certificate) or certManager.enabled (cert-manager issues one), not both" }}
{{- end }}
{{- range $name, $monitor := pick .Values.metrics "serviceMonitor" "podMonitor" }}
{{- if and $monitor.enabled $monitor.interval $monitor.scrapeTimeout }}
{{- if gt (include "elastream.durationMs" $monitor.scrapeTimeout | int64) (include "elastream.durationMs" $monitor.interval | int64) }}
{{- fail (printf "metrics.%s: scrapeTimeout (%s) is longer than interval (%s), which Prometheus refuses; shorten scrapeTimeout or lengthen interval" $name $monitor.scrapeTimeout $monitor.interval) }}
{{- end }}
{{- end }}
{{- end }}
{{- if not .Values.redis.enabled }}
{{- if and .Values.redis.external.url .Values.redis.external.existingSecret }}
{{- fail "redis.external: set either url or existingSecret, not both" }}
{{- end }}
{{- if not (or .Values.redis.external.url .Values.redis.external.existingSecret) }}
{{- fail "redis.enabled is false: set redis.external.url (the chart keeps it in a Secret) or redis.external.existingSecret (a Secret you made, key redis.external.existingSecretKey)" }}
{{- end }}
{{- end }}
{{- end }}
