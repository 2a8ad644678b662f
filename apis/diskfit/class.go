package diskfit

import (
	"sort"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// Well-known StorageClass keys, as the DefaultStorageClass admission
// plugin, the PV controller and external-provisioner read them.
const (
	// BetaStorageClassAnnotation on a PVC names its class, before
	// spec.storageClassName.
	BetaStorageClassAnnotation   = "volume.beta.kubernetes.io/storage-class"
	IsDefaultClassAnnotation     = "storageclass.kubernetes.io/is-default-class"
	BetaIsDefaultClassAnnotation = "storageclass.beta.kubernetes.io/is-default-class"
)

// IsDiskFitClass reports whether the claims of class are diskfit's to
// place: the class's provisioner is the diskfit driver. nil (no class, or
// one that does not exist) is not.
func IsDiskFitClass(class *storagev1.StorageClass) bool {
	return class != nil && class.Provisioner == DriverName
}

// ClaimClass returns the name of the StorageClass a claim has or will get:
// the one it names (the legacy annotation
// volume.beta.kubernetes.io/storage-class first, then
// spec.storageClassName, even when that is ""), else for a claim not bound
// yet defaultClass, which the API server gives a new claim and the PV
// controller an existing unbound one. "" means no class: a claim without
// a class that is bound went to a volume without a class.
func ClaimClass(pvc *v1.PersistentVolumeClaim, defaultClass string) string {
	if class, ok := pvc.Annotations[BetaStorageClassAnnotation]; ok {
		return class
	}
	if pvc.Spec.StorageClassName != nil {
		return *pvc.Spec.StorageClassName
	}
	if pvc.Spec.VolumeName != "" {
		return ""
	}
	return defaultClass
}

// DefaultClass picks the default StorageClass among classes the way the
// DefaultStorageClass admission plugin does: among the classes annotated
// as default (either annotation "true"), the newest, then the first by
// name. "" when there is none.
func DefaultClass(classes []*storagev1.StorageClass) string {
	var defaults []*storagev1.StorageClass
	for _, c := range classes {
		if c.Annotations[IsDefaultClassAnnotation] == "true" || c.Annotations[BetaIsDefaultClassAnnotation] == "true" {
			defaults = append(defaults, c)
		}
	}
	if len(defaults) == 0 {
		return ""
	}
	sort.Slice(defaults, func(i, j int) bool {
		ti, tj := defaults[i].CreationTimestamp.UnixNano(), defaults[j].CreationTimestamp.UnixNano()
		if ti != tj {
			return ti > tj
		}
		return defaults[i].Name < defaults[j].Name
	})
	return defaults[0].Name
}
