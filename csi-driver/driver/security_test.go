package driver

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// TestPermissions checks the modes the driver gives what it creates: the
// CSI socket 0660 and its directory 0750 (root and the socket's group may
// connect), and on every disk the state directories 0700 and the records
// and data files 0600, also when the directories existed with looser modes.
func TestPermissions(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 2 * gi}}, nil)
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "made-by-driver", "csi.sock")
	ctx := runDriver(t, e, e.ctx, cfg)
	dial(t, cfg.Endpoint)
	sock := strings.TrimPrefix(cfg.Endpoint, "unix://")
	wantMode(t, filepath.Dir(sock), fs.ModeDir|0o750)
	wantMode(t, sock, fs.ModeSocket|0o660)

	state := filepath.Join(e.paths["only"], "diskfit")
	for _, dir := range []string{state, state + "/volumes", state + "/snapshots"} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.d = newDriverOn(t, e)
	vol := e.mustCreate(t, createReq("pvc-modes", 300*mi))
	if _, err := e.d.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-modes", SourceVolumeId: vol.VolumeId}); err != nil {
		t.Fatal(err)
	}
	var files int
	err := filepath.WalkDir(state, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() {
			wantMode(t, path, fs.ModeDir|0o700)
		} else {
			wantMode(t, path, 0o600)
			files++
		}
		return nil
	})
	if err != nil || files != 5 {
		t.Errorf("walked %d files (%v), want the disk's record and the volume's and the snapshot's two each", files, err)
	}
}

// wantMode checks a path's type, permissions and root ownership.
func wantMode(t *testing.T, path string, want fs.FileMode) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != want {
		t.Errorf("%s has mode %v, want %v", path, st.Mode(), want)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != 0 || sys.Gid != 0 {
		t.Errorf("%s is owned by %d:%d, want root", path, sys.Uid, sys.Gid)
	}
}

