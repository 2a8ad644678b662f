// Package fault names the steps between the durable side effects of the
// driver's operations and lets crash tests stop the process at one of them.
//
// It exists for tests only. A driver started with DISKFIT_CSI_KILL_AT set
// to a step's name SIGKILLs itself when it reaches that step, so a test can
// check what a restarted driver makes of the state left on disk. With the
// variable unset (always, outside tests) every step is a nil check.
//
// Steps are only made by declare, in this file, so Steps lists every step
// the code can reach and a crash test that iterates it cannot skip one.
package fault

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
)

// EnvVar names the step at which the process kills itself.
const EnvVar = "DISKFIT_CSI_KILL_AT"

// Step is a point between two durable side effects of an operation. Its
// name is "<CSI RPC>/<what is done>".
type Step struct{ name string }

// String returns the step's name.
func (s Step) String() string { return s.name }

// Operation returns the CSI RPC the step belongs to.
func (s Step) Operation() string {
	op, _, _ := strings.Cut(s.name, "/")
	return op
}

var steps []Step

func declare(name string) Step {
	s := Step{name: name}
	steps = append(steps, s)
	return s
}

// Steps returns every declared step in the order an operation reaches them.
func Steps() []Step { return slices.Clone(steps) }

// The steps of the file backend and the node service, in operation order.
var (
	// CreateVolumeWayCleared: what an earlier attempt left is removed; no
	// file of the volume exists.
	CreateVolumeWayCleared = declare("CreateVolume/way-cleared")
	// CreateVolumeDataAllocated: the data file is allocated, not yet
	// synced (that happens with the "ready" record's temporary file), and
	// has no record.
	CreateVolumeDataAllocated = declare("CreateVolume/data-allocated")
	// CreateVolumeReadyTempWritten: the "ready" record is a synced
	// temporary file, not yet renamed into place; the data file is
	// synced.
	CreateVolumeReadyTempWritten = declare("CreateVolume/ready-temp-written")
	// CreateVolumeReadyRecorded: the volume is complete; the caller has
	// not been answered.
	CreateVolumeReadyRecorded = declare("CreateVolume/ready-recorded")

	// DeleteVolumeRecordRemoved: the record is gone (directory synced),
	// the data file is still there.
	DeleteVolumeRecordRemoved = declare("DeleteVolume/record-removed")
	// DeleteVolumeDataRemoved: both are gone; the caller has not been
	// answered.
	DeleteVolumeDataRemoved = declare("DeleteVolume/data-removed")

	// NodeStageVolumeAttached: the volume's loop device exists, nothing
	// is written to it yet.
	NodeStageVolumeAttached = declare("NodeStageVolume/attached")
	// NodeStageVolumeFormatting: mkfs has written the filesystem, nothing
	// is synced or recorded: as far as the disk is concerned mkfs may not
	// have finished (a container killed with its mkfs, a power cut), so
	// the crash test tears the filesystem here.
	NodeStageVolumeFormatting = declare("NodeStageVolume/formatting")
	// NodeStageVolumeFormatted: the filesystem is complete and synced,
	// the record does not say so yet.
	NodeStageVolumeFormatted = declare("NodeStageVolume/formatted")
	// NodeStageVolumeRecordTempWritten: the record saying what the volume
	// holds is a synced temporary file, not yet renamed into place.
	NodeStageVolumeRecordTempWritten = declare("NodeStageVolume/record-temp-written")
	// NodeStageVolumeRecorded: the record says the volume holds a
	// filesystem; nothing is mounted.
	NodeStageVolumeRecorded = declare("NodeStageVolume/recorded")
	// NodeStageVolumeMounted: the filesystem is mounted at the staging
	// path; the caller has not been answered.
	NodeStageVolumeMounted = declare("NodeStageVolume/mounted")

	// NodeExpandVolumeDataAllocated: the data file has grown and is
	// synced, the record has the old size.
	NodeExpandVolumeDataAllocated = declare("NodeExpandVolume/data-allocated")
	// NodeExpandVolumeRecordTempWritten: the record with the new size is a
	// synced temporary file, not yet renamed into place.
	NodeExpandVolumeRecordTempWritten = declare("NodeExpandVolume/record-temp-written")
	// NodeExpandVolumeRecorded: the record has the new size, the loop
	// device still the old one.
	NodeExpandVolumeRecorded = declare("NodeExpandVolume/recorded")
	// NodeExpandVolumeDeviceRefreshed: the loop device has the new size,
	// the filesystem on it the old one.
	NodeExpandVolumeDeviceRefreshed = declare("NodeExpandVolume/device-refreshed")
	// NodeExpandVolumeFilesystemGrown: everything has grown; the caller
	// has not been answered.
	NodeExpandVolumeFilesystemGrown = declare("NodeExpandVolume/filesystem-grown")

	// CreateSnapshotWayCleared: as for CreateVolume.
	CreateSnapshotWayCleared = declare("CreateSnapshot/way-cleared")
	// CreateSnapshotDataCloned: the reflink copy is made, not yet synced,
	// and has no record.
	CreateSnapshotDataCloned = declare("CreateSnapshot/data-cloned")
	// CreateSnapshotReadyTempWritten: as for CreateVolume.
	CreateSnapshotReadyTempWritten = declare("CreateSnapshot/ready-temp-written")
	// CreateSnapshotReadyRecorded: as for CreateVolume.
	CreateSnapshotReadyRecorded = declare("CreateSnapshot/ready-recorded")

	// DeleteSnapshotRecordRemoved: as for DeleteVolume.
	DeleteSnapshotRecordRemoved = declare("DeleteSnapshot/record-removed")
	// DeleteSnapshotDataRemoved: as for DeleteVolume.
	DeleteSnapshotDataRemoved = declare("DeleteSnapshot/data-removed")
)

// Injector acts when the code reaches one step. The nil *Injector, what a
// production driver has, never acts.
type Injector struct {
	at  Step
	act func()
	err error
}

// FromEnv returns an Injector that SIGKILLs the process at the step named
// by EnvVar, nil when the variable is unset or empty, and an error when it
// names no declared step.
func FromEnv() (*Injector, error) {
	name := os.Getenv(EnvVar)
	if name == "" {
		return nil, nil
	}
	for _, s := range steps {
		if s.name == name {
			return At(s, func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }), nil
		}
	}
	return nil, fmt.Errorf("%s=%q names no step; the steps are %v", EnvVar, name, steps)
}

// At returns an Injector that runs act at step.
func At(step Step, act func()) *Injector { return &Injector{at: step, act: act} }

// FailAt returns an Injector that makes the code fail with err at step,
// for tests of error paths. Only steps whose code checks Reach's result
// can fail.
func FailAt(step Step, err error) *Injector { return &Injector{at: step, act: func() {}, err: err} }

// Step returns the step the Injector acts at.
func (i *Injector) Step() Step { return i.at }

// Reach is called by the code at step. It returns the error a FailAt
// Injector injects there, nil otherwise.
func (i *Injector) Reach(step Step) error {
	if i != nil && i.at == step {
		i.act()
		return i.err
	}
	return nil
}
