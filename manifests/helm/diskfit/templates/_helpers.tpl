{{/*
The labels of every object: app.kubernetes.io/part-of, as the kustomize
base gives them, and Helm's own. Pod templates and selectors get neither, as
in the base (selectors cannot change once made).
*/}}
{{- define "diskfit.labels" -}}
app.kubernetes.io/part-of: diskfit
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
An image reference from {repository, tag}; an empty tag is the chart's
appVersion. Called with (list $ .Values.x.image).
*/}}
{{- define "diskfit.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) -}}
{{- end }}

{{/*
diskfit-scheduler's image. Without a tag in the values, the release's tag
for the cluster's Kubernetes minor: kube-scheduler must not be newer than
the API server, so the older minors (hack/kube-minor.sh list) have their own
build, tagged -kube1.35 and so on; the newest serves its own minor and the
next one (a scheduler may be one minor older than the API server).
*/}}
{{- define "diskfit.schedulerImage" -}}
{{- $image := .Values.scheduler.image -}}
{{- $tag := $image.tag -}}
{{- if not $tag -}}
{{- $tag = .Chart.AppVersion -}}
{{- range $minor := list "1.35" "1.36" -}}
{{- if semverCompare (printf "~%s.0-0" $minor) $.Capabilities.KubeVersion.Version -}}
{{- $tag = printf "%s-kube%s" $.Chart.AppVersion $minor -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end }}

{{/*
A container's resources, nothing when empty.
*/}}
{{- define "diskfit.resources" -}}
{{- with . -}}
resources:
  {{- toYaml . | nindent 2 }}
{{- end -}}
{{- end }}

{{/*
The pod anti-affinity of a Deployment's replicas: each on another node when
it can be. Called with the pods' app.kubernetes.io/name.
*/}}
{{- define "diskfit.spreadReplicas" -}}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              app.kubernetes.io/name: {{ . }}
{{- end }}

{{/*
The scheduler's KubeSchedulerConfiguration file: with the default values,
manifests/scheduler/diskfit-scheduler-config.yaml to the byte.
*/}}
{{- define "diskfit.schedulerConfig" -}}
{{- $args := .Values.scheduler.pluginArgs -}}
{{- $seen := dict -}}
{{- range $args.scoringStrategy.deviceClassWeights -}}
{{- if hasKey $seen .deviceClass -}}
{{- fail (printf "scheduler.pluginArgs.scoringStrategy.deviceClassWeights: device class %q is listed twice" .deviceClass) -}}
{{- end -}}
{{- $_ := set $seen .deviceClass true -}}
{{- end -}}
# KubeSchedulerConfiguration for diskfit-scheduler (cmd/diskfit-scheduler).
# It runs beside the default scheduler as a second scheduler; pods opt in
# with spec.schedulerName: diskfit-scheduler.
#
# DiskFit embeds VolumeBinding and behaves exactly like it for volumes that
# are not diskfit's, so the profile disables VolumeBinding and enables
# DiskFit in its place. Running both would assume and write each PVC twice.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: diskfit-scheduler
    plugins:
      # multiPoint enables DiskFit at every extension point it implements:
      # exactly VolumeBinding's (preFilter, filter, preScore, score,
      # reserve, preBind) and its queueing hints; VolumeBinding, enabled by
      # default through multiPoint, is disabled everywhere.
      multiPoint:
        disabled:
          - name: VolumeBinding
        enabled:
          - name: DiskFit
    pluginConfig:
      - name: DiskFit
        args:
          # How long PreBind waits for volumes to bind (VolumeBinding's
          # bindTimeoutSeconds).
          bindTimeoutSeconds: {{ int64 $args.bindTimeoutSeconds }}
          scoringStrategy:
            # MostAllocated bin-packs disks; LeastAllocated spreads.
            type: {{ $args.scoringStrategy.type }}
            deviceClassWeights: {{ toJson (default list $args.scoringStrategy.deviceClassWeights) }}
          # Nodes whose DiskNode was not refreshed for this long are not used.
          maxDiskNodeAge: {{ $args.maxDiskNodeAge }}
          # Pods with up to this many diskfit claims are packed exactly.
          maxExactClaims: {{ int64 $args.maxExactClaims }}
{{ end }}

{{/*
The name of the scheduler's ConfigMap: the one kustomize's configMapGenerator
gives it (manifests/scheduler), diskfit-scheduler-config and a hash of its
content, made the same way (sigs.k8s.io/kustomize/api/hasher): the first 10
hex digits of the SHA-256 of the JSON of kind, name and data, with 0, 1, 3, a
and e replaced. The name in that JSON is empty: kustomize's hasher looks it
up as one field called "metadata/name" and finds none. A changed
configuration is a new ConfigMap, so the scheduler rolls.
*/}}
{{- define "diskfit.schedulerConfigMapName" -}}
{{- $data := dict "diskfit-scheduler-config.yaml" (include "diskfit.schedulerConfig" .) -}}
{{- $hash := dict "kind" "ConfigMap" "name" "" "data" $data | toJson | sha256sum | trunc 10 -}}
diskfit-scheduler-config-{{ $hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t" }}
{{- end }}

{{/*
The node config's text, without its last line break.
*/}}
{{- define "diskfit.nodeConfig" -}}
{{- if not (trim .Values.nodeConfig) -}}
{{- fail "nodeConfig is empty: name your nodes' disks (docs/csi-driver.md, \"Node config\")" -}}
{{- end -}}
{{- trimSuffix "\n" .Values.nodeConfig -}}
{{- end }}
