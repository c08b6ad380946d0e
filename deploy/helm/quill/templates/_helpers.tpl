{{/*
The chart's name, and the release's full name (both at most 63 characters,
DNS labels).
*/}}
{{- define "quill.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "quill.fullname" -}}
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
The daemons: the key of their values, the component label, the command
(the binary and its arguments, as deploy/systemd's units run them) and the
Prometheus job name deploy/prometheus/prometheus.yml gives them, which the
alert rules name.
*/}}
{{- define "quill.components" -}}
components:
  - values: api
    component: api
    command: [api, serve]
    job: quill-api
  - values: relay
    component: relay
    command: [relay, run]
    job: quill-relay
  - values: attachmentWorker
    component: attachment-worker
    command: [attachment-worker, run]
    job: quill-worker
  - values: webhookDispatcher
    component: webhook-dispatcher
    command: [webhook-dispatcher, run]
    job: quill-webhook-dispatcher
{{- end }}

{{/* The labels of every object. */}}
{{- define "quill.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "quill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "quill.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: quill
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The selector of one component's pods: (dict "root" $ "component" "relay"). */}}
{{- define "quill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quill.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "quill.tag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
The image every container runs: repository@digest when image.digest is set
(the tag is then ignored: Kubernetes would pull by the digest anyway), else
repository:tag.
*/}}
{{- define "quill.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "quill.tag" .) }}
{{- end }}
{{- end }}

{{- define "quill.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "quill.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An env entry read from a Secret: (dict "name" "DATABASE_URL" "ref" .Values.database.url). */}}
{{- define "quill.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required (printf "%s: existingSecret names no Secret" .name) .ref.existingSecret | quote }}
      key: {{ required (printf "%s: key is empty" .name) .ref.key | quote }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/* NAME: value pairs as env entries, in name order. */}}
{{- define "quill.plainEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k | quote }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end }}

{{/*
The environment of one program: (dict "root" $ "c" component "v" its values).
Secrets are only secretKeyRefs; everything else is a plain setting.
*/}}
{{- define "quill.env" -}}
{{- $root := .root }}
{{- $vals := $root.Values }}
{{- $c := .c }}
{{- include "quill.secretEnv" (dict "name" "DATABASE_URL" "ref" $vals.database.url) }}
- name: QUILL_LOG_LEVEL
  value: {{ $vals.logLevel | quote }}
- name: NATS_URL
  value: {{ required "nats.url is empty" $vals.nats.url | quote }}
{{- with $vals.nats.credentials.existingSecret }}
- name: QUILL_NATS_CREDS
  value: {{ printf "/etc/quill/nats-creds/%s" $vals.nats.credentials.key | quote }}
{{- end }}
{{- with $vals.nats.tls.existingSecret }}
{{- with $vals.nats.tls.ca }}
- name: QUILL_NATS_TLS_CA
  value: {{ printf "/etc/quill/nats-tls/%s" . | quote }}
{{- end }}
{{- if or $vals.nats.tls.cert $vals.nats.tls.key }}
- name: QUILL_NATS_TLS_CERT
  value: {{ printf "/etc/quill/nats-tls/%s" (required "nats.tls.cert is empty but nats.tls.key is not" $vals.nats.tls.cert) | quote }}
- name: QUILL_NATS_TLS_KEY
  value: {{ printf "/etc/quill/nats-tls/%s" (required "nats.tls.key is empty but nats.tls.cert is not" $vals.nats.tls.key) | quote }}
{{- end }}
{{- end }}
{{- if .v }}
- name: QUILL_ADMIN_ADDR
  value: {{ printf ":%v" .v.adminPort | quote }}
{{- with $vals.shutdownDelay }}
- name: QUILL_SHUTDOWN_DELAY
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if eq $c.component "api" }}
- name: QUILL_HTTP_ADDR
  value: {{ printf ":%v" .v.httpPort | quote }}
{{- /* Optional for the API, which starts without it (its webhook routes
answer 503): a Secret without the key must not keep the API from starting.
The dispatcher needs it, so a missing key stops its pod from starting. */}}
{{- with $vals.webhooks.secretKey.existingSecret }}
{{- include "quill.secretEnv" (dict "name" "QUILL_WEBHOOK_SECRET_KEY" "ref" $vals.webhooks.secretKey "optional" true) | nindent 0 }}
{{- end }}
{{- end }}
{{- if eq $c.component "relay" }}
{{- with $vals.database.relayURL.existingSecret }}
{{- include "quill.secretEnv" (dict "name" "QUILL_RELAY_DATABASE_URL" "ref" $vals.database.relayURL) | nindent 0 }}
{{- end }}
{{- with $vals.nats.streamReplicas }}
- name: QUILL_STREAM_REPLICAS
  value: {{ . | toString | quote }}
{{- end }}
{{- end }}
{{- if eq $c.component "webhook-dispatcher" }}
{{- include "quill.secretEnv" (dict "name" "QUILL_WEBHOOK_SECRET_KEY" "ref" $vals.webhooks.secretKey) | nindent 0 }}
{{- end }}
{{- include "quill.plainEnv" (merge (dict) (default (dict) .extra) $vals.env) }}
{{- with $vals.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The NATS files' volumes and mounts, when a Secret is named. */}}
{{- define "quill.natsVolumes" -}}
{{- with .Values.nats.credentials.existingSecret }}
- name: nats-creds
  secret:
    secretName: {{ . | quote }}
    defaultMode: 0440
{{- end }}
{{- with .Values.nats.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ . | quote }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{- define "quill.natsMounts" -}}
{{- if .Values.nats.credentials.existingSecret }}
- name: nats-creds
  mountPath: /etc/quill/nats-creds
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/quill/nats-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The pod-level settings every pod shares. */}}
{{- define "quill.podCommon" -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
