package schedperf

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// etcdCommand is the name under which this test binary acts as etcd.
// scheduler_perf starts a fresh etcd process for every workload and looks
// for it on PATH; no etcd binary is installed here, so an "etcd" symlink to
// the test binary stands in and TestMain runs an embedded etcd when it is
// invoked under that name.
const etcdCommand = "etcd"

// installEtcdShim puts a directory with an "etcd" symlink to this binary in
// front of PATH. The returned function removes it.
func installEtcdShim() (func(), error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("locating the test binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "schedperf-etcd-")
	if err != nil {
		return nil, err
	}
	if err := os.Symlink(self, filepath.Join(dir, etcdCommand)); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("linking etcd shim: %w", err)
	}
	if err := os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH")); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return func() { _ = os.RemoveAll(dir) }, nil
}

// runEtcd serves an embedded single-member etcd with the flags
// scheduler_perf's framework passes to an etcd binary, until SIGTERM or
// until the parent process is gone. It returns the exit code.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet(etcdCommand, flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "")
	listenClient := fs.String("listen-client-urls", "", "")
	quota := fs.Int64("quota-backend-bytes", 0, "")
	// Accepted and ignored: advertised and peer URLs are loopback :0 below.
	fs.String("advertise-client-urls", "", "")
	fs.String("listen-peer-urls", "", "")
	fs.String("log-level", "", "")
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(os.Stderr, "etcd shim: %v\n", err)
		return 2
	}
	client, err := url.Parse(*listenClient)
	if err != nil || *dataDir == "" {
		fmt.Fprintf(os.Stderr, "etcd shim: need --data-dir and --listen-client-urls (%v)\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = "schedperf"
	cfg.Dir = *dataDir
	// Nothing survives the workload: no fsync makes every write cheaper.
	cfg.UnsafeNoFsync = true
	// Closing the listeners on SIGTERM logs errors; start-up failures are
	// returned by StartEtcd anyway.
	cfg.LogLevel = "fatal"
	cfg.QuotaBackendBytes = *quota
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd shim: starting etcd: %v\n", err)
		return 1
	}
	defer server.Close()

	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	parent := os.Getppid()
	orphaned := time.NewTicker(time.Second)
	defer orphaned.Stop()
	for {
		select {
		case <-term:
			return 0
		case err := <-server.Err():
			if err == nil {
				return 0
			}
			fmt.Fprintf(os.Stderr, "etcd shim: %v\n", err)
			return 1
		case <-orphaned.C:
			// The framework kills etcd with the test; if the test binary
			// died first, do not outlive it.
			if os.Getppid() != parent {
				return 0
			}
		}
	}
}
