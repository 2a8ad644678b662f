package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// workload is what diskfit simulate places: replicas of a pod, each with
// the same set of claims.
type workload struct {
	// kind is "StatefulSet", "PersistentVolumeClaim" or "Claims" (--claims).
	kind      string
	namespace string
	// name is the StatefulSet's name; empty for the other kinds.
	name string
	// schedulerName is the pod template's; empty when the input has no pod.
	schedulerName string
	// pod carries the pod template's node selector, affinity and
	// tolerations; nil when the input has no pod template.
	pod      *corev1.Pod
	replicas []replica
	// ignored lists the documents of the file that hold no claims, as
	// "Kind name".
	ignored []string
}

// replica is one pod of the workload and its claims.
type replica struct {
	name   string
	claims []workloadClaim
}

// workloadClaim is one PVC a replica uses.
type workloadClaim struct {
	// template is the claim's name in the workload: the
	// volumeClaimTemplate's or the PVC's name. Messages use it, so that
	// replicas failing for the same reason read the same.
	template string
	pvc      *corev1.PersistentVolumeClaim
}

// readWorkload reads a StatefulSet, or one or more PersistentVolumeClaims
// (as separate YAML documents or in a List), from r. source names r in
// errors. replicas overrides the StatefulSet's spec.replicas and repeats
// PVCs; negative means unset.
func readWorkload(r io.Reader, source, namespace string, replicas int32) (*workload, error) {
	docs, err := splitDocuments(r, source)
	if err != nil {
		return nil, err
	}
	var sets []*appsv1.StatefulSet
	var pvcs []*corev1.PersistentVolumeClaim
	var ignored []string
	for len(docs) > 0 {
		doc := docs[0]
		docs = docs[1:]
		var tm struct {
			metav1.TypeMeta `json:",inline"`
			Metadata        struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Items []json.RawMessage `json:"items"`
		}
		if err := yaml.Unmarshal(doc.data, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", doc.where, err)
		}
		gvk := tm.GroupVersionKind()
		switch {
		case tm.Kind == "":
			return nil, fmt.Errorf("%s: no kind: want a StatefulSet or PersistentVolumeClaims", doc.where)
		case gvk.Group == "apps" && gvk.Kind == "StatefulSet":
			sts := &appsv1.StatefulSet{}
			if err := yaml.UnmarshalStrict(doc.data, sts); err != nil {
				return nil, fmt.Errorf("%s: reading StatefulSet: %w", doc.where, err)
			}
			sets = append(sets, sts)
		case gvk.Group == "" && gvk.Kind == "PersistentVolumeClaim":
			pvc := &corev1.PersistentVolumeClaim{}
			if err := yaml.UnmarshalStrict(doc.data, pvc); err != nil {
				return nil, fmt.Errorf("%s: reading PersistentVolumeClaim: %w", doc.where, err)
			}
			pvcs = append(pvcs, pvc)
		case gvk.Group == "" && (gvk.Kind == "List" || gvk.Kind == "PersistentVolumeClaimList"):
			// kubectl get -o yaml: the items are documents of their own.
			items := make([]document, 0, len(tm.Items))
			for i, item := range tm.Items {
				items = append(items, document{where: fmt.Sprintf("%s, item %d", doc.where, i+1), data: item})
			}
			docs = append(items, docs...)
		default:
			ignored = append(ignored, strings.TrimSpace(tm.Kind+" "+tm.Metadata.Name))
		}
	}

	switch {
	case len(sets) > 1:
		return nil, fmt.Errorf("%s holds %d StatefulSets: simulate one at a time", source, len(sets))
	case len(sets) == 1 && len(pvcs) > 0:
		return nil, fmt.Errorf("%s holds a StatefulSet and PersistentVolumeClaims: simulate one or the other", source)
	case len(sets) == 1:
		w, err := statefulSetWorkload(sets[0], namespace, replicas)
		if err != nil {
			return nil, err
		}
		w.ignored = ignored
		return w, nil
	case len(pvcs) > 0:
		w, err := pvcWorkload(pvcs, namespace, replicas)
		if err != nil {
			return nil, err
		}
		w.ignored = ignored
		return w, nil
	}
	found := ""
	if len(ignored) > 0 {
		found = " (found " + strings.Join(ignored, ", ") + ")"
	}
	return nil, fmt.Errorf("no StatefulSet or PersistentVolumeClaim in %s%s: simulate takes a StatefulSet, PersistentVolumeClaims or --claims", source, found)
}

// document is one YAML or JSON document and where it came from.
type document struct {
	where string
	data  []byte
}

// splitDocuments splits a multi-document YAML (or JSON) stream, dropping
// empty documents.
func splitDocuments(r io.Reader, source string) ([]document, error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var docs []document
	for n := 1; ; n++ {
		data, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", source, err)
		}
		if isEmptyDocument(data) {
			continue
		}
		docs = append(docs, document{where: fmt.Sprintf("%s, document %d", source, n), data: data})
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s is empty", source)
	}
	return docs, nil
}

