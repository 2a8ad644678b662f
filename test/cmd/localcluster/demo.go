package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/test/cluster"
)

// workload is a StatefulSet shape: replicas, each with the same claims.
type workload struct {
	replicas int
	claims   []claimSpec
}

type claimSpec struct {
	name string
	size int64
}

// The demo's workload: a database StatefulSet whose pods each need a data
// and a log volume, more replicas than the disks can hold.
var demoWorkload = workload{replicas: 12, claims: []claimSpec{{"data", 1536 << 20}, {"log", 768 << 20}}}

const demoClass = "diskfit-local"

// demo starts the local cluster, runs the same StatefulSet once with the
// diskfit scheduler and once with the default scheduler, and prints what
// happened to every pod and disk.
func demo(ctx context.Context, opts cluster.Options, keep bool) error {
	// external-provisioner's own default: what a cluster runs unless tuned.
	opts.CapacityPollInterval = time.Minute
	step("Starting a local cluster: etcd, kube-apiserver, controllers, diskfit-scheduler (with the default profile beside it),\n"+
		"  diskfit-controller, and %d nodes, each with a kubelet, diskfit-csi and its sidecars on loop-mounted XFS/ext4 disk images", len(opts.Nodes))
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer c.Stop()
	if keep {
		defer func() {
			fmt.Printf("\nThe cluster keeps running (KEEP=1): export KUBECONFIG=%s\nStop it with Ctrl-C.\n", c.Kubeconfig)
			<-ctx.Done()
		}()
	}
	d := &demoRun{kube: c.Client, disks: versioned.NewForConfigOrDie(c.Config)}
	step("The nodes' disks, as the drivers publish them (DiskNode objects)")
	if err := d.printDisks(ctx); err != nil {
		return err
	}
	if err := d.createClass(ctx); err != nil {
		return err
	}

	var results []outcome
	for _, scheduler := range []string{diskfit.SchedulerName, v1.DefaultSchedulerName} {
		step("Deploying StatefulSet %q with schedulerName %s: %d replicas, each with claims %s",
			"db", scheduler, demoWorkload.replicas, demoWorkload.claimsText())
		res, err := d.runWorkload(ctx, scheduler, demoWorkload)
		if err != nil {
			return err
		}
		results = append(results, res)
		d.printPods(res)
		step("Disks after the %s run", scheduler)
		if err := d.printDisks(ctx); err != nil {
			return err
		}
		if !keep || scheduler != v1.DefaultSchedulerName {
			step("Deleting the %s run and waiting for its volumes to be freed", scheduler)
			if err := d.cleanup(ctx, res.namespace); err != nil {
				return err
			}
		}
	}
	step("Summary (same workload, same empty disks)")
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "SCHEDULER\tPODS WITH ALL VOLUMES\tPODS PENDING\tPODS HALF-PROVISIONED\tRESOURCEEXHAUSTED RETRIES\tTIME")
	for _, r := range results {
		fmt.Fprintf(w, "%s\t%d/%d\t%d\t%d\t%d\t%s\n", r.scheduler, r.ready, demoWorkload.replicas, r.pending, r.stuck, r.exhausted, r.elapsed.Round(time.Second))
	}
	w.Flush()
	fmt.Println("\nPending pods of diskfit-scheduler say which disk is short; the default scheduler checks each claim against one\n" +
		"number per node (CSIStorageCapacity, refreshed every minute), so its pods can land where their claims do not fit together.")
	return nil
}

func step(format string, args ...any) {
	fmt.Printf("\n==> "+format+"\n", args...)
}

func (w workload) claimsText() string {
	var parts []string
	for _, c := range w.claims {
		parts = append(parts, fmt.Sprintf("%s %s", c.name, resource.NewQuantity(c.size, resource.BinarySI)))
	}
	return strings.Join(parts, " + ")
}

type demoRun struct {
	kube  kubernetes.Interface
	disks versioned.Interface
}

