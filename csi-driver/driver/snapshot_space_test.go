package driver

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestSnapshotNeverMakesWritesFail: a snapshot is a reflink copy that
// takes no space when it is taken, but every later overwrite of its
// source needs new blocks. Those are booked when the snapshot is taken:
// a disk filled to its limit through the driver still has them, the whole
// source can be overwritten without a write error, and neither a volume
// nor a second snapshot is given that room.
func TestSnapshotNeverMakesWritesFail(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "d", fsType: "xfs", size: 1 * gi}}, nil)
	src := e.mustCreate(t, createReq("pvc-src", 300*mi))
	staging := e.stage(t, src.VolumeId, mountCap())
	const written = 200 * mi
	data := filepath.Join(staging, "data")
	writeFile(t, data, written)

	if _, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.VolumeId}); err != nil {
		t.Fatal(err)
	}

	// Fill the disk through the driver, with Block volumes of whatever it
	// says it still has.
	for i := 0; ; i++ {
		capResp, err := e.d.GetCapacity(e.ctx, &csi.GetCapacityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		room := capResp.GetMaximumVolumeSize().GetValue() / (4 * mi) * (4 * mi)
		if room < 4*mi {
			break
		}
		req := createReq(fmt.Sprintf("fill-%d", i), room)
		req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
		if _, err := e.d.CreateVolume(e.ctx, req); err != nil {
			t.Fatalf("filling the disk: a volume of the %d bytes the driver offers: %v", room, err)
		}
	}
	avail := availBytes(t, e.paths["d"])
	t.Logf("disk full as the driver sees it; the filesystem has %d bytes free", avail)

	// The room the source's overwrite needs is not given away.
	req := createReq("pvc-greedy", 64*mi)
	req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	if _, err := e.d.CreateVolume(e.ctx, req); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a volume in the room booked for the snapshot: %v, want ResourceExhausted", err)
	}
	if _, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-2", SourceVolumeId: src.VolumeId}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second snapshot of the source on the full disk: %v, want ResourceExhausted", err)
	}

	// Overwriting the whole source works.
	writeFile(t, data, written)
}

// writeFile writes size random bytes over path (in place, without
// truncating) and fsyncs it; a write or fsync error fails the test.
func writeFile(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4*mi)
	for off := int64(0); off < size; off += int64(len(buf)) {
		_, _ = rand.Read(buf)
		if _, err := f.WriteAt(buf, off); err != nil {
			t.Fatalf("writing %s at %d: %v", path, off, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("syncing %s: %v", path, err)
	}
}