// TestRequestsCannotEscape sends requests whose IDs and paths try to
// reach outside the disk and the kubelet directory (traversal, absolute
// paths, symlinks planted in the kubelet directory and in the disk's state
// directory, records naming another key). Each is refused with
// InvalidArgument or NotFound, and nothing changes: not the files, modes
// and symlinks of the disk, the kubelet directory and a directory outside
// both, not the mounts, not the loop devices.
func TestRequestsCannotEscape(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 2 * gi}}, nil)
	cap := mountCap()
	ok := e.mustCreate(t, createReq("pvc-ok", 300*mi))
	staging := e.stage(t, ok.VolumeId, cap)

	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("outside both directories"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(e.kubelet, "pods", "link")
	linkDir := filepath.Join(e.kubelet, "plugins", "link-dir")
	for _, p := range []string{link, linkDir} {
		if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, p); err != nil {
			t.Fatal(err)
		}
	}
	// A volume whose data file is a symlink to a file outside, and a
	// record that names a key other than its own.
	volumes := filepath.Join(e.paths["only"], "diskfit", "volumes")
	plant := func(name, content string) {
		if err := os.WriteFile(filepath.Join(volumes, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	plant("evil.json", `{"key":"evil","name":"evil","sizeBytes":1048576,"state":"ready"}`)
	if err := os.Symlink(secret, filepath.Join(volumes, "evil.img")); err != nil {
		t.Fatal(err)
	}
	plant("forged.json", `{"key":"../../../../etc","name":"forged","sizeBytes":1048576,"state":"ready"}`)
	plant("forged.img", "")

	expand := func(id, path string) error {
		_, err := e.d.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: path, VolumeCapability: cap,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mi}})
		return err
	}
	stage := func(id, path string) error {
		_, err := e.d.NodeStageVolume(e.ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: cap})
		return err
	}
	publish := func(stagingPath, target string) error {
		_, err := e.d.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: ok.VolumeId, StagingTargetPath: stagingPath, TargetPath: target, VolumeCapability: cap})
		return err
	}
	stats := func(path string) error {
		_, err := e.d.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: ok.VolumeId, VolumePath: path})
		return err
	}
	fromSource := func(src *csi.VolumeContentSource) error {
		req := createReq("pvc-copy", 300*mi)
		req.VolumeContentSource = src
		_, err := e.d.CreateVolume(e.ctx, req)
		return err
	}
	tests := []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"DeleteVolume of a traversing ID", func() error {
			_, err := e.d.DeleteVolume(e.ctx, &csi.DeleteVolumeRequest{VolumeId: "only:../../etc"})
			return err
		}, codes.InvalidArgument},
		{"ControllerGetVolume of a traversing ID", func() error {
			_, err := e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: "only:../pvc-ok"})
			return err
		}, codes.InvalidArgument},
		{"NodeStageVolume of a traversing ID", func() error { return stage("only:../../etc", staging) }, codes.InvalidArgument},
		{"NodeStageVolume of an absolute path as ID", func() error { return stage("/etc/passwd", staging) }, codes.InvalidArgument},
		{"NodeStageVolume of a volume whose data file is a symlink", func() error { return stage("only:evil", filepath.Join(e.kubelet, "plugins", "evil")) }, codes.NotFound},
		{"NodeExpandVolume of a volume whose data file is a symlink", func() error { return expand("only:evil", staging) }, codes.NotFound},
		{"ControllerGetVolume of a volume whose data file is a symlink", func() error {
			_, err := e.d.ControllerGetVolume(e.ctx, &csi.ControllerGetVolumeRequest{VolumeId: "only:evil"})
			return err
		}, codes.NotFound},
		{"CreateSnapshot of a volume whose data file is a symlink", func() error {
			_, err := e.d.CreateSnapshot(e.ctx, &csi.CreateSnapshotRequest{Name: "snap-evil", SourceVolumeId: "only:evil"})
			return err
		}, codes.NotFound},
		{"CreateVolume cloning a volume whose data file is a symlink", func() error {
			return fromSource(&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "only:evil"}}})
		}, codes.NotFound},
		{"CreateVolume restoring a traversing snapshot ID", func() error {
			return fromSource(&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "only:../volumes/pvc-ok"}}})
		}, codes.InvalidArgument},
		{"NodeExpandVolume of a record naming another key", func() error { return expand("only:forged", staging) }, codes.NotFound},
		{"DeleteSnapshot of a traversing ID", func() error {
			_, err := e.d.DeleteSnapshot(e.ctx, &csi.DeleteSnapshotRequest{SnapshotId: "only:../volumes/pvc-ok"})
			return err
		}, codes.InvalidArgument},
		{"staging path outside the kubelet dir", func() error { return stage(ok.VolumeId, filepath.Join(outside, "s")) }, codes.InvalidArgument},
		{"relative staging path", func() error { return stage(ok.VolumeId, "plugins/s") }, codes.InvalidArgument},
		{"staging path escaping through ..", func() error { return stage(ok.VolumeId, e.kubelet+"/plugins/../../"+filepath.Base(outside)) }, codes.InvalidArgument},
		{"staging path that is a symlink", func() error { return stage(ok.VolumeId, link) }, codes.InvalidArgument},
		{"staging path below a symlink", func() error { return stage(ok.VolumeId, filepath.Join(linkDir, "s")) }, codes.InvalidArgument},
		{"NodeUnstageVolume of a symlink", func() error {
			_, err := e.d.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: ok.VolumeId, StagingTargetPath: link})
			return err
		}, codes.InvalidArgument},
		{"publish target that is a symlink", func() error { return publish(staging, link) }, codes.InvalidArgument},
		{"publish target outside the kubelet dir", func() error { return publish(staging, filepath.Join(outside, "t")) }, codes.InvalidArgument},
		{"publish from a staging path that is a symlink", func() error { return publish(link, filepath.Join(e.kubelet, "pods", "t")) }, codes.InvalidArgument},
		{"NodeUnpublishVolume of a symlink", func() error {
			_, err := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: ok.VolumeId, TargetPath: link})
			return err
		}, codes.InvalidArgument},
		{"NodeUnpublishVolume outside the kubelet dir", func() error {
			_, err := e.d.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: ok.VolumeId, TargetPath: outside})
			return err
		}, codes.InvalidArgument},
		{"NodeGetVolumeStats outside the kubelet dir", func() error { return stats(outside) }, codes.NotFound},
		{"NodeGetVolumeStats of a symlink", func() error { return stats(link) }, codes.NotFound},
		{"NodeExpandVolume outside the kubelet dir", func() error { return expand(ok.VolumeId, outside) }, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := hostState(t, e.paths["only"], e.kubelet, outside)
			wantCode(t, tt.call(), tt.want)
			if after := hostState(t, e.paths["only"], e.kubelet, outside); !slices.Equal(before, after) {
				t.Errorf("the request changed the host:\nbefore %v\nafter  %v", before, after)
			}
		})
	}
}

