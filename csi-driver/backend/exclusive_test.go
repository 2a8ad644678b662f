package backend

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
	"github.com/diskfit/diskfit/csi-driver/internal/fakelvm"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestSecondDriverOnADiskLeavesTheFirstsWorkAlone: a second driver
// process on a disk (a force-deleted driver pod whose container still runs
// while its replacement starts; two installations side by side) must not
// roll back what the first is in the middle of. Its Start fails instead,
// and the first's creation completes with its data.
func TestSecondDriverOnADiskLeavesTheFirstsWorkAlone(t *testing.T) {
	ctx := context.Background()
	testdisk.Require(t)
	p := testdisk.New(t, "ext4", 128*mi)
	paused, resume := make(chan struct{}), make(chan struct{})
	first := closing(t, NewFile(testDiskName, p, 0, fault.At(fault.CreateVolumeDataAllocated, func() {
		close(paused)
		<-resume
	})))
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	type result struct {
		vol *Volume
		err error
	}
	created := make(chan result, 1)
	go func() {
		vol, err := first.CreateVolume(ctx, CreateRequest{Key: "v", Name: "v", SizeBytes: 16 * mi})
		created <- result{vol, err}
	}()
	<-paused

	second := closing(t, NewFile(testDiskName, p, 0, nil))
	err := second.Start(ctx)
	if err == nil {
		t.Error("a second backend started on a disk another one serves")
	} else {
		t.Logf("second Start: %v", err)
	}
	close(resume)
	r := <-created
	if r.err != nil {
		t.Fatalf("the first backend's creation failed: %v", r.err)
	}
	if st, err := os.Stat(first.volumeFile("v")); err != nil || st.Size() != 16*mi {
		t.Fatalf("CreateVolume answered %+v, but its data file is %v (%v)", r.vol, st, err)
	}
	if vol, err := first.GetVolume(ctx, "v"); err != nil || vol.SizeBytes != 16*mi {
		t.Errorf("volume after creation: %+v, %v", vol, err)
	}
}

// TestSecondDriverOnAVolumeGroupLeavesTheFirstsWorkAlone is
// TestSecondDriverOnADiskLeavesTheFirstsWorkAlone for the LVM backend: a
// first backend cloning a volume is held while it copies the data into
// the new LV (made, still tagged creating), and a second backend starts
// on the same volume group. Its Start must fail instead of removing that
// LV as an interrupted creation, and the clone completes. lvm2 is faked
// (fakelvm): this machine's kernel has no device-mapper, so real lvm2
// cannot run here.
func TestSecondDriverOnAVolumeGroupLeavesTheFirstsWorkAlone(t *testing.T) {
	ctx := context.Background()
	vg := fakelvm.New(1 << 30)
	first := newLVM(t, vg, true)
	if _, err := first.CreateVolume(ctx, CreateRequest{Key: "src", Name: "src", SizeBytes: 16 * mi}); err != nil {
		t.Fatal(err)
	}
	paused, resume := vg.Hold("dd") // the clone's copy
	t.Cleanup(resume)
	type result struct {
		vol *Volume
		err error
	}
	created := make(chan result, 1)
	go func() {
		vol, err := first.CreateVolume(ctx, CreateRequest{Key: "c", Name: "c", SizeBytes: 16 * mi, FromVolume: "src"})
		created <- result{vol, err}
	}()
	<-paused

	second := closing(t, NewLVM(testDiskName, fakelvm.Name, "", false, 0, vg, first.lockDir, first.lockDir)) // the same node
	second.SetDeviceMapperControl(dmControl(t, true))
	err := second.Start(ctx)
	if err == nil {
		t.Error("a second backend started on a volume group another one serves")
	} else {
		t.Logf("second Start: %v", err)
	}
	resume()
	r := <-created
	if r.err != nil {
		t.Fatalf("the first backend's clone failed: %v", r.err)
	}
	if vol, err := first.GetVolume(ctx, "c"); err != nil || vol.State != StateReady || vol.SizeBytes != 16*mi {
		t.Errorf("CreateVolume answered %+v, but the volume is %+v (%v)", r.vol, vol, err)
	}
}

// A disk served by another process answers only if its device does: the
// check reads the disk's record from the device itself, not from the page
// cache, which would answer for a device that hangs (XFS answers a
// directory read and its fsync from memory when there is nothing to
// commit). The read is seen on the loop device's own counter of reads,
// on both filesystems. A hung device cannot be made here (no
// device-mapper): that the read then hangs, and the disk is reported as
// not answering, follows from O_DIRECT.
func TestServedDiskIsAskedThroughItsDevice(t *testing.T) {
	testdisk.Require(t)
	for _, fsType := range []string{"xfs", "ext4"} {
		t.Run(fsType, func(t *testing.T) {
			p := testdisk.New(t, fsType, 512*mi)
			f := closing(t, NewFile(testDiskName, p, 0, nil))
			if err := f.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			stat := filepath.Join("/sys/block", filepath.Base(testdisk.Source(p)), "stat")
			reads := func() int {
				b, err := os.ReadFile(stat)
				if err != nil {
					t.Fatal(err)
				}
				n, err := strconv.Atoi(strings.Fields(string(b))[0])
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := reads()
			if err := f.answers(); err != nil {
				t.Fatalf("a working disk does not answer: %v", err)
			}
			if after := reads(); after <= before {
				t.Errorf("the disk answered without a read from its device (%d reads before, %d after)", before, after)
			}
		})
	}
}
