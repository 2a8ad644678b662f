package driver

import (
	"fmt"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
)

// availBytes is what the disk's filesystem has left for anyone.
func availBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Frsize
}

// TestReserveHoldsUnderConcurrentCreates sends 16 CreateVolume calls at
// once whose sizes add up to far more than the disk offers beyond its
// reserve: the reserve stays free on the filesystem, every call that does
// not fit answers ResourceExhausted, and every call that fits succeeds.
func TestReserveHoldsUnderConcurrentCreates(t *testing.T) {
	reserved := resource.MustParse("1Gi")
	e := newEnv(t, []testDisk{{name: "d", fsType: "xfs", size: 4 * gi, reserved: &reserved}}, nil)
	offered := availBytes(t, e.paths["d"]) - reserved.Value()
	const calls, size = 16, 300 * mi
	fit := int(offered / size)
	if fit >= calls {
		t.Fatalf("the disk offers %d bytes: all %d volumes would fit", offered, calls)
	}

	codesSeen := make([]codes.Code, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			_, err := e.d.CreateVolume(e.ctx, createReq(fmt.Sprintf("v%d", i), size))
			codesSeen[i] = status.Code(err)
		})
	}
	wg.Wait()

	made := 0
	for i, c := range codesSeen {
		switch c {
		case codes.OK:
			made++
		case codes.ResourceExhausted:
		default:
			t.Errorf("v%d: code %s, want OK or ResourceExhausted", i, c)
		}
	}
	if avail := availBytes(t, e.paths["d"]); avail < reserved.Value() {
		t.Errorf("%d volumes made: the filesystem has %d bytes left, less than the reserve of %d", made, avail, reserved.Value())
	}
	if made != fit {
		t.Errorf("%d volumes made, %d fit beside the reserve", made, fit)
	}
}
