package driver

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/backend"
)

// Volume and snapshot IDs are "<disk>:<key>". The separator cannot appear in
// a disk name, and the key is a name that is safe as a file or LV name
// (backend.KeyForName), so an ID can never point outside its disk.
const idSeparator = diskfit.VolumeIDSeparator

// maxNameLength bounds CSI volume and snapshot names (the CSI spec asks
// plugins to accept at least 128 bytes, and no more is needed).
const maxNameLength = 128

// maxIDLength bounds IDs: disk name, separator and key.
const maxIDLength = diskfit.MaxDiskNameLength + 1 + backend.MaxKeyLength

// makeID returns the ID of key on disk.
func makeID(disk, key string) string { return disk + idSeparator + key }

// parseID splits an ID. IDs that could be dangerous if they reached a path
// (traversal, slashes, NUL, huge) are InvalidArgument; harmless IDs that
// this driver cannot have issued are NotFound, because the CSI spec treats
// an unknown ID as a volume that does not exist.
func parseID(kind, id string) (disk, key string, err error) {
	switch {
	case id == "":
		return "", "", status.Errorf(codes.InvalidArgument, "%s ID is missing", kind)
	case len(id) > maxIDLength:
		return "", "", status.Errorf(codes.InvalidArgument, "%s ID is %d bytes long, at most %d are allowed", kind, len(id), maxIDLength)
	case strings.ContainsRune(id, 0), strings.Contains(id, "/"), strings.Contains(id, ".."):
		return "", "", status.Errorf(codes.InvalidArgument, "%s ID %q contains NUL, '/' or '..'", kind, id)
	}
	disk, key, ok := strings.Cut(id, idSeparator)
	if !ok || diskfit.ValidateDiskName(disk) != nil || !backend.ValidKey(key) {
		return "", "", status.Errorf(codes.NotFound, "%s %q does not exist: not an ID of this driver", kind, id)
	}
	return disk, key, nil
}

// checkName validates a CSI volume or snapshot name.
func checkName(kind, name string) error {
	switch {
	case name == "":
		return status.Errorf(codes.InvalidArgument, "%s name is missing", kind)
	case len(name) > maxNameLength:
		return status.Errorf(codes.InvalidArgument, "%s name is %d bytes long, at most %d are allowed", kind, len(name), maxNameLength)
	case strings.ContainsRune(name, 0):
		return status.Errorf(codes.InvalidArgument, "%s name contains NUL", kind)
	}
	return nil
}

// volumeOf resolves a volume ID to its disk and key; the disk must be
// available.
func (d *Driver) volumeOf(id string) (*disk, string, error) {
	diskName, key, err := parseID("volume", id)
	if err != nil {
		return nil, "", err
	}
	dk, err := d.availableDisk(diskName, "volume", id)
	return dk, key, err
}

// diskOf resolves a volume ID to its configured disk and key, whether or
// not the disk is available: unpublish and unstage work from the mount
// table, so that pods can stop while a disk is down.
func (d *Driver) diskOf(id string) (*disk, string, error) {
	diskName, key, err := parseID("volume", id)
	if err != nil {
		return nil, "", err
	}
	dk := d.disk(diskName)
	if dk == nil {
		return nil, "", status.Errorf(codes.NotFound, "volume %q does not exist: no disk %s", id, diskName)
	}
	return dk, key, nil
}

// toDelete resolves the ID of a volume or snapshot to delete to its disk
// and key. A nil disk with a nil error means there is nothing to delete:
// an ID this driver cannot have issued (the spec wants OK). An ID of a
// disk the node does not serve is FailedPrecondition, not "gone": a disk
// taken out of the config (to be put back, renamed), or one discovery does
// not find mounted, may still hold its data, and an OK would have the PV
// or content deleted and the data left with nothing tracking it. The
// message says what to do if the disk is gone for good: policy names the
// field that keeps the data.
func (d *Driver) toDelete(kind, policy, id string) (*disk, string, error) {
	diskName, key, err := parseID(kind, id)
	if status.Code(err) == codes.NotFound {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	dk, err := d.availableDisk(diskName, kind, id)
	if status.Code(err) == codes.NotFound {
		return nil, "", status.Errorf(codes.FailedPrecondition, "%s %q is on disk %s, which node %s does not serve (its node config does not name it, "+
			"or discovery does not find it mounted): nothing is deleted; bring the disk back, or if it is gone for good, set the %s to Retain and delete it by hand",
			kind, id, diskName, d.cfg.NodeID, policy)
	}
	if err != nil {
		return nil, "", err
	}
	return dk, key, nil
}

// availableDisk returns the named disk for a volume or snapshot ID on it:
// NotFound when no such disk is configured (no such ID can exist), and
// Unavailable when it is configured but its backend has not started. A
// disk that is down is never reported as "volume gone": DeleteVolume and
// DeleteSnapshot would then succeed, the PV or content would be deleted
// and the data left on the disk with nothing tracking it.
func (d *Driver) availableDisk(diskName, kind, id string) (*disk, error) {
	dk := d.disk(diskName)
	if dk == nil {
		return nil, status.Errorf(codes.NotFound, "%s %q does not exist: no disk %s", kind, id, diskName)
	}
	if err := dk.unavailable(); err != nil {
		return nil, status.Errorf(codes.Unavailable, "%s %q: disk %s on node %s is not available: %v", kind, id, diskName, d.cfg.NodeID, err)
	}
	return dk, nil
}
