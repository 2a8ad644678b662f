package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

const volumeConfigName = "diskfit-node-volumes"

// scheduledClaim is a claim of appNamespace with UID "uid-"+name, of the
// diskfit class "diskfit", for 1Gi, that the PV controller handed to
// diskfit's provisioner, with the scheduler's selected node when node is
// not empty.
func scheduledClaim(name, node string) *v1.PersistentVolumeClaim {
	c := claim(name, ptr.To("diskfit"))
	c.UID = types.UID("uid-" + name)
	c.Spec.Resources.Requests = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	c.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	c.Annotations = map[string]string{storageProvisionerAnnotation: diskfit.DriverName}
	if node != "" {
		c.Annotations[diskfit.SelectedNodeAnnotation] = node
	}
	return c
}

// pvFor is the PV external-provisioner makes for c: named after its UID,
// pre-bound to it by UID, of its class and size.
func pvFor(c *v1.PersistentVolumeClaim) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + string(c.UID),
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": diskfit.DriverName}},
		Spec: v1.PersistentVolumeSpec{
			ClaimRef: &v1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace, Name: c.Name, UID: c.UID,
			},
			StorageClassName:              ptr.Deref(c.Spec.StorageClassName, ""),
			AccessModes:                   c.Spec.AccessModes,
			Capacity:                      c.Spec.Resources.Requests,
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: diskfit.DriverName, VolumeHandle: "disk0:" + string(c.UID),
			}},
		},
	}
}

// pvCreate is the admission request of creating pv with a token bound to
// node (none when empty).
func pvCreate(t *testing.T, pv *v1.PersistentVolume, node string) *admissionv1.AdmissionRequest {
	t.Helper()
	raw, err := json.Marshal(pv)
	if err != nil {
		t.Fatal(err)
	}
	user := authenticationv1.UserInfo{Username: "system:serviceaccount:diskfit-system:diskfit-csi-node"}
	if node != "" {
		user.Extra = map[string]authenticationv1.ExtraValue{serviceaccount.NodeNameKey: {node}}
	}
	return &admissionv1.AdmissionRequest{
		UID:       types.UID("uid-" + pv.Name),
		Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "PersistentVolume"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"},
		Name:      pv.Name,
		Operation: admissionv1.Create,
		UserInfo:  user,
		Object:    runtime.RawExtension{Raw: raw},
	}
}

