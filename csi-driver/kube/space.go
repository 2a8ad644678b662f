package kube

import (
	"context"
	"fmt"
	"math"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// DiskSpace reads what ControllerExpandVolume needs to know of a volume's
// disk on whatever node it is: external-resizer runs for the whole cluster
// next to one node's driver.
type DiskSpace struct {
	Kube    kubernetes.Interface
	DiskFit versioned.Interface
}

// SpaceFor implements driver.DiskSpace: the PV that names the volume, from
// a consistent list of the PVs, the bytes the PVs on its disk take (the
// DiskFit scheduler's count), and the disk's status in its node's DiskNode
// (nil when the node reports no such disk). No PV: pv is nil. PVs on two
// disks name the volume: an error.
func (s DiskSpace) SpaceFor(ctx context.Context, volumeID string) (pv *corev1.PersistentVolume, disk *v1alpha1.DiskStatus, booked int64, err error) {
	var all []*corev1.PersistentVolume
	err = listAll(ctx, func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		return s.Kube.CoreV1().PersistentVolumes().List(ctx, opts)
	}, func(obj runtime.Object) {
		if p, ok := obj.(*corev1.PersistentVolume); ok && diskfit.IsDiskFitPV(p) {
			all = append(all, p)
		}
	})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("listing PVs: %w", err)
	}
	var loc diskfit.Location
	for _, p := range all {
		if p.Spec.CSI.VolumeHandle != volumeID {
			continue
		}
		l, ok := diskfit.PVLocation(p)
		if !ok {
			continue
		}
		if pv != nil && l != loc {
			return nil, nil, 0, fmt.Errorf("PVs %s and %s name volume %s on disks %s/%s and %s/%s", pv.Name, p.Name, volumeID, loc.Node, loc.Disk, l.Node, l.Disk)
		}
		pv, loc = p, l
	}
	if pv == nil {
		return nil, nil, 0, nil
	}
	for _, p := range all {
		if l, ok := diskfit.PVLocation(p); ok && l == loc {
			booked = min(booked, math.MaxInt64-capacityBytes(p)) + capacityBytes(p)
		}
	}
	dn, err := s.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, loc.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return pv, nil, booked, nil
	}
	if err != nil {
		return nil, nil, 0, fmt.Errorf("reading DiskNode %s: %w", loc.Node, err)
	}
	return pv, dn.Status.Disk(loc.Disk), booked, nil
}

// capacityBytes is a PV's capacity in bytes, a quantity beyond int64
// (whose Value may be 0) MaxInt64.
func capacityBytes(pv *corev1.PersistentVolume) int64 {
	q := pv.Spec.Capacity[corev1.ResourceStorage]
	if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.BinarySI)) > 0 {
		return math.MaxInt64
	}
	return max(q.Value(), 0)
}