// hostState lists every file below roots with its type, mode, size and
// symlink target, the mounts below them and the loop devices backed there.
func hostState(t *testing.T, roots ...string) []string {
	t.Helper()
	var state []string
	for _, root := range roots {
		err := filepath.WalkDir(root, func(path string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := de.Info()
			if err != nil {
				return err
			}
			size := info.Size()
			if info.IsDir() {
				size = 0 // XFS reports directory sizes that grow with entries made and removed.
			}
			target, _ := os.Readlink(path)
			state = append(state, fmt.Sprintf("%s %v %d %s", path, info.Mode(), size, target))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testdisk.MountsBelow(root) {
			state = append(state, "mount "+m)
		}
		for _, l := range testdisk.LoopsBelow(root) {
			state = append(state, "loop "+l)
		}
	}
	return state
}

// TestStateDirectorySymlinkRefused plants a symlink in place of a disk's
// volume directory: the disk must be unusable (a volume made there would
// land wherever the link points) and nothing written through it.
func TestStateDirectorySymlinkRefused(t *testing.T) {
	testdisk.Require(t)
	mnt := testdisk.New(t, "xfs", gi)
	outside := t.TempDir()
	if err := os.Mkdir(filepath.Join(mnt, "diskfit"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(mnt, "diskfit", "volumes")); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, []testDisk{{name: "healthy", fsType: "xfs", size: gi}}, nil)
	cfg := e.d.cfg
	cfg.Node.Disks = append(cfg.Node.Disks, cfg.Node.Disks[0])
	cfg.Node.Disks[1].Name, cfg.Node.Disks[1].Path = "linked", mnt
	d := e.restart(t, cfg)
	st := d.Observe(e.ctx)
	if linked := st.Disk("linked"); linked == nil || linked.Healthy || !strings.Contains(linked.Message, "not a directory") {
		t.Errorf("disk with a symlinked volume directory: %+v", linked)
	}
	req := createReq("pvc-linked", 300*mi)
	req.Parameters = e.addPVC(t, "pvc-linked", map[string]string{"volume.kubernetes.io/selected-node": testNode, "diskfit.io/selected-disk": "linked"})
	_, err := d.CreateVolume(e.ctx, req)
	wantCode(t, err, codes.ResourceExhausted)
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("written through the symlink: %v", entries)
	}
}

// syncBuffer is a bytes.Buffer safe for the driver's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestSecretsNeverLogged runs the driver at the highest verbosity, with
// every log line (contextual and through klog's global functions) in a
// buffer, and sends every request that has a secrets field, with a secret,
// over the socket, both requests that succeed and requests that fail. The
// calls are logged, the secret never is.
func TestSecretsNeverLogged(t *testing.T) {
	const secret = "s3cr3t-d0-n0t-l0g"
	secrets := map[string]string{"password": secret}
	var out syncBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(10), textlogger.Output(&out)))
	klog.SetLogger(logger)
	t.Cleanup(klog.ClearLogger)

	e := newEnv(t, []testDisk{{name: "only", fsType: "xfs", size: 2 * gi}}, nil)
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	ctx := runDriver(t, e, klog.NewContext(context.Background(), logger), cfg)
	conn := dial(t, cfg.Endpoint)
	ctrl, node := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	cap := mountCap()

	create := createReq("pvc-secret", 300*mi)
	create.Secrets = secrets
	vol, err := ctrl.CreateVolume(ctx, create)
	if err != nil {
		t.Fatal(err)
	}
	id := vol.Volume.VolumeId
	staging := filepath.Join(e.kubelet, "plugins", "secret")
	target := filepath.Join(e.kubelet, "pods", "secret")
	calls := []func() error{
		func() error {
			_, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-bad", Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{cap}, Secrets: secrets})
			return err
		},
		func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: cap, Secrets: secrets})
			return err
		},
		func() error {
			_, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/etc", VolumeCapability: cap, Secrets: secrets})
			return err
		},
		func() error {
			_, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: cap, Secrets: secrets})
			return err
		},
		func() error {
			_, err := node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, VolumeCapability: cap,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 400 * mi}, Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-secret", SourceVolumeId: id, Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "only:snap-secret", Secrets: secrets})
			return err
		},
		func() error {
			_, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
			return err
		},
		func() error {
			_, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
			return err
		},
		func() error {
			_, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: secrets})
			return err
		},
		func() error {
			_, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "only:../x", Secrets: secrets})
			return err
		},
	}
	var failed int
	for _, call := range calls {
		if err := call(); err != nil {
			failed++
			if strings.Contains(err.Error(), secret) {
				t.Errorf("an error carries the secret: %v", err)
			}
		}
	}
	if failed != 4 {
		t.Errorf("%d calls failed, want the 4 bad ones", failed)
	}
	logs := out.String()
	if strings.Contains(logs, secret) {
		t.Errorf("the secret was logged:\n%s", logs)
	}
	for _, want := range []string{"/csi.v1.Controller/CreateVolume", "/csi.v1.Node/NodeStageVolume", "/csi.v1.Controller/ControllerExpandVolume",
		"/csi.v1.Controller/DeleteSnapshot", "***stripped***", "Call failed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log has no %q: the calls were not logged", want)
		}
	}
}
