# diskfit — run `make help` for the targets.
SHELL := /usr/bin/env bash -o pipefail
.DEFAULT_GOAL := help

ROOT  := $(CURDIR)
BIN   := $(ROOT)/bin
GO    ?= go
# Tests that mount loop devices and format filesystems need root; the
# local cluster needs the sidecars from bin/.
export PATH := $(BIN):$(PATH)

TOOLS := deepcopy-gen conversion-gen defaulter-gen client-gen lister-gen informer-gen controller-gen \
         csi-provisioner csi-resizer csi-snapshotter snapshot-controller csi-sanity \
         staticcheck govulncheck
# The Kubernetes code generators have their own pin (hack/tools/codegen).
CODEGEN_PKGS := \
	k8s.io/code-generator/cmd/deepcopy-gen \
	k8s.io/code-generator/cmd/conversion-gen \
	k8s.io/code-generator/cmd/defaulter-gen \
	k8s.io/code-generator/cmd/client-gen \
	k8s.io/code-generator/cmd/lister-gen \
	k8s.io/code-generator/cmd/informer-gen
TOOL_PKGS := \
	sigs.k8s.io/controller-tools/cmd/controller-gen \
	github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner \
	github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer \
	github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
	github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller \
	github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity \
	honnef.co/go/tools/cmd/staticcheck \
	golang.org/x/vuln/cmd/govulncheck

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z0-9_-]+:.*?## / {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build diskfit's binaries and the local-cluster runner into bin/.
	$(GO) build -o $(BIN)/ ./cmd/... ./test/cmd/localcluster

.PHONY: demo
demo: deps tools build ## Run diskfit locally: a 3-node cluster, one StatefulSet under diskfit and under the default scheduler. Needs root; KEEP=1 leaves it running.
	$(BIN)/localcluster demo

# Tools are pinned in hack/tools/go.mod and hack/tools/codegen/go.mod. The
# stamp makes them build once and rebuild only when a pin changes.
$(BIN)/.tools-stamp: hack/tools/go.mod hack/tools/go.sum hack/tools/codegen/go.mod hack/tools/codegen/go.sum
	cd hack/tools && GOBIN=$(BIN) $(GO) install $(TOOL_PKGS)
	cd hack/tools/codegen && GOBIN=$(BIN) $(GO) install $(CODEGEN_PKGS)
	touch $@

# BuildKit's client, for hack/Dockerfile where the Docker CLI has no buildx
# plugin; pinned in hack/tools/go.mod like the tools, built only for images.
$(BIN)/buildx: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && GOBIN=$(BIN) $(GO) install github.com/docker/buildx/cmd/buildx
	touch $@

# kind, for hack/kind-e2e.sh; pinned in hack/tools/go.mod like the tools.
$(BIN)/kind: hack/tools/go.mod hack/tools/go.sum
	cd hack/tools && GOBIN=$(BIN) $(GO) install sigs.k8s.io/kind
	touch $@

.PHONY: images
images: ## Build diskfit's images (ghcr.io/diskfit/*:dev) from hack/Dockerfile; OFFLINE=1 builds their base images here instead of pulling them (needs root).
	@docker buildx version >/dev/null 2>&1 || $(MAKE) --no-print-directory $(BIN)/buildx
	hack/build-images.sh

.PHONY: kind-e2e
kind-e2e: $(BIN)/kind ## Run the e2e suite on a kind cluster made from the manifests (hack/kind-e2e.sh; KEEP=1 keeps it, OFFLINE=1 builds every image here).
	@docker buildx version >/dev/null 2>&1 || $(MAKE) --no-print-directory $(BIN)/buildx
	hack/kind-e2e.sh

.PHONY: deps
deps: ## Install the system packages the tests and demo need (xfsprogs, e2fsprogs, lvm2, util-linux).
	hack/install-deps.sh

.PHONY: tools
tools: $(BIN)/.tools-stamp ## Build the pinned generators, linters, sidecars and csi-sanity into bin/.

