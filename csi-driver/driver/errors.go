package driver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/diskfit/diskfit/csi-driver/backend"
)

// toStatus maps an internal error to a gRPC status error at the service
// boundary. Errors that already carry a status keep it.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, backend.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, backend.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, backend.ErrInUse):
		code = codes.FailedPrecondition
	case errors.Is(err, backend.ErrUnsupported):
		code = codes.InvalidArgument
	case errors.Is(err, backend.ErrUnhealthy), errors.Is(err, backend.ErrAnotherDisk):
		code = codes.Unavailable
	case errors.Is(err, backend.ErrExists):
		// Only reached when the lookup could not check the disk a moment
		// before; retried, the lookup finds it and answers properly.
		code = codes.Aborted
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}
