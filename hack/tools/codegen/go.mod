module github.com/diskfit/diskfit/hack/tools/codegen

go 1.26.0

require k8s.io/code-generator v0.35.4

require (
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/mod v0.29.0 // indirect
	golang.org/x/sync v0.18.0 // indirect
	golang.org/x/text v0.31.0 // indirect
	golang.org/x/tools v0.38.0 // indirect
	k8s.io/gengo/v2 v2.0.0-20250922181213-ec3ebc5fd46b // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
)