.PHONY: generate
generate: tools ## Regenerate deepcopy, clientset, listers, informers, the CRD YAML, and the plugin args' deepcopy, conversion and defaulters.
	hack/update-codegen.sh

.PHONY: verify
verify: tools ## Fail when generated files are stale or a manifest does not render (needs kubectl); go vet, staticcheck, govulncheck.
	hack/verify-codegen.sh
	hack/verify-manifests.sh
	hack/verify-snapshot-crds.sh
	$(GO) vet ./...
	hack/lint.sh

.PHONY: test
test: deps tools ## Run every test that runs on this machine (unit, csi-sanity, local cluster). Needs root.
	hack/kube-minor.sh check
	$(GO) test -count=1 -timeout 45m ./...

.PHONY: test-kube-minors
test-kube-minors: ## For each older Kubernetes minor (hack/kube-minor.sh list): build diskfit-scheduler for it and run the plugin's tests and the scheduler against its kube-apiserver, then the driver's, controller's and CLI's one build against that API server (test/skew). Cold: about 15 minutes per minor.
	@for minor in $$(hack/kube-minor.sh list); do \
		echo "== Kubernetes $$minor"; \
		hack/kube-minor.sh test $$minor -count=1 -timeout 20m || exit 1; \
		hack/kube-minor.sh build $$minor -o $(BIN)/diskfit-scheduler-kube$$minor || exit 1; \
		hack/kube-minor.sh controlplane $$minor -o $(BIN)/controlplane-kube$$minor || exit 1; \
		$(GO) test -count=1 -timeout 10m ./test/skew -controlplane $(BIN)/controlplane-kube$$minor || exit 1; \
	done

.PHONY: unit
unit: ## Run the tests that need no cluster (minutes); as non-root, those that need real disks skip and say why.
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /test/e2e)

.PHONY: e2e
e2e: deps tools ## Run the end-to-end suite on a local cluster it starts (needs root), or on E2E_KUBECONFIG's cluster.
	$(GO) test -count=1 -timeout 45m ./test/e2e $(if $(E2E_KUBECONFIG),-kubeconfig $(E2E_KUBECONFIG))

.PHONY: bench
bench: deps tools build ## Run every benchmark and print its tables (placement quality, placement under churn, scheduler plugin, driver, scheduling throughput, scheduler memory, time to bind). Needs root. Results: docs/benchmarks.md.
	@echo "== Placement quality (simulation)"
	$(GO) run ./test/bench/placement -seed 1 -nodes 100,1000
	@echo "== Placement under churn (simulation)"
	$(GO) run ./test/bench/placement -seed 1 -nodes 100 -churn-cycles 10
	@echo "== DiskFit Filter/Score per node vs VolumeBinding"
	$(GO) test ./scheduler-plugin/diskfit/ -run '^$$' -bench . -benchtime=1s -count=5 | python3 scheduler-plugin/hack/benchsummary.py
	@echo "== Driver latency and throughput"
	$(GO) test ./csi-driver/... -run XXX -bench . -benchtime 40x
	@echo "== Scheduling throughput (scheduler_perf), diskfit vs default profile"
	$(GO) test ./test/bench/schedperf -run '^$$' -bench . -benchtime 1x -timeout 60m -perf-scheduling-label-filter=performance
	@echo "== Scheduler memory, diskfit vs default profile (5,000 nodes x 8 disks, 20,000 bound volumes)"
	$(GO) test ./test/bench/schedperf -run TestSchedulerMemory -v -memory -timeout 30m | grep -A4 '^diskfit-scheduler memory'
	@echo "== Time to bind a StatefulSet on the local cluster"
	$(BIN)/localcluster bench

.PHONY: soak
soak: deps tools build ## Run every fuzz target for FUZZTIME each (default 5m), then 1,000 claims in 20 waves on the local cluster (docs/reliability.md); fails on a crash or a broken invariant. Needs root.
	hack/fuzz.sh
	$(BIN)/localcluster load

.PHONY: clean
clean: ## Remove bin/ and test leftovers.
	rm -rf $(BIN) _output
