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
