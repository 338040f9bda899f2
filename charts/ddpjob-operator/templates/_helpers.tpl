{{/*
Chart name, overridable. Truncated to 63 characters: Kubernetes names and
label values are DNS labels.
*/}}
{{- define "ddpjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: the release name, plus the chart name unless the
release name already contains it. Truncated to 63 characters (DNS label limit)
without a trailing "-".
*/}}
{{- define "ddpjob-operator.fullname" -}}
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

{{/*
Chart name and version for the helm.sh/chart label ("+" is not allowed in labels).
*/}}
{{- define "ddpjob-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: the immutable subset. A Deployment's selector cannot change
after creation, so only name and instance go here, never version labels.
*/}}
{{- define "ddpjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ddpjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Common labels for every object the chart renders.
*/}}
{{- define "ddpjob-operator.labels" -}}
helm.sh/chart: {{ include "ddpjob-operator.chart" . }}
{{ include "ddpjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: ddpjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
ServiceAccount the operator runs as.
*/}}
{{- define "ddpjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ddpjob-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Operator image reference; the tag defaults to the chart's appVersion so that a
chart release pins the operator it was tested with.
*/}}
{{- define "ddpjob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Operator command-line flags, one list item per line. Mirrors
`python -m ddpjob_operator --help`.
*/}}
{{- define "ddpjob-operator.args" -}}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- if .Values.peering.enabled }}
- --peering={{ .Values.peering.name }}
{{- else }}
- --standalone
{{- end }}
- --liveness-port={{ .Values.livenessPort }}
{{- /* Who the jobs' NetworkPolicies admit to the progress port: these pods (selectorLabels). */}}
- --operator-namespace={{ .Release.Namespace }}
- --operator-pod-selector=app.kubernetes.io/name={{ include "ddpjob-operator.name" . }},app.kubernetes.io/instance={{ .Release.Name }}
- --metrics-port={{ ternary .Values.metrics.port 0 .Values.metrics.enabled }}
- --max-replicas={{ .Values.maxReplicas }}
- --progress-poll-seconds={{ .Values.progressPollSeconds }}
- --status-write-interval-seconds={{ .Values.statusWriteIntervalSeconds }}
- --kube-api-qps={{ .Values.kubeApi.qps }}
- --kube-api-burst={{ .Values.kubeApi.burst }}
- --max-concurrent-passes={{ .Values.maxConcurrentPasses }}
{{- if .Values.verbose }}
- --verbose
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Cross-field checks the values schema cannot express with a readable message.
*/}}
{{- define "ddpjob-operator.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) }}
{{- fail (printf "replicaCount (%d) must be 1 unless peering.enabled=true: standalone operator replicas would all act on every DDPJob; set peering.enabled=true or replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.livenessPort)) }}
{{- fail (printf "metrics.port (%d) must differ from livenessPort (%d): both servers bind in the same pod" (int .Values.metrics.port) (int .Values.livenessPort)) }}
{{- end }}
{{- end }}
