{{/* The release's full name: the release name when it already contains the chart's name. */}}
{{- define "vmop.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The operator's namespace. */}}
{{- define "vmop.namespace" -}}
{{- default .Release.Namespace .Values.namespace.name -}}
{{- end -}}

{{- define "vmop.serviceAccountName" -}}
{{- default (include "vmop.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "vmop.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vmop.labels" -}}
{{ include "vmop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vmop.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "vmop.pluginsReference" -}}
{{- default (printf "%s-plugins:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag)) .Values.plugins.reference -}}
{{- end -}}

{{/* The restricted Pod Security profile, for every container. */}}
{{- define "vmop.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