// outcome is what happened to one run of the workload.
type outcome struct {
	scheduler, namespace string
	pods                 []podOutcome
	ready, pending       int
	stuck, exhausted     int
	elapsed              time.Duration
}

type podOutcome struct {
	name, node, volumes, status string
}

func (d *demoRun) createClass(ctx context.Context) error {
	_, err := d.kube.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: demoClass},
		Provisioner:          diskfit.DriverName,
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		ReclaimPolicy:        ptr.To(v1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}, metav1.CreateOptions{})
	return err
}

func (d *demoRun) runWorkload(ctx context.Context, scheduler string, wl workload) (outcome, error) {
	res := outcome{scheduler: scheduler, namespace: "demo-" + strings.TrimSuffix(scheduler, "-scheduler")}
	if _, err := d.kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: res.namespace}}, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	labels := map[string]string{"app": "db"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(int32(wl.replicas)),
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					SchedulerName:                 scheduler,
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers:                    []v1.Container{{Name: "db", Image: "registry.k8s.io/pause:3.10"}},
				},
			},
		},
	}
	for _, c := range wl.claims {
		sts.Spec.VolumeClaimTemplates = append(sts.Spec.VolumeClaimTemplates, v1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: c.name},
			Spec: v1.PersistentVolumeClaimSpec{
				AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				StorageClassName: ptr.To(demoClass),
				Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{
					v1.ResourceStorage: *resource.NewQuantity(c.size, resource.BinarySI),
				}},
			},
		})
		sts.Spec.Template.Spec.Containers[0].VolumeMounts = append(sts.Spec.Template.Spec.Containers[0].VolumeMounts,
			v1.VolumeMount{Name: c.name, MountPath: "/" + c.name})
	}
	start := time.Now()
	if _, err := d.kube.AppsV1().StatefulSets(res.namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	// Settled: nothing changed for 20 s (a pod stuck in a reschedule loop
	// keeps changing, so it ends at the time limit).
	var last string
	lastChange := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 150*time.Second, false, func(ctx context.Context) (bool, error) {
		var err error
		if res, err = d.observe(ctx, res, wl); err != nil {
			return false, err
		}
		snapshot := fmt.Sprint(res.ready, res.pending, res.stuck, res.exhausted)
		if snapshot != last {
			last, lastChange = snapshot, time.Now()
			fmt.Printf("    %3ds  pods with all volumes: %d, pending: %d, half-provisioned: %d, ResourceExhausted retries: %d\n",
				int(time.Since(start).Seconds()), res.ready, res.pending, res.stuck, res.exhausted)
		}
		res.elapsed = lastChange.Sub(start)
		return res.ready == wl.replicas || time.Since(lastChange) > 20*time.Second, nil
	})
	if err != nil && ctx.Err() != nil {
		return res, err
	}
	return res, nil
}

