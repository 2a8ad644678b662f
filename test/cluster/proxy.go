package cluster

import (
	"errors"
	"io"
	"net"
	"sync"

	"k8s.io/klog/v2"
)

// apiProxy stands between the components and the API server, so tests can
// take the API server away from them (an outage, a network partition)
// while the test itself, with the admin kubeconfig, still reaches it. It
// forwards TCP; TLS is end to end.
type apiProxy struct {
	listener net.Listener
	target   string

	mu     sync.Mutex
	down   bool
	conns  map[net.Conn]struct{}
	closed bool
}

func startAPIProxy(target string) (*apiProxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &apiProxy{listener: l, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// Addr is the host:port the components use.
func (p *apiProxy) Addr() string { return p.listener.Addr().String() }

// SetDown starts (true) or ends (false) an outage: while down, every
// connection is cut and new ones are closed at once.
func (p *apiProxy) SetDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for c := range p.conns {
			c.Close()
		}
	}
	klog.Background().Info("API server outage for the components", "down", down)
}

func (p *apiProxy) serve() {
	for {
		client, err := p.listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		go p.forward(client)
	}
}

func (p *apiProxy) forward(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	copyAndClose := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go copyAndClose(server, client)
	go copyAndClose(client, server)
	<-done
	<-done
	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

// track records a connection pair unless the proxy is down or closed.
func (p *apiProxy) track(client, server net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down || p.closed {
		return false
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	return true
}

func (p *apiProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.listener.Close()
}
