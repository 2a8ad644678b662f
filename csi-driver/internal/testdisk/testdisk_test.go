package testdisk

import (
	"os"
	"os/exec"
	"strings"
	"testing"
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
