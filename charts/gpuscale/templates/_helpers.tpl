{{/* Chart name, overridable. */}}
{{- define "gpuscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<name>, or the release name when it already contains the name. */}}
{{- define "gpuscale.fullname" -}}
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

{{/* chart label value: name-version. */}}
{{- define "gpuscale.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every resource. */}}
{{- define "gpuscale.labels" -}}
helm.sh/chart: {{ include "gpuscale.chart" . }}
app.kubernetes.io/name: {{ include "gpuscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of the controller pods. */}}
{{- define "gpuscale.controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* Selector labels of the agent pods. */}}
{{- define "gpuscale.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end }}

{{/* The controller's ServiceAccount name. */}}
{{- define "gpuscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuscale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The agent's ServiceAccount name. */}}
{{- define "gpuscale.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (printf "%s-agent" (include "gpuscale.fullname" .)) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Controller image reference. */}}
{{- define "gpuscale.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Agent image reference (the controller's unless overridden). */}}
{{- define "gpuscale.agent.image" -}}
{{- $repo := default .Values.image.repository .Values.agent.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.agent.image.tag }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}

{{/* Name of the ConfigMap with the provider files and gpuscale.yaml. */}}
{{- define "gpuscale.configName" -}}
{{- printf "%s-config" (include "gpuscale.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
