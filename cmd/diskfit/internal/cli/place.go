package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	storagehelpers "k8s.io/component-helpers/storage/volume"
	"k8s.io/klog/v2"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/scheduler-plugin/fit"
	"github.com/diskfit/diskfit/scheduler-plugin/ledger"
	"github.com/diskfit/diskfit/scheduler-plugin/packing"
)

// clusterState is what the scheduler knows when it places a pod: the ledger fed
// from DiskNodes, PVs and PVCs exactly as DiskFit feeds it, the nodes, and
// the StorageClasses.
type clusterState struct {
	ledger  *ledger.Ledger
	nodes   []corev1.Node
	pvcs    map[types.NamespacedName]*corev1.PersistentVolumeClaim
	pvs     map[string]*corev1.PersistentVolume
	classes map[string]*storagev1.StorageClass
	// defaultClass is the class the API server gives a PVC without
	// storageClassName; empty when there is none.
	defaultClass string
}

// loadCluster lists what DiskFit watches (DiskNodes, PVs, PVCs and
// StorageClasses) and feeds it into a new ledger, which like the
// scheduler's counts an annotated claim only when its class is diskfit's.
func loadCluster(ctx context.Context, c *Clients) (*clusterState, error) {
	cl := &clusterState{
		ledger:  ledger.New(),
		pvcs:    map[types.NamespacedName]*corev1.PersistentVolumeClaim{},
		pvs:     map[string]*corev1.PersistentVolume{},
		classes: map[string]*storagev1.StorageClass{},
	}
	dns, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing DiskNodes: %w", err)
	}
	for i := range dns.Items {
		cl.ledger.SetDiskNode(&dns.Items[i])
	}
	pvs, err := c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PVs: %w", err)
	}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		cl.ledger.SetPV(pv)
		cl.pvs[pv.Name] = pv
	}
	pvcs, err := c.Kube.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing PVCs: %w", err)
	}
	for i := range pvcs.Items {
		pvc := &pvcs.Items[i]
		cl.ledger.SetPVC(pvc)
		cl.pvcs[types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}] = pvc
	}
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	cl.nodes = nodes.Items
	slices.SortFunc(cl.nodes, func(a, b corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	classes, err := c.Kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing StorageClasses: %w", err)
	}
	all := make([]*storagev1.StorageClass, 0, len(classes.Items))
	for i := range classes.Items {
		sc := &classes.Items[i]
		cl.classes[sc.Name] = sc
		all = append(all, sc)
		// Placed claims count only when their class is diskfit's, as in
		// the scheduler.
		cl.ledger.SetStorageClass(sc)
	}
	cl.defaultClass = diskfit.DefaultClass(all)
	return cl, nil
}

// plannedReplica is a replica before placement: its claims as the report
// shows them, the claims DiskFit still has to place, and the node its
// existing volumes tie it to.
type plannedReplica struct {
	report ReplicaReport
	// claims are sorted by packing.SortClaims; index maps a claim's key to
	// its row in report.Claims.
	claims []packing.Claim
	index  map[string]int
	// pin is the node of the replica's existing volumes; conflict says why
	// no node can take the replica when they are on different nodes.
	pin      string
	pinClaim string
	conflict string
}

// plan resolves a replica's claims: a StatefulSet's PVC that already
// exists is used as it is in the cluster (placed or bound, it ties the
// replica to its node and takes no new space; otherwise it is placed with
// its own size and class), every other claim is new.
func (cl *clusterState) plan(w *workload, r replica) (*plannedReplica, error) {
	p := &plannedReplica{report: ReplicaReport{Name: r.name, Claims: []ClaimReport{}}, index: map[string]int{}}
	for _, wc := range r.claims {
		pvc := wc.pvc
		existing := false
		if w.kind == "StatefulSet" {
			if live, ok := cl.pvcs[types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}]; ok {
				pvc, existing = live, true
			}
		}
		row := ClaimReport{Name: pvc.Name, SizeBytes: ledger.ClaimSize(pvc), Existing: existing}
		if existing {
			loc, placed, reason := cl.existingLocation(pvc)
			if placed || reason != "" {
				row.StorageClass = storagehelpers.GetPersistentVolumeClaimClass(pvc)
				row.Disk, row.Skipped = loc.Disk, reason
				if placed {
					p.addPin(loc.Node, pvc.Name)
				}
				p.report.Claims = append(p.report.Claims, row)
				continue
			}
		}
		sc, reason, err := cl.storageClass(pvc)
		if err != nil {
			return nil, fmt.Errorf("claim %s: %w", pvc.Name, err)
		}
		row.StorageClass = sc.Name
		if reason != "" {
			row.Skipped = reason
			p.report.Claims = append(p.report.Claims, row)
			continue
		}
		row.DeviceClass = sc.Parameters[diskfit.DeviceClassParameter]
		key := "simulate/" + r.name + "/" + pvc.Name
		p.index[key] = len(p.report.Claims)
		p.report.Claims = append(p.report.Claims, row)
		p.claims = append(p.claims, packing.Claim{Key: key, Name: wc.template, Size: row.SizeBytes, DeviceClass: row.DeviceClass})
	}
	packing.SortClaims(p.claims)
	return p, nil
}

func (p *plannedReplica) addPin(node, claim string) {
	switch {
	case p.pin == "":
		p.pin, p.pinClaim = node, claim
	case p.pin != node && p.conflict == "":
		p.conflict = fmt.Sprintf("claim %s is on node %s and claim %s on node %s", p.pinClaim, p.pin, claim, node)
	}
}

