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
const idSeparator = ":"

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
