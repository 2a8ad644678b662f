package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// process is a component running as a child process. It dies with this
// process (Pdeathsig), so a killed test leaves no component running.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProcess starts bin with args and env, logging to logDir/name.log.
func startProcess(name, logDir, bin string, args, env []string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	// Appending: a supervised component's restarts log to the same file.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// failure describes how the process ended, with the end of its log.
func (p *process) failure() error {
	raw, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Errorf("%s exited: %v; last lines of %s:\n%s", p.name, p.err, p.log, strings.Join(lines, "\n"))
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to end (SIGTERM) and kills it after grace.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// kill ends the process at once, as a crash would.
func (p *process) kill() {
	if p.exited() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// supervisor keeps a component running as its Deployment would: when the
// process dies (a crash, or a test killing it), it is started again after
// a second, logging to the same file.
type supervisor struct {
	name, logDir, bin string
	args, env         []string

	mu       sync.Mutex
	current  *process
	stopping bool
	done     chan struct{}
}

func startSupervised(name, logDir, bin string, args, env []string) (*supervisor, error) {
	p, err := startProcess(name, logDir, bin, args, env)
	if err != nil {
		return nil, err
	}
	s := &supervisor{name: name, logDir: logDir, bin: bin, args: args, env: env, current: p, done: make(chan struct{})}
	go s.watch()
	return s, nil
}

func (s *supervisor) watch() {
	defer close(s.done)
	for {
		s.mu.Lock()
		p := s.current
		s.mu.Unlock()
		<-p.done
		time.Sleep(time.Second)
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		klog.Background().Info("Restarting component", "component", s.name, "exit", p.err)
		next, err := startProcess(s.name, s.logDir, s.bin, s.args, s.env)
		if err != nil {
			klog.Background().Error(err, "Restarting component", "component", s.name)
			s.mu.Unlock()
			return
		}
		s.current = next
		s.mu.Unlock()
	}
}

// stop ends the component for good: SIGTERM, then SIGKILL after grace.
func (s *supervisor) stop(grace time.Duration) {
	s.mu.Lock()
	s.stopping = true
	p := s.current
	s.mu.Unlock()
	p.stop(grace)
	<-s.done
}
