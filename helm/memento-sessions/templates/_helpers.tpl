{{/* Chart name, at most 63 characters. */}}
{{- define "memento.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: the release name, with the chart name unless the release already holds it. */}}
{{- define "memento.fullname" -}}
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

{{- define "memento.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "memento.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memento.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "memento.labels" -}}
helm.sh/chart: {{ include "memento.chart" . }}
{{ include "memento.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "memento.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memento.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "memento.secretName" -}}
{{- default (include "memento.fullname" .) .Values.existingSecret }}
{{- end }}

{{/* MEMENTO_REDIS_URL: redis+cluster://[:password@]host:port,... for a Cluster, else redis.url. */}}
{{- define "memento.redisUrl" -}}
{{- if .Values.redis.cluster.enabled }}
{{- if not .Values.redis.cluster.nodes }}
{{- fail "redis.cluster.enabled needs redis.cluster.nodes (host:port of the primaries)" }}
{{- end }}
{{- $auth := "" }}
{{- if .Values.redis.cluster.password }}
{{- $auth = printf ":%s@" (.Values.redis.cluster.password | urlquery) }}
{{- end }}
{{- printf "redis+cluster://%s%s" $auth (join "," .Values.redis.cluster.nodes) }}
{{- else }}
{{- required "redis.url is required (redis:// or rediss://)" .Values.redis.url }}
{{- end }}
{{- end }}

{{/* MEMENTO_FALKORDB_URL: required apart from a Redis Cluster, since FalkorDB is never one. */}}
{{- define "memento.falkordbUrl" -}}
{{- if and .Values.redis.cluster.enabled (not .Values.falkordb.url) }}
{{- fail "redis.cluster.enabled needs falkordb.url: FalkorDB runs as a standalone server beside the Cluster" }}
{{- end }}
{{- .Values.falkordb.url }}
{{- end }}

{{/* Host names /mcp accepts: the Service's in-cluster names plus mcpAllowedHosts. */}}
{{- define "memento.mcpAllowedHosts" -}}
{{- $svc := include "memento.fullname" . }}
{{- $port := int .Values.service.port }}
{{- $hosts := list $svc (printf "%s:%d" $svc $port) (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s:%d" $svc .Release.Namespace $port) (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc:%d" $svc .Release.Namespace $port) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local:%d" $svc .Release.Namespace $port) }}
{{- range .Values.ingress.hosts }}
{{- if and $.Values.ingress.enabled .host }}
{{- $hosts = append $hosts .host }}
{{- end }}
{{- end }}
{{- join "," (uniq (concat $hosts .Values.mcpAllowedHosts)) }}
{{- end }}

{{/* Refuse values the daemon cannot honour. */}}
{{- define "memento.validate" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add 10 (int .Values.preStopSeconds) | int) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStopSeconds (%d) + 10: the daemon takes up to 10 s to close connections and flush checkpoints" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSeconds)) }}
{{- end }}
{{- if and .Values.auth.requireSecret (not .Values.existingSecret) (not .Values.auth.secret) }}
{{- fail "auth.requireSecret: set existingSecret or auth.secret. Without either the chart generates the auth secret, and a `helm template` render (Argo CD, Flux) cannot look up the one it made before: every render makes a new one, every pod rolls and every token dies at each sync" }}
{{- end }}
{{- if and .Values.ingress.enabled (not .Values.ingress.hosts) }}
{{- fail "ingress.enabled needs ingress.hosts (host and paths)" }}
{{- end }}
{{- if and .Values.auth.secret (lt (len .Values.auth.secret) 32) }}
{{- fail "auth.secret must be 32 characters or more" }}
{{- end }}
{{- end }}