// A node's driver may create a PV only for a claim the scheduler placed on
// its node: pre-bound by UID to a claim that exists, is bound to no other
// PV and whose selected node is the token's node. Every other PV is
// refused with 403 and a message that says why.
func TestNodeDriverCreatesPVsOnlyForClaimsScheduledToItsNode(t *testing.T) {
	onA := scheduledClaim("on-a", "node-a")
	onB := scheduledClaim("on-b", "node-b")
	pending := scheduledClaim("pending", "")
	boundElsewhere := scheduledClaim("bound-elsewhere", "node-a")
	boundElsewhere.Spec.VolumeName = "pvc-other"
	boundHere := scheduledClaim("bound-here", "node-a")
	boundHere.Spec.VolumeName = pvFor(boundHere).Name
	kube := fake.NewClientset(onA, onB, pending, boundElsewhere, boundHere)
	v := &volumeValidator{client: kube}

	noClaimRef := pvFor(onA)
	noClaimRef.Name, noClaimRef.Spec.ClaimRef = "static", nil
	noUID := pvFor(onA)
	noUID.Spec.ClaimRef.UID = ""
	// A PV for a claim that was deleted, or deleted and created again,
	// while its volume was made: the PV controller releases it and its
	// reclaim policy applies, as before the check.
	earlier := pvFor(scheduledClaim("on-a", "node-a"))
	earlier.Name, earlier.Spec.ClaimRef.UID = "pvc-uid-of-an-earlier-claim", "uid-of-an-earlier-claim"
	gone := pvFor(scheduledClaim("gone", "node-a"))
	// PVs that external-provisioner never makes: a second one for the
	// claim, one the PV controller would take the claimRef off once the
	// claim is bound elsewhere (and then give to any claim), and ones
	// that do not match the claim or are not diskfit's.
	second := pvFor(onA)
	second.Name = "decoy"
	boundByController := pvFor(onA)
	boundByController.Annotations["pv.kubernetes.io/bound-by-controller"] = "yes"
	// The PV controller looks for the key, whatever its value.
	boundByControllerEmpty := pvFor(onA)
	boundByControllerEmpty.Annotations["pv.kubernetes.io/bound-by-controller"] = ""
	otherModes := pvFor(onA)
	otherModes.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
	otherClass := pvFor(onA)
	otherClass.Spec.StorageClassName = "fast"
	smaller := pvFor(onA)
	smaller.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Mi")}
	block := pvFor(onA)
	block.Spec.VolumeMode = ptr.To(v1.PersistentVolumeBlock)
	otherDriver := pvFor(onA)
	otherDriver.Spec.CSI.Driver = "ebs.csi.aws.com"
	hostPath := pvFor(onA)
	hostPath.Spec.CSI, hostPath.Spec.HostPath = nil, &v1.HostPathVolumeSource{Path: "/var/lib"}
	recycle := pvFor(onA)
	recycle.Spec.PersistentVolumeReclaimPolicy = v1.PersistentVolumeReclaimRecycle
	otherProvisioner := scheduledClaim("other-provisioner", "node-a")
	otherProvisioner.Annotations[storageProvisionerAnnotation] = "ebs.csi.aws.com"
	kube.Tracker().Add(otherProvisioner)

	for _, tt := range []struct {
		name string
		pv   *v1.PersistentVolume
		node string
		want string // "" allowed, else a fragment of the refusal
	}{
		{"for a claim scheduled here", pvFor(onA), "node-a", ""},
		{"again for a claim bound to it", pvFor(boundHere), "node-a", ""},
		{"for a claim scheduled to another node", pvFor(onB), "node-a", "claim app/on-b is scheduled to node-b"},
		{"for a claim scheduled nowhere", pvFor(pending), "node-a", "claim app/pending is scheduled to no node"},
		{"for a claim bound to another PV", pvFor(boundElsewhere), "node-a", "claim app/bound-elsewhere is bound to PV pvc-other"},
		{"for an earlier claim of that name", earlier, "node-a", ""},
		{"for a claim that is gone", gone, "node-a", ""},
		{"pre-bound by name only", noUID, "node-a", "names no claim by namespace, name and UID"},
		{"for no claim", noClaimRef, "node-a", "PV static names no claim"},
		{"with a token bound to no node", pvFor(onA), "", "bound to no node may not create PVs"},
		{"a second one for the claim", second, "node-a", "PV decoy is not named pvc-uid-on-a"},
		{"marked bound by the PV controller", boundByController, "node-a", "pv.kubernetes.io/bound-by-controller"},
		{"marked bound by the PV controller, empty", boundByControllerEmpty, "node-a", "pv.kubernetes.io/bound-by-controller"},
		{"of other access modes", otherModes, "node-a", "access modes [ReadWriteMany], not the claim's [ReadWriteOnce]"},
		{"of another class", otherClass, "node-a", `of class "fast", not the claim's "diskfit"`},
		{"smaller than the claim", smaller, "node-a", "capacity 1Mi, which is less than the claim's request 1Gi"},
		{"of another volume mode", block, "node-a", "volume mode Block, not the claim's Filesystem"},
		{"of another driver", otherDriver, "node-a", "not a CSI volume of local.diskfit.io"},
		{"of another volume source", hostPath, "node-a", "not a CSI volume of local.diskfit.io"},
		{"recycled", recycle, "node-a", "reclaim policy Recycle"},
		{"for another provisioner's claim", pvFor(otherProvisioner), "node-a", "claim app/other-provisioner is not provisioned by local.diskfit.io"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, outcome := v.admit(context.Background(), pvCreate(t, tt.pv, tt.node))
			if tt.want == "" {
				if !resp.Allowed || outcome != outcomeAllowed {
					t.Fatalf("refused (%s): %+v", outcome, resp.Result)
				}
				return
			}
			if resp.Allowed || outcome != outcomeDenied {
				t.Fatalf("allowed (%s), want a refusal saying %q", outcome, tt.want)
			}
			if resp.Result.Code != http.StatusForbidden || resp.Result.Reason != metav1.StatusReasonForbidden ||
				!strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("refusal %d %s %q, want 403 Forbidden saying %q", resp.Result.Code, resp.Result.Reason, resp.Result.Message, tt.want)
			}
		})
	}
}

