package driver

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ListVolumes implements csi.ControllerServer. The token is the ID of the
// first volume of the next page, so volumes added or deleted between pages
// do not shift the pages.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := d.checkList(req.GetMaxEntries(), req.GetStartingToken()); err != nil {
		return nil, err
	}
	var entries []*csi.ListVolumesResponse_Entry
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		vols, err := dk.backend.ListVolumes(ctx)
		if err != nil {
			return nil, toStatus(fmt.Errorf("listing volumes of disk %s: %w", dk.name, err))
		}
		for i := range vols {
			entries = append(entries, &csi.ListVolumesResponse_Entry{Volume: d.csiVolume(dk, &vols[i], nil)})
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Volume.VolumeId < entries[j].Volume.VolumeId })
	page, next := paginate(len(entries), func(i int) string { return entries[i].Volume.VolumeId }, req.GetStartingToken(), req.GetMaxEntries())
	return &csi.ListVolumesResponse{Entries: entries[page[0]:page[1]], NextToken: next}, nil
}

// ListSnapshots implements csi.ControllerServer, with the same paging as
// ListVolumes.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := d.checkList(req.GetMaxEntries(), req.GetStartingToken()); err != nil {
		return nil, err
	}
	var entries []*csi.ListSnapshotsResponse_Entry
	for _, dk := range d.disks() {
		if dk.health(ctx) != nil {
			continue
		}
		snaps, err := dk.backend.ListSnapshots(ctx)
		if err != nil {
			return nil, toStatus(fmt.Errorf("listing snapshots of disk %s: %w", dk.name, err))
		}
		for i := range snaps {
			s := d.csiSnapshot(dk, &snaps[i])
			if (req.GetSnapshotId() != "" && s.SnapshotId != req.GetSnapshotId()) ||
				(req.GetSourceVolumeId() != "" && s.SourceVolumeId != req.GetSourceVolumeId()) {
				continue
			}
			entries = append(entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s})
		}
	}
	sort.Slice(entries, func(i, j int) bool {
		return strings.Compare(entries[i].Snapshot.SnapshotId, entries[j].Snapshot.SnapshotId) < 0
	})
	page, next := paginate(len(entries), func(i int) string { return entries[i].Snapshot.SnapshotId }, req.GetStartingToken(), req.GetMaxEntries())
	return &csi.ListSnapshotsResponse{Entries: entries[page[0]:page[1]], NextToken: next}, nil
}

// ControllerListVolumeHealth implements csi.ControllerServer, paged like
// ListVolumes.
func (d *Driver) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	vols, err := d.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: req.GetMaxEntries(), StartingToken: req.GetStartingToken()})
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: vols.GetNextToken()}
	for _, e := range vols.GetEntries() {
		dk, key, err := d.volumeOf(e.GetVolume().GetVolumeId())
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, d.volumeHealth(ctx, dk, key))
	}
	return resp, nil
}

// checkList validates a list request's paging: a negative maximum is
// InvalidArgument, a token this driver cannot have issued Aborted.
func (d *Driver) checkList(maxEntries int32, token string) error {
	if maxEntries < 0 {
		return status.Errorf(codes.InvalidArgument, "max_entries %d is negative", maxEntries)
	}
	if token == "" {
		return nil
	}
	if _, _, err := parseID("token", token); err != nil {
		return status.Errorf(codes.Aborted, "invalid starting token %q", token)
	}
	return nil
}

// paginate returns the [from, to) range of a sorted list after token and
// the token of the next page.
func paginate(n int, id func(int) string, token string, maxEntries int32) ([2]int, string) {
	from := sort.Search(n, func(i int) bool { return id(i) >= token })
	to := n
	if maxEntries > 0 && from+int(maxEntries) < n {
		to = from + int(maxEntries)
	}
	next := ""
	if to < n {
		next = id(to)
	}
	return [2]int{from, to}, next
}
