package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// tenantClient returns a client for a ServiceAccount of ns bound to the
// ClusterRole "edit": the usual rights of a namespace's users.
func tenantClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenant-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "tenant", Namespace: ns}},
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tenant", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(restConfig)
	cfg.BearerToken = tr.Status.Token
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server's authorizer learns of the binding from its cache.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: "create", Resource: "persistentvolumeclaims",
			}},
		}, metav1.CreateOptions{})
		return err == nil && review.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("the tenant may not create claims in %s: %v", ns, err)
	}
	return client
}

// A tenant cannot choose a claim's disk: the manifests' admission policy
// refuses diskfit.io/selected-disk from anyone but diskfit-scheduler, on
// a new claim and on an update, and a node for a claim that has a disk,
// while diskfit-scheduler's own write (with the node, when it places the
// tenant's pod) passes, and the tenant's other updates of the claim still
// do.
func TestOnlyTheSchedulerChoosesTheDisk(t *testing.T) {
	ns := newNamespace(t)
	tenant := tenantClient(t, ns)
	class := newStorageClass(t, "")
	ctx := ctxFor(t, 3*time.Minute)
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'diskfit-selected-disk'") {
			t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		}
	}

	forged := claim("forged", class, 300*mi)
	forged.Annotations = map[string]string{diskfit.SelectedDiskAnnotation: "nvme0"}
	_, err := tenant.CoreV1().PersistentVolumeClaims(ns).Create(ctx, forged, metav1.CreateOptions{})
	refused("a tenant's claim naming a disk", err)

	if _, err := tenant.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim("data", class, 300*mi), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := podSpec("app", diskfit.SchedulerName, "data")
	if _, err := tenant.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := waitPVCsBound(t, ns, []string{"data"}, 2*time.Minute)["data"]
	disk := bound.Annotations[diskfit.SelectedDiskAnnotation]
	if disk == "" {
		t.Fatalf("diskfit-scheduler's disk annotation is missing on the bound claim: %v", bound.Annotations)
	}

	for _, tt := range []struct {
		name   string
		change func(*v1.PersistentVolumeClaim)
		allow  bool
	}{
		{"another disk", func(c *v1.PersistentVolumeClaim) { c.Annotations[diskfit.SelectedDiskAnnotation] = disk + "x" }, false},
		{"no disk", func(c *v1.PersistentVolumeClaim) { delete(c.Annotations, diskfit.SelectedDiskAnnotation) }, false},
		{"another node", func(c *v1.PersistentVolumeClaim) { c.Annotations[diskfit.SelectedNodeAnnotation] = "elsewhere" }, false},
		{"a label", func(c *v1.PersistentVolumeClaim) { c.Labels = map[string]string{"team": "a"} }, true},
	} {
		// The claim's controllers may still write it just after it was
		// bound; a conflict says nothing about admission, so try again.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got, err := tenant.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				return err
			}
			tt.change(got)
			_, err = tenant.CoreV1().PersistentVolumeClaims(ns).Update(ctx, got, metav1.UpdateOptions{})
			return err
		})
		if tt.allow && err != nil {
			t.Errorf("a tenant's update with %s: %v", tt.name, err)
		} else if !tt.allow {
			refused("a tenant's update to "+tt.name, err)
		}
	}
}

// TestDiskfitClassesWaitForTheirFirstConsumer: diskfit-scheduler chooses a
// claim's node and disk when a pod first uses it. A StorageClass of
// diskfit that binds at once (Immediate, also the default when the field
// is left out) is refused with a message saying what to set: no
// scheduler would be asked, the nodes' provisioners would race for the
// claim.
func TestDiskfitClassesWaitForTheirFirstConsumer(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	for _, mode := range []*storagev1.VolumeBindingMode{nil, ptr.To(storagev1.VolumeBindingImmediate)} {
		_, err := kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: "e2e-immediate"}, Provisioner: diskfit.DriverName, VolumeBindingMode: mode,
		}, metav1.CreateOptions{})
		if err == nil {
			_ = kube.StorageV1().StorageClasses().Delete(ctx, "e2e-immediate", metav1.DeleteOptions{})
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "WaitForFirstConsumer") {
			t.Errorf("a diskfit StorageClass with volumeBindingMode %v: %v, want refused, naming WaitForFirstConsumer", ptr.Deref(mode, "unset"), err)
		}
	}
	wffc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-wffc"}, Provisioner: diskfit.DriverName,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, wffc, metav1.CreateOptions{}); err != nil {
		t.Errorf("a diskfit StorageClass that waits for its first consumer: %v", err)
	}
	_ = kube.StorageV1().StorageClasses().Delete(ctx, wffc.Name, metav1.DeleteOptions{})
	other := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "e2e-other-immediate"}, Provisioner: "other.example.com"}
	if _, err := kube.StorageV1().StorageClasses().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Errorf("another driver's Immediate StorageClass: %v", err)
	}
	_ = kube.StorageV1().StorageClasses().Delete(ctx, other.Name, metav1.DeleteOptions{})
}
