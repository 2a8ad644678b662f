package controlplane

import (
	"fmt"
	"os"
	"sync"

	"k8s.io/klog/v2"
)

// processTB lets the API server's test helpers, which want a testing.TB, run
// in TestMain and in the localcluster binary, where there is no *testing.T.
// Fatal errors panic: the helpers call them only while starting, where a
// panic ends the process and the deferred cleanup in main still runs.
type processTB struct {
	name string

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	tempDirs []string
}

func newProcessTB(name string) *processTB { return &processTB{name: name} }

func (p *processTB) Attr(key, value string) {}
func (p *processTB) Chdir(dir string) {
	if err := os.Chdir(dir); err != nil {
		p.Fatalf("chdir %s: %v", dir, err)
	}
}

func (p *processTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *processTB) Error(args ...any) { p.fail(); klog.ErrorDepth(1, args...) }
func (p *processTB) Errorf(format string, args ...any) {
	p.fail()
	klog.ErrorDepth(1, fmt.Sprintf(format, args...))
}
func (p *processTB) Fail()    { p.fail() }
func (p *processTB) FailNow() { p.fail(); panic(p.name + ": FailNow") }
func (p *processTB) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}
func (p *processTB) Fatal(args ...any) { p.fail(); panic(fmt.Sprint(args...)) }
func (p *processTB) Fatalf(format string, args ...any) {
	p.fail()
	panic(fmt.Sprintf(format, args...))
}
func (p *processTB) Helper()                          {}
func (p *processTB) Log(args ...any)                  { klog.InfoDepth(1, args...) }
func (p *processTB) Logf(format string, args ...any)  { klog.InfoDepth(1, fmt.Sprintf(format, args...)) }
func (p *processTB) Name() string                     { return p.name }
func (p *processTB) Setenv(key, value string)         { _ = os.Setenv(key, value) }
func (p *processTB) Skip(args ...any)                 { p.Fatal(append([]any{"skip: "}, args...)...) }
func (p *processTB) Skipf(format string, args ...any) { p.Fatalf("skip: "+format, args...) }
func (p *processTB) SkipNow()                         { p.Fatal("skip") }
func (p *processTB) Skipped() bool                    { return false }

func (p *processTB) TempDir() string {
	dir, err := os.MkdirTemp("", "diskfit-"+p.name+"-")
	if err != nil {
		p.Fatalf("temp dir: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tempDirs = append(p.tempDirs, dir)
	return dir
}

func (p *processTB) fail() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed = true
}

// close runs the registered cleanups, last first, as testing does.
func (p *processTB) close() {
	p.mu.Lock()
	cleanups, dirs := p.cleanups, p.tempDirs
	p.cleanups, p.tempDirs = nil, nil
	p.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	for _, dir := range dirs {
		_ = os.RemoveAll(dir)
	}
}
