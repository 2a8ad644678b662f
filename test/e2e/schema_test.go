package e2e

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// The CRD schema is the last line of defence: a buggy or hostile node plugin
// must not be able to publish a DiskNode that makes the scheduler misplace
// volumes.
func TestDiskNodeSchemaRejectsBadObjects(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	client := diskfitAPI.DiskfitV1alpha1().DiskNodes()
	good := func() v1alpha1.DiskStatus {
		return v1alpha1.DiskStatus{Name: "d0", Backend: v1alpha1.BackendFile, CapacityBytes: 10 * gi, FreeBytes: 4 * gi, Healthy: true}
	}
	tests := []struct {
		name    string
		disks   func() []v1alpha1.DiskStatus
		wantErr string
	}{
		{name: "valid", disks: func() []v1alpha1.DiskStatus { return []v1alpha1.DiskStatus{good()} }},
		{name: "negative free", wantErr: "freeBytes", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.FreeBytes = -1
			return []v1alpha1.DiskStatus{d}
		}},
		{name: "negative capacity", wantErr: "capacityBytes", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.CapacityBytes, d.FreeBytes = -5, 0
			return []v1alpha1.DiskStatus{d}
		}},
		{name: "free above capacity", wantErr: "freeBytes must not exceed capacityBytes", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.FreeBytes = d.CapacityBytes + 1
			return []v1alpha1.DiskStatus{d}
		}},
		{name: "empty disk name", wantErr: "name", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.Name = ""
			return []v1alpha1.DiskStatus{d}
		}},
		{name: "path in disk name", wantErr: "name", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.Name = "../etc"
			return []v1alpha1.DiskStatus{d}
		}},
		{name: "duplicate disk names", wantErr: "Duplicate value", disks: func() []v1alpha1.DiskStatus {
			return []v1alpha1.DiskStatus{good(), good()}
		}},
		{name: "unknown backend", wantErr: "backend", disks: func() []v1alpha1.DiskStatus {
			d := good()
			d.Backend = "zfs"
			return []v1alpha1.DiskStatus{d}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dn, err := client.Create(ctx, &v1alpha1.DiskNode{ObjectMeta: metav1.ObjectMeta{GenerateName: "schema-test-"}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Delete(ctx, dn.Name, metav1.DeleteOptions{}) })
			dn.Status.Disks = tt.disks()
			dn.Status.ObservedTime = metav1.Now()
			dn.Status.Summarize()
			_, err = client.UpdateStatus(ctx, dn, metav1.UpdateOptions{})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("valid status refused: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("bad status accepted")
			case tt.wantErr != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error = %v, want Invalid mentioning %q", err, tt.wantErr)
			}
		})
	}
}
