package driver

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// The benchmarks measure the driver's latency and the same steps done by
// hand in the same run, so the overhead ratio compares like with like:
//
//	go test -run XXX -bench . -benchtime 40x ./csi-driver/driver/
//
// Each reports p50 and p99 in milliseconds per operation for the driver
// and the baselines, and overhead-% (driver p50 over the by-hand p50);
// "seq" runs one operation at a time, "par16" sixteen at once. Results are
// recorded in docs/csi-driver.md, and create+delete against the equally
// durable baselines in docs/benchmarks.md.

const benchVolume = 1 << 30

// quiet silences logs, which would otherwise dominate the timings.
func quiet(e *env) {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	e.ctx = klog.NewContext(context.Background(), logr.Discard())
}

func benchEnv(b *testing.B) *env {
	e := newEnv(b, []testDisk{{name: "bench", fsType: "xfs", size: 128 * gi}}, nil)
	quiet(e)
	return e
}

// step is one way of doing the benchmarked operation: setup and teardown
// are untimed, op is timed.
type step struct {
	name     string
	setup    func(i int) any
	op       func(i int, state any) error
	teardown func(i int, state any)
}

// measure runs every step b.N times, sequentially or with 16 workers. The
// steps are interleaved (iteration i runs all of them, starting with a
// different one each time), so the driver and the by-hand baseline see
// the same machine load, which on a shared machine matters more than
// anything else. It reports each step's p50 and p99 and the driver's p50
// overhead over each baseline in percent: overhead-% over the first,
// overhead-<name>-% over a second.
func measure(b *testing.B, workers int, steps ...step) {
	b.Helper()
	lat := make([][]time.Duration, len(steps))
	states := make([][]any, len(steps))
	for s, st := range steps {
		lat[s] = make([]time.Duration, b.N)
		states[s] = make([]any, b.N)
		for i := 0; i < b.N; i++ {
			states[s][i] = st.setup(i)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	next := make(chan int)
	b.ResetTimer()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				for k := range steps {
					s := (i + k) % len(steps)
					start := time.Now()
					err := steps[s].op(i, states[s][i])
					lat[s][i] = time.Since(start)
					if err != nil {
						mu.Lock()
						firstErr = fmt.Errorf("%s: %w", steps[s].name, err)
						mu.Unlock()
					}
				}
			}
		}()
	}
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	b.StopTimer()
	for s, st := range steps {
		for i := 0; i < b.N; i++ {
			st.teardown(i, states[s][i])
		}
	}
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p50 := make([]time.Duration, len(steps))
	for s, st := range steps {
		sort.Slice(lat[s], func(i, j int) bool { return lat[s][i] < lat[s][j] })
		p50[s] = lat[s][len(lat[s])/2]
		b.ReportMetric(ms(p50[s]), st.name+"-p50-ms")
		b.ReportMetric(ms(lat[s][(len(lat[s])*99+99)/100-1]), st.name+"-p99-ms")
	}
	b.ReportMetric(100*(float64(p50[0])/float64(p50[1])-1), "overhead-%")
	if len(steps) > 2 {
		b.ReportMetric(100*(float64(p50[0])/float64(p50[2])-1), "overhead-"+steps[2].name+"-%")
	}
}

var modes = []struct {
	name    string
	workers int
}{{"seq", 1}, {"par16", 16}}

func nothing(int) any     { return nil }
func noTeardown(int, any) {}
func run(args ...string) error {
	_, err := testdisk.Output(args[0], args[1:]...)
	return err
}

// BenchmarkCreateDelete times CreateVolume+DeleteVolume of a 1 GiB volume
// against the same steps done by hand as durably as the driver does them:
// the file is allocated and synced and its directory synced before the
// creation counts as done, and the directory is synced after the removal.
// "hand" uses the command-line tools (fallocate, sync, rm; the baseline of
// overhead-%), "syscall" the bare system calls (open, fallocate, fsync,
// unlink; the baseline of overhead-syscall-%).
func BenchmarkCreateDelete(b *testing.B) {
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			e := benchEnv(b)
			prefix := fmt.Sprintf("cd-%d-", b.N)
			dir := e.paths["bench"]
			measure(b, m.workers,
				step{name: "driver", setup: nothing, teardown: noTeardown, op: func(i int, _ any) error {
					vol, err := e.d.CreateVolume(e.ctx, createReq(fmt.Sprintf("%s%d", prefix, i), benchVolume))
					if err != nil {
						return err
					}
					_, err = e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: vol.Volume.VolumeId})
					return err
				}},
				step{name: "hand", setup: nothing, teardown: noTeardown, op: func(i int, _ any) error {
					f := filepath.Join(dir, fmt.Sprintf("hand-%d.img", i))
					for _, args := range [][]string{{"fallocate", "-l", fmt.Sprint(benchVolume), f}, {"sync", f, dir}, {"rm", f}, {"sync", dir}} {
						if err := run(args...); err != nil {
							return err
						}
					}
					return nil
				}},
				step{name: "syscall", setup: nothing, teardown: noTeardown, op: func(i int, _ any) error {
					f := filepath.Join(dir, fmt.Sprintf("sys-%d.img", i))
					fd, err := unix.Open(f, unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
					if err != nil {
						return err
					}
					err = unix.Fallocate(fd, 0, 0, benchVolume)
					if err == nil {
						err = unix.Fsync(fd)
					}
					unix.Close(fd)
					if err == nil {
						err = fsyncDir(dir)
					}
					if err == nil {
						err = unix.Unlink(f)
					}
					if err == nil {
						err = fsyncDir(dir)
					}
					return err
				}},
			)
		})
	}
}