// When the claim cannot be read the PV is refused (the provisioner tries
// again), and updates, deletes and other kinds are left to the policy.
func TestVolumeValidatorFailsClosed(t *testing.T) {
	kube := fake.NewClientset()
	kube.PrependReactor("get", "persistentvolumeclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	v := &volumeValidator{client: kube}
	onA := scheduledClaim("on-a", "node-a")
	resp, outcome := v.admit(context.Background(), pvCreate(t, pvFor(onA), "node-a"))
	if resp.Allowed || outcome != outcomeError || resp.Result.Code != http.StatusInternalServerError {
		t.Errorf("claim unreadable: allowed %v, outcome %s, result %+v; want refused with 500", resp.Allowed, outcome, resp.Result)
	}
	update := pvCreate(t, pvFor(onA), "node-a")
	update.Operation = admissionv1.Update
	if resp, outcome := v.admit(context.Background(), update); !resp.Allowed || outcome != outcomeSkipped {
		t.Errorf("update: allowed %v, outcome %s; want skipped", resp.Allowed, outcome)
	}
}

// Through the server: the review of a PV refused comes back as a denied
// AdmissionReview, and the validating configuration gets the caBundle.
func TestServerAnswersVolumeReviews(t *testing.T) {
	onB := scheduledClaim("on-b", "node-b")
	ts := startServer(t, onB, volumeWebhookConfig())
	ts.url = strings.TrimSuffix(ts.url, MutatePath) + ValidateVolumePath
	status, body := ts.post(t, "application/json", reviewOf(t, pvCreate(t, pvFor(onB), "node-a")))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, review); err != nil {
		t.Fatal(err)
	}
	if review.Response == nil || review.Response.Allowed || !strings.Contains(review.Response.Result.Message, "scheduled to node-b") {
		t.Errorf("response %+v, want the PV refused", review.Response)
	}
	cfg, err := ts.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(context.Background(), volumeConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mutating, err := ts.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), configName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(cfg.Webhooks[0].ClientConfig.CABundle), string(mutating.Webhooks[0].ClientConfig.CABundle); got == "" || got != want {
		t.Errorf("validating caBundle %q, want the mutating one %q", got, want)
	}
}

func volumeWebhookConfig() *admissionregistrationv1.ValidatingWebhookConfiguration {
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: volumeConfigName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:                    "volumes.node.diskfit.io",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1" + ValidateVolumePath)},
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
}

// With no MutatingWebhookConfiguration (manifests/overlays/
// webhook-volumes-only), the webhook checks the nodes' PVs and sets no
// pod's scheduler, even when a configuration left from an earlier
// install still sends it pods; and it is ready without caches of every
// claim and class, which the check does not use.
func TestVolumesOnlyWebhookMutatesNothing(t *testing.T) {
	kube := fake.NewClientset(volumeWebhookConfig(), scheduledClaim("on-b", "node-b"))
	s, err := New(Config{
		Client: kube, Namespace: webhookNamespace, Hosts: []string{"127.0.0.1"}, SecretName: secretName,
		VolumeWebhookConfigName: volumeConfigName, Address: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	pod := makePod("p").withClaim("data").Pod
	resp, err := http.Post(srv.URL+MutatePath, "application/json", bytes.NewReader(reviewOf(t, podCreate(t, pod))))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("a pod review: status %d, want 404 (nothing mutated; failurePolicy Ignore creates the pod as it is)", resp.StatusCode)
	}
	resp, err = http.Post(srv.URL+ValidateVolumePath, "application/json", bytes.NewReader(reviewOf(t, pvCreate(t, pvFor(scheduledClaim("on-b", "node-b")), "node-a"))))
	if err != nil {
		t.Fatal(err)
	}
	review := &admissionv1.AdmissionReview{}
	if err := json.NewDecoder(resp.Body).Decode(review); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if review.Response == nil || review.Response.Allowed {
		t.Errorf("a PV for a claim scheduled elsewhere: %+v, want it refused", review.Response)
	}

	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	defer func() {
		cancel()
		<-served
	}()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return s.Ready(), nil
	}); err != nil {
		t.Fatalf("not ready: %v", err)
	}
	for _, a := range kube.Actions() {
		if a.GetVerb() == "list" || a.GetVerb() == "watch" {
			t.Errorf("the volumes-only webhook %ss %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}
