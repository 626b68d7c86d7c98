{{/* Names, labels and images, defined once. */}}

{{- define "modelswap.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelswap.fullname" -}}
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

{{- define "modelswap.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "modelswap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "modelswap.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelswap.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Operator */}}
{{- define "modelswap.operator.name" -}}
{{- printf "%s-operator" (include "modelswap.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelswap.operator.selectorLabels" -}}
{{ include "modelswap.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "modelswap.operator.serviceAccountName" -}}
{{- default (include "modelswap.operator.name" .) .Values.operator.serviceAccount.name }}
{{- end }}

{{/* Node pods */}}
{{- define "modelswap.node.name" -}}
{{- printf "%s-node" (include "modelswap.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "modelswap.node.selectorLabels" -}}
{{ include "modelswap.selectorLabels" . }}
app.kubernetes.io/component: node
{{- end }}

{{- define "modelswap.node.serviceAccountName" -}}
{{- default (include "modelswap.node.name" .) .Values.node.serviceAccount.name }}
{{- end }}

{{/* One pool's resource name: <fullname>-node-<pool>. Expects (dict "root" $ "pool" $pool). */}}
{{- define "modelswap.pool.name" -}}
{{- printf "%s-%s" (include "modelswap.node.name" .root) .pool.name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The image reference; the tag defaults to the chart's appVersion (= pyproject.toml's version). */}}
{{- define "modelswap.image" -}}
{{- $image := .image -}}
{{- $registry := .root.Values.image.registry -}}
{{- $ref := printf "%s:%s" $image.repository (default .root.Chart.AppVersion $image.tag) -}}
{{- if $image.digest }}{{ $ref = printf "%s@%s" $ref $image.digest }}{{ end -}}
{{- if $registry }}{{ printf "%s/%s" (trimSuffix "/" $registry) $ref }}{{ else }}{{ $ref }}{{ end -}}
{{- end }}

{{/* A size ("512Mi", "16Gi", "1Ti") in MiB, for sums the chart must do itself. */}}
{{- define "modelswap.mebibytes" -}}
{{- $s := toString . -}}
{{- if hasSuffix "Ti" $s }}{{ mul (trimSuffix "Ti" $s | atoi) 1048576 }}
{{- else if hasSuffix "Gi" $s }}{{ mul (trimSuffix "Gi" $s | atoi) 1024 }}
{{- else if hasSuffix "Mi" $s }}{{ trimSuffix "Mi" $s | atoi }}
{{- else }}{{ fail (printf "size %q: use a whole number of Mi, Gi or Ti" $s) }}
{{- end }}
{{- end }}

{{/* One pool's settings: the pool's own keys over .Values.node's. Expects (dict "root" $ "pool" $pool). */}}
{{- define "modelswap.pool.settings" -}}
{{- $node := .root.Values.node -}}
{{- $pool := .pool -}}
{{- $out := dict
  "backend" (default $node.backend $pool.backend)
  "hostStorePerGpu" (default $node.hostStorePerGpu $pool.hostStorePerGpu)
  "hbmReservePerGpu" (default $node.hbmReservePerGpu $pool.hbmReservePerGpu)
  "memoryOverhead" (default $node.memoryOverhead $pool.memoryOverhead)
  "simGpuCapacity" (default $node.simGpuCapacity $pool.simGpuCapacity)
  "gpus" $pool.gpus
  "dra" (and $pool.dra $pool.dra.enabled)
-}}
{{- toYaml $out }}
{{- end }}