// observe reads the pods, claims and events of a run.
func (d *demoRun) observe(ctx context.Context, res outcome, wl workload) (outcome, error) {
	pods, err := d.kube.CoreV1().Pods(res.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, err
	}
	pvcs, err := d.kube.CoreV1().PersistentVolumeClaims(res.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, err
	}
	events, err := d.kube.CoreV1().Events(res.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, err
	}
	pvByName := map[string]*v1.PersistentVolume{}
	pvs, err := d.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return res, err
	}
	for i := range pvs.Items {
		pvByName[pvs.Items[i].Name] = &pvs.Items[i]
	}
	claims := map[string]*v1.PersistentVolumeClaim{}
	for i := range pvcs.Items {
		claims[pvcs.Items[i].Name] = &pvcs.Items[i]
	}
	lastEvent := map[string]string{}
	exhaustedFor := map[string]int{}
	res.exhausted = 0
	sort.Slice(events.Items, func(i, j int) bool {
		return events.Items[i].LastTimestamp.Before(&events.Items[j].LastTimestamp)
	})
	for _, e := range events.Items {
		if e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, "ResourceExhausted") {
			n := int(max(e.Count, 1))
			res.exhausted += n
			exhaustedFor[e.InvolvedObject.Name] += n
		}
		if e.Reason == "FailedScheduling" {
			lastEvent[e.InvolvedObject.Name] = e.Message
		}
	}

	res.pods = res.pods[:0]
	res.ready, res.pending, res.stuck = 0, 0, 0
	sort.Slice(pods.Items, func(i, j int) bool { return ordinal(pods.Items[i].Name) < ordinal(pods.Items[j].Name) })
	for _, pod := range pods.Items {
		po := podOutcome{name: pod.Name, node: pod.Spec.NodeName}
		var vols []string
		bound, exhausted := 0, 0
		for _, c := range wl.claims {
			pvc := claims[c.name+"-"+pod.Name]
			if pvc == nil {
				continue
			}
			exhausted += exhaustedFor[pvc.Name]
			if pv := pvByName[pvc.Spec.VolumeName]; pv != nil && pv.Spec.CSI != nil {
				bound++
				node := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
				vols = append(vols, fmt.Sprintf("%s:%s/%s", c.name, node, pv.Spec.CSI.VolumeAttributes[diskfit.VolumeContextDiskKey]))
				if po.node == "" {
					po.node = "(" + node + ")"
				}
			} else {
				vols = append(vols, c.name+":-")
			}
		}
		po.volumes = strings.Join(vols, " ")
		switch {
		case bound == len(wl.claims) && pod.Spec.NodeName != "":
			res.ready++
			po.status = "all volumes bound"
		case bound > 0:
			res.stuck++
			po.status = fmt.Sprintf("half-provisioned: %d of %d volumes made, %d ResourceExhausted", bound, len(wl.claims), exhausted)
		default:
			res.pending++
			po.status = "Pending"
			if msg := lastEvent[pod.Name]; msg != "" {
				po.status = "Pending: " + shorten(msg)
			}
		}
		res.pods = append(res.pods, po)
	}
	return res, nil
}

func ordinal(name string) int {
	var n int
	_, _ = fmt.Sscanf(name[strings.LastIndex(name, "-")+1:], "%d", &n)
	return n
}

// shorten keeps the first per-node reason of a FailedScheduling message.
func shorten(msg string) string {
	if i := strings.Index(msg, ". preemption:"); i > 0 {
		msg = msg[:i]
	}
	if i := strings.Index(msg, ", 1 node"); i > 0 {
		msg = msg[:i] + ", ..."
	}
	return msg
}

func (d *demoRun) printPods(res outcome) {
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tNODE\tVOLUMES (claim:node/disk)\tSTATUS")
	for _, p := range res.pods {
		node := p.node
		if node == "" {
			node = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", p.name, node, p.volumes, p.status)
	}
	w.Flush()
}

func (d *demoRun) printDisks(ctx context.Context) error {
	// The drivers refresh DiskNodes every few seconds; wait for a fresh view.
	time.Sleep(6 * time.Second)
	list, err := d.disks.DiskfitV1alpha1().DiskNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tDISK\tCLASS\tCAPACITY\tUSED\tFREE\tVOLUMES\t")
	for _, dn := range list.Items {
		for _, disk := range dn.Status.Disks {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", dn.Name, disk.Name, disk.DeviceClass,
				gib(disk.CapacityBytes), gib(disk.CapacityBytes-disk.FreeBytes), gib(disk.FreeBytes), disk.VolumeCount,
				bar(disk.CapacityBytes-disk.FreeBytes, disk.CapacityBytes))
		}
	}
	return w.Flush()
}

func gib(n int64) string { return fmt.Sprintf("%.2fGi", float64(n)/(1<<30)) }

func bar(used, total int64) string {
	const width = 20
	if total <= 0 {
		return ""
	}
	n := int(used * width / total)
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func (d *demoRun) cleanup(ctx context.Context, ns string) error {
	if err := d.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pvs, err := d.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				return false, nil
			}
		}
		_, err = d.kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err != nil, nil
	})
}