// existingLocation says where an existing PVC's volume is: placed is true
// for a bound diskfit volume or a claim the scheduler has placed. A PVC
// bound to another driver's volume gets a reason and is not diskfit's to
// place; neither placed nor a reason means it still waits for a disk.
func (cl *clusterState) existingLocation(pvc *corev1.PersistentVolumeClaim) (loc diskfit.Location, placed bool, reason string) {
	if pvc.Spec.VolumeName != "" {
		pv := cl.pvs[pvc.Spec.VolumeName]
		if pv == nil {
			return diskfit.Location{}, false, fmt.Sprintf("bound to PV %s, which does not exist", pvc.Spec.VolumeName)
		}
		if loc, ok := diskfit.PVLocation(pv); ok {
			return loc, true, ""
		}
		return diskfit.Location{}, false, fmt.Sprintf("bound to PV %s, not a diskfit volume", pv.Name)
	}
	if loc, ok := diskfit.PVCLocation(pvc); ok {
		return loc, true, ""
	}
	return diskfit.Location{}, false, ""
}

// storageClass returns a new claim's StorageClass (the default class when
// it names none) and, when the class is not diskfit's, why DiskFit leaves
// the claim alone. A class that does not exist is an error, as it keeps the
// pod from being scheduled at all.
func (cl *clusterState) storageClass(pvc *corev1.PersistentVolumeClaim) (*storagev1.StorageClass, string, error) {
	name := diskfit.ClaimClass(pvc, cl.defaultClass)
	if name == "" {
		return &storagev1.StorageClass{}, "no StorageClass and no default class", nil
	}
	sc := cl.classes[name]
	if sc == nil {
		return nil, "", fmt.Errorf("StorageClass %q not found", name)
	}
	if !diskfit.IsDiskFitClass(sc) {
		return sc, fmt.Sprintf("StorageClass %s is provisioned by %s, not %s", sc.Name, sc.Provisioner, diskfit.DriverName), nil
	}
	return sc, "", nil
}

// nodeExclusions says, per node, why it takes no pod of the workload
// whatever its disks hold, as the scheduler's other filters would.
func (cl *clusterState) nodeExclusions(logger klog.Logger, w *workload) (map[string]string, error) {
	pod := w.pod
	if pod == nil {
		pod = &corev1.Pod{}
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	noScheduleTaint := func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}
	out := map[string]string{}
	for i := range cl.nodes {
		node := &cl.nodes[i]
		if reason := nodeNotSchedulable(node); reason != "" {
			out[node.Name] = reason
			continue
		}
		if t, found := corev1helpers.FindMatchingUntoleratedTaint(logger, node.Spec.Taints, pod.Spec.Tolerations, noScheduleTaint, false); found {
			out[node.Name] = fmt.Sprintf("untolerated taint %s", t.ToString())
			continue
		}
		match, err := affinity.Match(node)
		if err != nil {
			return nil, fmt.Errorf("the pod template's node affinity: %w", err)
		}
		if !match {
			out[node.Name] = "does not match the pod's node selector or affinity"
		}
	}
	return out, nil
}

// nodeNotSchedulable says why a node takes no new pods at all: cordoned or
// not Ready.
func nodeNotSchedulable(node *corev1.Node) string {
	if node.Spec.Unschedulable {
		return "cordoned"
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				return ""
			}
			break
		}
	}
	return "not Ready"
}

// place puts a replica on the node whose disks DiskFit scores highest
// (ties: the first by name), as ev decides for the plugin, and reserves
// the space in the ledger, so the next replica sees it taken, as the
// scheduler's Reserve does.
func (cl *clusterState) place(p *plannedReplica, excluded map[string]string, ev *fit.Evaluator) error {
	r := &p.report
	best, bestScore := "", int64(-1)
	for i := range cl.nodes {
		name := cl.nodes[i].Name
		if p.pin != "" && name != p.pin {
			r.Rejections = append(r.Rejections, NodeRejection{Node: name,
				Reason: fmt.Sprintf("volume node affinity conflict: claim %s is on node %s", p.pinClaim, p.pin)})
			continue
		}
		if p.conflict != "" {
			r.Rejections = append(r.Rejections, NodeRejection{Node: name, Reason: p.conflict})
			continue
		}
		if reason := excluded[name]; reason != "" {
			r.Rejections = append(r.Rejections, NodeRejection{Node: name, Reason: reason})
			continue
		}
		var buf fit.Buffers
		result := ev.Evaluate(name, p.claims, &buf)
		if result.Reason != fit.Fits {
			r.Rejections = append(r.Rejections, NodeRejection{Node: name, Reason: ev.Message(result, p.claims)})
			continue
		}
		if score := ev.Score(result, p.claims); score > bestScore {
			best, bestScore = name, score
		}
	}
	if p.pin != "" && !slices.ContainsFunc(cl.nodes, func(n corev1.Node) bool { return n.Name == p.pin }) {
		r.Rejections = append(r.Rejections, NodeRejection{Node: p.pin, Reason: "the node of the replica's volumes does not exist"})
	}
	if best == "" {
		return nil
	}
	chosen, err := cl.ledger.Reserve(types.UID("simulate/"+r.Name), best, p.claims, ev.Options)
	if err != nil {
		// Pack just said the claims fit on these disks; the ledger runs
		// the same Pack on the same disks.
		return fmt.Errorf("reserving %s on node %s: %w", r.Name, best, err)
	}
	for i, c := range p.claims {
		r.Claims[p.index[c.Key]].Disk = chosen[i]
	}
	r.Fits, r.Node, r.Rejections = true, best, nil
	return nil
}

// joinRejections is a replica's rejections as one string, to group replicas
// that fail alike.
func joinRejections(rs []NodeRejection) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(r.Node)
		b.WriteString(": ")
		b.WriteString(r.Reason)
		b.WriteString("\n")
	}
	return b.String()
}
