package diskfit

import (
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	storageinformers "k8s.io/client-go/informers/storage/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// diskfitCapacityBlind is the CSIDriver informer the embedded VolumeBinding
// sees. It hides storage capacity tracking for the diskfit driver only, so
// VolumeBinding does not check diskfit claims one by one against
// CSIStorageCapacity (a per-node maximumVolumeSize up to a poll interval old,
// absent on a node until the first poll): DiskFit checks them jointly
// against every disk with current data. Claims of every other driver keep
// VolumeBinding's capacity check unchanged.
type diskfitCapacityBlind struct {
	storageinformers.CSIDriverInformer
}

// Lister returns the filtering lister.
func (i diskfitCapacityBlind) Lister() storagelisters.CSIDriverLister {
	return capacityBlindLister{
		CSIDriverLister: i.CSIDriverInformer.Lister(),
		// VolumeBinding only reads spec.storageCapacity of the driver it
		// gets; a fixed object without it saves a copy per call.
		blind: &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: diskfit.DriverName}},
	}
}

type capacityBlindLister struct {
	storagelisters.CSIDriverLister
	blind *storagev1.CSIDriver
}

// Get returns the CSIDriver, for the diskfit driver without storage
// capacity tracking.
func (l capacityBlindLister) Get(name string) (*storagev1.CSIDriver, error) {
	d, err := l.CSIDriverLister.Get(name)
	if err != nil || name != diskfit.DriverName {
		return d, err
	}
	return l.blind, nil
}
