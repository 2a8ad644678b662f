package testdisk

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRequireFailsWhereRealDisksAreRequired runs Require in a child process
// whose PATH has none of the disk tools: it skips the test, unless real
// disks are required, where it fails it.
func TestRequireFailsWhereRealDisksAreRequired(t *testing.T) {
	if os.Getenv("TESTDISK_CHILD") == "1" {
		Require(t)
		return
	}
	for _, tt := range []struct {
		name     string
		env      []string
		wantFail bool
		want     string
	}{
		{"skips by default", nil, false, "SKIP"},
		{"fails with " + RequireEnv, []string{RequireEnv + "=1"}, true, "real disks are required"},
		{"fails in CI", []string{"CI=true"}, true, "real disks are required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestRequireFailsWhereRealDisksAreRequired$", "-test.v")
			cmd.Env = append([]string{"TESTDISK_CHILD=1", "PATH=" + t.TempDir(), "HOME=" + os.Getenv("HOME")}, tt.env...)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tt.wantFail || !strings.Contains(string(out), tt.want) {
				t.Errorf("child failed=%v (%v), want %v with %q:\n%s", failed, err, tt.wantFail, tt.want, out)
			}
		})
	}
}

// TestDetachAtCleanupLeavesAReusedNumberAlone: a test that detaches a
// loop device itself (or has the code under test do it) frees its
// number, and the kernel hands that number to whoever asks next: another
// test binary running at the same time. The cleanup must then leave that
// device alone; detaching it by name pulls the other process's disk from
// under it, whose mount right after mkfs then fails ("can't read
// superblock"). Here this process is the other one, and asks at once.
func TestDetachAtCleanupLeavesAReusedNumberAlone(t *testing.T) {
	Require(t)
	dir := t.TempDir()
	file := func(name string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	mine, other := file("mine"), file("other")
	var kept string
	var was Backing
	t.Run("a test that leaves its device attached", func(t *testing.T) {
		kept = strings.TrimSpace(Run(t, "losetup", "--find", "--show", mine))
		DetachAtCleanup(t, kept)
		was, _ = BackingOf(kept)
	})
	for i := 0; i < 500; i++ {
		if now, ok := BackingOf(kept); !ok || now != was {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if now, ok := BackingOf(kept); ok && now == was {
		_, _ = Output("losetup", "--detach", kept)
		t.Fatalf("%s, which the test left attached, is still attached after its cleanup", kept)
	}
	for range 10 {
		var reused string
		t.Run("a test that detaches its device itself", func(t *testing.T) {
			dev := strings.TrimSpace(Run(t, "losetup", "--find", "--show", mine))
			DetachAtCleanup(t, dev)
			Run(t, "losetup", "--detach", dev)
			for i := 0; i < 500 && attached(dev); i++ {
				time.Sleep(10 * time.Millisecond) // a deferred detach (udev probing)
			}
			next := strings.TrimSpace(Run(t, "losetup", "--find", "--show", other))
			if next != dev {
				Run(t, "losetup", "--detach", next)
				return
			}
			reused = next
		})
		if reused == "" {
			continue // another process took the number first
		}
		backing, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(reused), "loop", "backing_file"))
		_, _ = Output("losetup", "--detach", reused)
		if strings.TrimSpace(string(backing)) != other {
			t.Fatalf("%s, given to another file after the test detached it, was detached by the test's cleanup (backing file now %q)", reused, backing)
		}
		return
	}
	t.Skip("other processes took every freed number first")
}

func attached(dev string) bool {
	_, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	return err == nil
}
