package backend

import (
	"context"
	"os"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
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
