package driver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/apis/diskfit"
)

const (
	// defaultVolumeSize is used when a request names no size.
	defaultVolumeSize = 1 << 30
	// maxVolumeSize rejects absurd sizes (1 PiB) before any disk is asked.
	maxVolumeSize = 1 << 50
	// defaultFSType is the filesystem of Filesystem volumes without one.
	defaultFSType = "xfs"
)

var supportedFSTypes = map[string]bool{"xfs": true, "ext4": true}

// checkCapability returns InvalidArgument when vc is malformed or asks for
// something a node-local volume cannot do (any multi-node access mode).
func checkCapability(vc *csi.VolumeCapability) error {
	if vc == nil {
		return status.Error(codes.InvalidArgument, "volume capability is missing")
	}
	switch vc.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return status.Error(codes.InvalidArgument, "volume capability has no access mode")
	default:
		return status.Errorf(codes.InvalidArgument, "access mode %s is not supported: volumes are local to one node", vc.GetAccessMode().GetMode())
	}
	switch at := vc.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
	case *csi.VolumeCapability_Mount:
		if fs := at.Mount.GetFsType(); fs != "" && !supportedFSTypes[fs] {
			return status.Errorf(codes.InvalidArgument, "filesystem type %q is not supported (xfs, ext4)", fs)
		}
	default:
		return status.Error(codes.InvalidArgument, "volume capability has neither block nor mount access type")
	}
	return nil
}

// readerOnly reports whether vc's access mode allows reading only: such a
// volume is staged read-only, so that the stage writes nothing to it, and
// published read-only.
func readerOnly(vc *csi.VolumeCapability) bool {
	return vc.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}

// checkCapabilities checks a non-empty list of capabilities.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities are missing")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

// fsTypeOf returns the filesystem a request wants: the capability's, then
// the StorageClass parameter, then xfs; "" when every capability is Block.
func fsTypeOf(caps []*csi.VolumeCapability, params map[string]string) (string, error) {
	fs := ""
	for _, c := range caps {
		if m := c.GetMount(); m != nil {
			fs = m.GetFsType()
			if fs == "" {
				fs = params[diskfit.FSTypeKey]
			}
			if fs == "" {
				fs = defaultFSType
			}
		}
	}
	if fs != "" && !supportedFSTypes[fs] {
		return "", status.Errorf(codes.InvalidArgument, "filesystem type %q is not supported (xfs, ext4)", fs)
	}
	return fs, nil
}

// volumeSize picks the size for a capacity range: diskfit.VolumeBytes of
// the required bytes (or of a default), the rule the scheduler books by,
// never over the limit. block selects the Block volume floor.
func volumeSize(cr *csi.CapacityRange, block bool) (int64, error) {
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	switch {
	case req < 0 || lim < 0:
		return 0, status.Errorf(codes.InvalidArgument, "capacity range has negative bytes (required %d, limit %d)", req, lim)
	case lim > 0 && lim < req:
		return 0, status.Errorf(codes.InvalidArgument, "capacity limit %d is smaller than the required %d bytes", lim, req)
	case req > maxVolumeSize:
		return 0, status.Errorf(codes.OutOfRange, "%d bytes requested, volumes are at most %d bytes", req, int64(maxVolumeSize))
	}
	size := req
	if size == 0 {
		size = defaultVolumeSize
		if lim > 0 {
			size = min(size, lim)
		}
	}
	size = diskfit.VolumeBytes(size, block)
	if lim > 0 && size > lim {
		return 0, status.Errorf(codes.OutOfRange, "capacity limit %d is below the smallest volume of this kind that holds %d bytes (%d)", lim, req, size)
	}
	return size, nil
}

// sizeFits reports whether an existing volume of size satisfies cr.
func sizeFits(size int64, cr *csi.CapacityRange) bool {
	return size >= cr.GetRequiredBytes() && (cr.GetLimitBytes() == 0 || size <= cr.GetLimitBytes())
}

func controllerCap(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
	return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}}
}

func nodeCap(t csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
	return &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}}
}