// isEmptyDocument reports whether a YAML document holds only blank lines
// and comments.
func isEmptyDocument(data []byte) bool {
	for _, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' && !bytes.Equal(line, []byte("---")) {
			return false
		}
	}
	return true
}

// statefulSetWorkload expands a StatefulSet into its pods and their claims
// as the StatefulSet controller names them: <template>-<set>-<ordinal>.
func statefulSetWorkload(sts *appsv1.StatefulSet, namespace string, replicas int32) (*workload, error) {
	if sts.Name == "" {
		return nil, errors.New("the StatefulSet has no name")
	}
	if len(sts.Spec.VolumeClaimTemplates) == 0 {
		return nil, fmt.Errorf("StatefulSet %s has no volumeClaimTemplates: nothing to place", sts.Name)
	}
	ns := cmp.Or(sts.Namespace, namespace, metav1.NamespaceDefault)
	n := int32(1)
	if sts.Spec.Replicas != nil {
		n = *sts.Spec.Replicas
	}
	if replicas >= 0 {
		n = replicas
	}
	start := int32(0)
	if sts.Spec.Ordinals != nil {
		start = sts.Spec.Ordinals.Start
	}
	w := &workload{
		kind:          "StatefulSet",
		namespace:     ns,
		name:          sts.Name,
		schedulerName: cmp.Or(sts.Spec.Template.Spec.SchedulerName, corev1.DefaultSchedulerName),
		pod:           &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns}, Spec: sts.Spec.Template.Spec},
	}
	for _, t := range sts.Spec.VolumeClaimTemplates {
		if err := checkRequest(&t, "volumeClaimTemplate "+t.Name); err != nil {
			return nil, err
		}
	}
	for i := start; i < start+n; i++ {
		pod := sts.Name + "-" + strconv.Itoa(int(i))
		r := replica{name: pod}
		for _, t := range sts.Spec.VolumeClaimTemplates {
			pvc := t.DeepCopy()
			pvc.Name = t.Name + "-" + pod
			pvc.Namespace = ns
			r.claims = append(r.claims, workloadClaim{template: t.Name, pvc: pvc})
		}
		w.replicas = append(w.replicas, r)
	}
	return w, nil
}

// pvcWorkload makes replicas of a pod using the PVCs: one by default.
func pvcWorkload(pvcs []*corev1.PersistentVolumeClaim, namespace string, replicas int32) (*workload, error) {
	w := &workload{kind: "PersistentVolumeClaim", namespace: cmp.Or(namespace, metav1.NamespaceDefault)}
	for i, pvc := range pvcs {
		if pvc.Name == "" {
			return nil, fmt.Errorf("PersistentVolumeClaim %d has no name", i+1)
		}
		if err := checkRequest(pvc, "PersistentVolumeClaim "+pvc.Name); err != nil {
			return nil, err
		}
		if pvc.Namespace == "" {
			pvc.Namespace = w.namespace
		}
	}
	w.replicas = repeatClaims(pvcs, replicas)
	return w, nil
}

// claimsWorkload is --claims 10Gi,2Gi: claims named claim-0, claim-1, ...
// of class storageClass ("" for the cluster's default class).
func claimsWorkload(sizes, storageClass, namespace string, replicas int32) (*workload, error) {
	w := &workload{kind: "Claims", namespace: cmp.Or(namespace, metav1.NamespaceDefault)}
	var pvcs []*corev1.PersistentVolumeClaim
	for i, s := range strings.Split(sizes, ",") {
		s = strings.TrimSpace(s)
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return nil, fmt.Errorf("invalid size %q in --claims: %w", s, err)
		}
		if q.Sign() <= 0 {
			return nil, fmt.Errorf("invalid size %q in --claims: must be positive", s)
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-" + strconv.Itoa(i), Namespace: w.namespace},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q}},
			},
		}
		if storageClass != "" {
			pvc.Spec.StorageClassName = &storageClass
		}
		pvcs = append(pvcs, pvc)
	}
	w.replicas = repeatClaims(pvcs, replicas)
	return w, nil
}

// repeatClaims makes replicas (at least one) named replica-0, replica-1,
// ... that each use copies of pvcs.
func repeatClaims(pvcs []*corev1.PersistentVolumeClaim, replicas int32) []replica {
	n := max(replicas, 1)
	out := make([]replica, 0, n)
	for i := range n {
		r := replica{name: "replica-" + strconv.Itoa(int(i))}
		for _, pvc := range pvcs {
			r.claims = append(r.claims, workloadClaim{template: pvc.Name, pvc: pvc.DeepCopy()})
		}
		out = append(out, r)
	}
	return out
}

// checkRequest rejects a claim without a positive storage request.
func checkRequest(pvc *corev1.PersistentVolumeClaim, what string) error {
	q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("%s has no storage request (spec.resources.requests.storage)", what)
	}
	if q.Sign() <= 0 {
		return fmt.Errorf("%s requests %s: must be positive", what, q.String())
	}
	return nil
}
