package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// SchemeGroupVersion is the group and version of this package's objects.
var SchemeGroupVersion = schema.GroupVersion{Group: diskfit.GroupName, Version: "v1alpha1"}

// Resource turns an unqualified resource name into a GroupResource.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder collects the functions that add this package's types to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &DiskNode{}, &DiskNodeList{})
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