// fsyncDir syncs a directory, as the by-hand baselines do after changing
// its entries.
func fsyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// BenchmarkStagePublish times NodeStageVolume (attach with direct I/O,
// mkfs.xfs, mount) plus NodePublishVolume (bind mount) of a fresh 1 GiB
// volume against losetup, mkfs.xfs, mount and mount --bind done by hand.
func BenchmarkStagePublish(b *testing.B) {
	type vol struct{ id, file, dev, staging, target string }
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			e := benchEnv(b)
			cap := mountCap()
			paths := func(kind string, i int) (string, string) {
				return filepath.Join(e.kubelet, kind, "staging", fmt.Sprint(i)), filepath.Join(e.kubelet, kind, "pods", fmt.Sprint(i))
			}
			driver := step{name: "driver",
				setup: func(i int) any {
					resp, err := e.d.CreateVolume(e.ctx, createReq(fmt.Sprintf("sp-%d-%d", b.N, i), benchVolume))
					if err != nil {
						b.Fatal(err)
					}
					v := &vol{id: resp.Volume.VolumeId}
					v.staging, v.target = paths("driver", i)
					return v
				},
				op: func(_ int, s any) error {
					v := s.(*vol)
					if _, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, VolumeCapability: cap}); err != nil {
						return err
					}
					_, err := e.d.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: cap})
					return err
				},
				teardown: func(_ int, s any) {
					v := s.(*vol)
					_, err1 := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
					_, err2 := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
					_, err3 := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
					for _, err := range []error{err1, err2, err3} {
						if err != nil {
							b.Error(err)
						}
					}
				},
			}
			hand := step{name: "hand",
				setup: func(i int) any {
					v := &vol{file: filepath.Join(e.paths["bench"], fmt.Sprintf("hand-%d.img", i))}
					v.staging, v.target = paths("hand", i)
					if err := run("fallocate", "-l", fmt.Sprint(benchVolume), v.file); err != nil {
						b.Fatal(err)
					}
					for _, d := range []string{v.staging, v.target} {
						if err := os.MkdirAll(d, 0o750); err != nil {
							b.Fatal(err)
						}
					}
					return v
				},
				op: func(_ int, s any) error {
					v := s.(*vol)
					out, err := testdisk.Output("losetup", "--find", "--show", "--direct-io=on", "--sector-size", "4096", v.file)
					if err != nil {
						return err
					}
					v.dev = strings.TrimSpace(out)
					for _, args := range [][]string{{"mkfs.xfs", "-f", "-q", v.dev}, {"mount", "-o", "nouuid", v.dev, v.staging}, {"mount", "--bind", v.staging, v.target}} {
						if err := run(args...); err != nil {
							return err
						}
					}
					return nil
				},
				teardown: func(_ int, s any) {
					v := s.(*vol)
					for _, args := range [][]string{{"umount", v.target}, {"umount", v.staging}, {"losetup", "--detach", v.dev}, {"rm", v.file}} {
						if err := run(args...); err != nil {
							b.Error(err)
						}
					}
				},
			}
			measure(b, m.workers, driver, hand)
		})
	}
}

// BenchmarkThroughput writes and reads 256 MiB sequentially with direct
// I/O (dd, 1 MiB blocks) to a volume's loop device and to a file on the
// disk's own filesystem, to show what the loop layer costs.
func BenchmarkThroughput(b *testing.B) {
	const size = 256 << 20
	e := benchEnv(b)
	resp, err := e.d.CreateVolume(e.ctx, createReq("tput", size))
	if err != nil {
		b.Fatal(err)
	}
	dev, err := e.d.disk("bench").backend.Attach(e.ctx, strings.TrimPrefix(resp.Volume.VolumeId, "bench:"), false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := e.d.disk("bench").backend.Detach(e.ctx, "tput"); err != nil {
			b.Error(err)
		}
	})
	direct := filepath.Join(e.paths["bench"], "direct.img")
	if err := run("fallocate", "-l", fmt.Sprint(size), direct); err != nil {
		b.Fatal(err)
	}
	count := fmt.Sprint(size >> 20)
	for _, tgt := range []struct{ name, path string }{{"volume", dev}, {"disk-fs", direct}} {
		b.Run("write/"+tgt.name, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				if err := run("dd", "if=/dev/zero", "of="+tgt.path, "bs=1M", "count="+count, "oflag=direct", "conv=notrunc,fsync", "status=none"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("read/"+tgt.name, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				if err := run("dd", "if="+tgt.path, "of=/dev/null", "bs=1M", "count="+count, "iflag=direct", "status=none"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
