{{- define "sharetune.name" -}}sharetune-operator{{- end -}}
{{- define "sharetune.labels" -}}
app.kubernetes.io/name: sharetune
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "sharetune.selector" -}}
app.kubernetes.io/name: sharetune
app.kubernetes.io/component: operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- /* The MPS daemons' PriorityClass name ("" = none): mpsDaemonPriorityClass.name, else the
       chart's own when it creates one (cluster-scoped: the release namespace keeps it unique). */}}
{{- define "sharetune.mpsDaemonPriorityClass" -}}
{{- $pc := .Values.mpsDaemonPriorityClass | default dict -}}
{{- if $pc.name -}}
{{- $pc.name -}}
{{- else if $pc.create -}}
{{- include "sharetune.name" . }}-{{ .Release.Namespace }}-mps-daemon
{{- end -}}
{{- end -}}
