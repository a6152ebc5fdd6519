{{/* The limits files by name: .Values.limits, a map of file name to
content, or a single string, the file limits.yaml. Each must parse as
YAML and name its domain: a file that does not fails the render, and the
hook Job (limits-check.yaml) checks the rest with sluice limits check. */}}
{{- define "sluice.limitsFiles" -}}
{{- $files := dict -}}
{{- if kindIs "string" .Values.limits -}}
{{- if .Values.limits }}{{ $_ := set $files "limits.yaml" .Values.limits }}{{ end -}}
{{- else -}}
{{- $files = .Values.limits | default dict -}}
{{- end -}}
{{- range $name, $content := $files -}}
{{- if not (regexMatch "^[A-Za-z0-9][-._A-Za-z0-9]*\\.ya?ml$" $name) -}}
{{- fail (printf "limits: file name %q: want NAME.yaml or NAME.yml (a ConfigMap key)" $name) -}}
{{- end -}}
{{- $doc := fromYaml $content -}}
{{- if hasKey $doc "Error" -}}
{{- fail (printf "limits: %s is not YAML: %s" $name (get $doc "Error")) -}}
{{- end -}}
{{- if not (get $doc "domain") -}}
{{- fail (printf "limits: %s names no domain; add domain: <the domain Envoy sends>" $name) -}}
{{- end -}}
{{- end -}}
{{- toYaml $files -}}
{{- end -}}
