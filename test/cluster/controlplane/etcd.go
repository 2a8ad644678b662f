package controlplane

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// etcd is an embedded single-member etcd on loopback with its data in dir.
type etcd struct {
	server *embed.Etcd
	// ClientURL is where the API server reaches it.
	ClientURL string
}

func startEtcd(dir string) (*etcd, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "diskfit-test"
	cfg.Dir = dir
	// Nothing here must survive the process: skipping fsync makes every
	// API write much cheaper on a shared 2-core machine.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	// Beside the data: its shutdown complaints are not for the terminal.
	cfg.LogOutputs = []string{filepath.Join(filepath.Dir(dir), "etcd.log")}
	// Port 0 lets the kernel choose free ports; the real ones are read back
	// from the listeners below.
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	server, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	select {
	case <-server.Server.ReadyNotify():
	case err := <-server.Err():
		server.Close()
		return nil, fmt.Errorf("etcd failed: %w", err)
	case <-time.After(time.Minute):
		server.Close()
		return nil, fmt.Errorf("etcd not ready after a minute")
	}
	return &etcd{server: server, ClientURL: "http://" + server.Clients[0].Addr().String()}, nil
}

func (e *etcd) stop() {
	e.server.Close()
}
