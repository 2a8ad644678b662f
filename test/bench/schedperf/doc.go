// Package schedperf measures scheduling throughput of the DiskFit profile
// against the default profile with the upstream scheduler_perf harness
// (k8s.io/kubernetes/test/integration/scheduler_perf). Everything lives in
// the package's tests; run it with
//
//	go test ./test/bench/schedperf -run '^$' -bench . -benchtime 1x
//
// See docs/benchmarks.md, section "Scheduling throughput".
package schedperf
