package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/diskfit"
)

// The cluster of the mutation table: a diskfit class, another driver's
// class, and claims of each.
func mutationCluster(defaultProvisioner string) []runtime.Object {
	objects := []runtime.Object{
		storageClass("fast", diskfit.DriverName),
		storageClass("ebs", otherDriver),
		claim("data", ptr.To("fast")),
		claim("other", ptr.To("ebs")),
		claim("no-class", ptr.To("")),
		claim("unknown-class", ptr.To("gone")),
		claim("defaulted", nil),
		boundClaim("bound-without-class", nil, "pv-1"),
	}
	betaAnnotated := claim("beta-annotated", nil)
	betaAnnotated.Annotations = map[string]string{v1.BetaStorageClassAnnotation: "fast"}
	objects = append(objects, betaAnnotated)
	if defaultProvisioner != "" {
		// The newer default class wins, as in the DefaultStorageClass
		// admission plugin.
		now := time.Now()
		objects = append(objects,
			defaultStorageClass("old-default", otherDriver, now.Add(-time.Hour)),
			defaultStorageClass("default", defaultProvisioner, now))
	}
	return objects
}

func TestMutation(t *testing.T) {
	tests := []struct {
		name               string
		defaultClassDriver string
		pod                podWrapper
		// modify changes the request of creating pod.
		modify      func(*admissionv1.AdmissionRequest)
		wantPatched bool
		wantOutcome string
	}{{
		name:        "diskfit claim, no scheduler",
		pod:         makePod("p").withClaim("data"),
		wantPatched: true,
		wantOutcome: outcomeMutated,
	}, {
		name:        "diskfit claim, default scheduler",
		pod:         makePod("p").withScheduler(v1.DefaultSchedulerName).withClaim("data"),
		wantPatched: true,
		wantOutcome: outcomeMutated,
	}, {
		name:        "diskfit claim after other volumes",
		pod:         makePod("p").withEmptyDir("tmp").withClaim("other").withClaim("data"),
		wantPatched: true,
		wantOutcome: outcomeMutated,
	}, {
		name:        "other driver's claim",
		pod:         makePod("p").withClaim("other"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "diskfit class in the beta annotation",
		pod:         makePod("p").withClaim("beta-annotated"),
		wantPatched: true,
		wantOutcome: outcomeMutated,
	}, {
		name:        "claim of no class",
		pod:         makePod("p").withClaim("no-class"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "claim of a class that does not exist",
		pod:         makePod("p").withClaim("unknown-class"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "no volumes",
		pod:         makePod("p").withEmptyDir("tmp"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "ephemeral volume of the diskfit class",
		pod:         makePod("p").withEphemeral("scratch", ptr.To("fast")),
		wantPatched: true,
		wantOutcome: outcomeMutated,
	}, {
		name:        "ephemeral volume of another class",
		pod:         makePod("p").withEphemeral("scratch", ptr.To("ebs")),
		wantOutcome: outcomeSkipped,
	}, {
		name:               "claim without class, diskfit is the default class",
		defaultClassDriver: diskfit.DriverName,
		pod:                makePod("p").withClaim("defaulted"),
		wantPatched:        true,
		wantOutcome:        outcomeMutated,
	}, {
		name:               "ephemeral volume without class, diskfit is the default class",
		defaultClassDriver: diskfit.DriverName,
		pod:                makePod("p").withEphemeral("scratch", nil),
		wantPatched:        true,
		wantOutcome:        outcomeMutated,
	}, {
		name:               "claim without class, another default class",
		defaultClassDriver: otherDriver,
		pod:                makePod("p").withClaim("defaulted"),
		wantOutcome:        outcomeSkipped,
	}, {
		name:        "claim without class, no default class",
		pod:         makePod("p").withClaim("defaulted"),
		wantOutcome: outcomeSkipped,
	}, {
		name:               "bound claim without class, diskfit is the default class",
		defaultClassDriver: diskfit.DriverName,
		pod:                makePod("p").withClaim("bound-without-class"),
		wantOutcome:        outcomeSkipped,
	}, {
		name:        "another custom scheduler",
		pod:         makePod("p").withScheduler("batch-scheduler").withClaim("data"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "diskfit-scheduler already",
		pod:         makePod("p").withScheduler(diskfit.SchedulerName).withClaim("data"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "opted out by annotation",
		pod:         makePod("p").withAnnotation(OptOutKey, OptOutValue).withClaim("data"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "opted out by label",
		pod:         makePod("p").withLabel(OptOutKey, OptOutValue).withClaim("data"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "claim does not exist",
		pod:         makePod("p").withClaim("not-yet"),
		wantOutcome: outcomeSkipped,
	}, {
		name:        "pod update",
		pod:         makePod("p").withClaim("data"),
		modify:      func(req *admissionv1.AdmissionRequest) { req.Operation = admissionv1.Update },
		wantOutcome: outcomeSkipped,
	}, {
		name: "not a pod",
		pod:  makePod("p").withClaim("data"),
		modify: func(req *admissionv1.AdmissionRequest) {
			req.Kind = metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}
			req.Resource = metav1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
		},
		wantOutcome: outcomeSkipped,
	}, {
		name:        "pod that does not decode",
		pod:         makePod("p"),
		modify:      func(req *admissionv1.AdmissionRequest) { req.Object.Raw = []byte(`{"spec":{"volumes":"not a list"}}`) },
		wantOutcome: outcomeError,
	}}
	// One cluster per default class.
	servers := map[string]*testServer{}
	for _, driver := range []string{"", diskfit.DriverName, otherDriver} {
		servers[driver] = startServer(t, mutationCluster(driver)...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := servers[tt.defaultClassDriver]
			req := podCreate(t, tt.pod.Pod)
			if tt.modify != nil {
				tt.modify(req)
			}
			before, err := testutil.GetCounterMetricValue(ts.requests.WithLabelValues(tt.wantOutcome))
			if err != nil {
				t.Fatal(err)
			}
			status, body := ts.post(t, "application/json", reviewOf(t, req))
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			review := &admissionv1.AdmissionReview{}
			if err := json.Unmarshal(body, review); err != nil {
				t.Fatalf("decoding the answer: %v\n%s", err, body)
			}
			if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
				t.Errorf("answer is a %s %s, want admission.k8s.io/v1 AdmissionReview", review.APIVersion, review.Kind)
			}
			resp := review.Response
			if resp == nil || !resp.Allowed || resp.UID != req.UID {
				t.Fatalf("response %+v, want allowed with UID %q", resp, req.UID)
			}
			if patched := resp.Patch != nil; patched != tt.wantPatched {
				t.Fatalf("patched %v (%s), want %v", patched, resp.Patch, tt.wantPatched)
			}
			if tt.wantPatched {
				checkSchedulerPatch(t, req.Object.Raw, resp)
			}
			if gotWarning := len(resp.Warnings) > 0; gotWarning != (tt.wantOutcome == outcomeError) {
				t.Errorf("warnings %q, want some only for an error", resp.Warnings)
			}
			after, err := testutil.GetCounterMetricValue(ts.requests.WithLabelValues(tt.wantOutcome))
			if err != nil {
				t.Fatal(err)
			}
			if after != before+1 {
				t.Errorf("%s requests counted %v, then %v; want one more", tt.wantOutcome, before, after)
			}
		})
	}
}

// checkSchedulerPatch applies the response's patch to the pod and checks
// that it sets the scheduler name and nothing else.
func checkSchedulerPatch(t *testing.T, rawPod []byte, resp *admissionv1.AdmissionResponse) {
	t.Helper()
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
	}
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(rawPod)
	if err != nil {
		t.Fatalf("applying %s: %v", resp.Patch, err)
	}
	var before, after v1.Pod
	if err := json.Unmarshal(rawPod, &before); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(patched, &after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.SchedulerName != diskfit.SchedulerName {
		t.Errorf("patched schedulerName %q, want %q", after.Spec.SchedulerName, diskfit.SchedulerName)
	}
	after.Spec.SchedulerName = before.Spec.SchedulerName
	if a, b := mustJSON(t, &after), mustJSON(t, &before); a != b {
		t.Errorf("patch changed more than the scheduler name:\n%s\n%s", b, a)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// Whatever is not an AdmissionReview gets an HTTP error, not an answer.
func TestBadRequests(t *testing.T) {
	ts := startServer(t)
	valid := reviewOf(t, podCreate(t, makePod("p").Pod))
	tests := []struct {
		name        string
		contentType string
		body        []byte
		wantStatus  int
	}{
		{name: "not JSON", contentType: "application/json", body: []byte("{not json"), wantStatus: http.StatusBadRequest},
		{name: "no request", contentType: "application/json", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), wantStatus: http.StatusBadRequest},
		{name: "v1beta1 review", contentType: "application/json", body: []byte(strings.Replace(string(valid), "admission.k8s.io/v1", "admission.k8s.io/v1beta1", 1)), wantStatus: http.StatusBadRequest},
		{name: "another kind", contentType: "application/json", body: []byte(strings.Replace(string(valid), `"AdmissionReview"`, `"Pod"`, 1)), wantStatus: http.StatusBadRequest},
		{name: "not JSON content", contentType: "text/plain", body: valid, wantStatus: http.StatusUnsupportedMediaType},
		{name: "valid", contentType: "application/json; charset=utf-8", body: valid, wantStatus: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := ts.post(t, tt.contentType, tt.body)
			if status != tt.wantStatus {
				t.Errorf("status %d (%s), want %d", status, body, tt.wantStatus)
			}
		})
	}
	resp, err := ts.client.Get(ts.url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: status %d, want %d", resp.StatusCode, http.StatusMethodNotAllowed)
	}
}

// newMutator returns a mutator whose caches are filled with cached and
// whose API server holds live.
func newMutator(t *testing.T, cached []runtime.Object, live *fake.Clientset) *mutator {
	t.Helper()
	factory := informers.NewSharedInformerFactory(fake.NewClientset(cached...), 0)
	claims, classes := factory.Core().V1().PersistentVolumeClaims(), factory.Storage().V1().StorageClasses()
	for _, obj := range cached {
		var err error
		switch obj := obj.(type) {
		case *v1.PersistentVolumeClaim:
			err = claims.Informer().GetIndexer().Add(obj)
		default:
			err = classes.Informer().GetIndexer().Add(obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return &mutator{client: live, claims: claims.Lister(), classes: classes.Lister()}
}

// A StatefulSet creates a pod right after its claims, possibly before the
// webhook's informer has seen them: a claim or class missing from the cache
// is read from the API server.
func TestNotYetInCache(t *testing.T) {
	tests := []struct {
		name        string
		cached      []runtime.Object
		live        []runtime.Object
		wantOutcome string
	}{{
		name:        "claim only in the API server",
		cached:      []runtime.Object{storageClass("fast", diskfit.DriverName)},
		live:        []runtime.Object{claim("data", ptr.To("fast"))},
		wantOutcome: outcomeMutated,
	}, {
		name:        "class only in the API server",
		cached:      []runtime.Object{claim("data", ptr.To("fast"))},
		live:        []runtime.Object{storageClass("fast", diskfit.DriverName)},
		wantOutcome: outcomeMutated,
	}, {
		name:        "neither anywhere",
		wantOutcome: outcomeSkipped,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMutator(t, tt.cached, fake.NewClientset(tt.live...))
			_, outcome := m.admit(context.Background(), podCreate(t, makePod("p").withClaim("data").Pod))
			if outcome != tt.wantOutcome {
				t.Errorf("outcome %s, want %s", outcome, tt.wantOutcome)
			}
		})
	}
}

// An API server error leaves the pod alone: allowed, not patched, with a
// warning.
func TestLookupErrorAllows(t *testing.T) {
	live := fake.NewClientset()
	live.PrependReactor("get", "storageclasses", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcd is on fire")
	})
	m := newMutator(t, []runtime.Object{claim("data", ptr.To("fast"))}, live)
	req := podCreate(t, makePod("p").withClaim("data").Pod)
	resp, outcome := m.admit(context.Background(), req)
	if outcome != outcomeError || !resp.Allowed || resp.Patch != nil || len(resp.Warnings) != 1 || resp.UID != req.UID {
		t.Errorf("outcome %s, response %+v; want an allowed, unpatched response with a warning", outcome, resp)
	}
}
