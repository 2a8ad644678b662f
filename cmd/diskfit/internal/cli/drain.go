package cli

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/lifecycle"
)

// drainOptions are diskfit drain's flags and argument.
type drainOptions struct {
	target          target
	release, dryRun bool
	reason          string
	timeout         time.Duration
	poll            time.Duration
}

func newDrainCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &drainOptions{poll: d.poll}
	cmd := &cobra.Command{
		Use:   "drain NODE[/DISK]",
		Short: "Cordon a disk, or a node's disks, list the claims still on it and move those that may be moved",
		Long: "drain cordons NODE/DISK (or every disk of NODE) as diskfit cordon does, then lists " +
			"the claims whose volumes are still there, with the pods using them, their " +
			"StatefulSet and what their " + diskfit.OnDiskLossAnnotation + " annotation (on the claim " +
			"or its StorageClass) asks for. With --release, each claim that asked to be released " +
			"(" + diskfit.OnDiskLossAnnotation + "=" + diskfit.OnDiskLossRelease + ") is: its PV's reclaim " +
			"policy becomes Retain, so the volume and its data stay on the disk, the claim is " +
			"deleted and its pods are evicted, so that the StatefulSet recreates both and the new " +
			"volume lands on another disk. It goes one replica at a time: it waits until the other " +
			"replicas are up and the pods' PodDisruptionBudget allows their eviction before it " +
			"touches a replica, and until the replica's pod runs again with its new claim bound " +
			"before the next, and stops when either takes longer than --timeout, so a workload " +
			"never loses two replicas to a drain. A claim whose pod no StatefulSet owns is released " +
			"without waiting. Other claims stay. --dry-run changes nothing and prints what would be " +
			"done. It needs the right to update DiskNodes, patch PVs, delete claims and evict pods " +
			"(create pods/eviction).",
		Example: "  diskfit drain node-a/nvme0 --reason 'SMART errors'\n" +
			"  diskfit drain node-a/nvme0 --release --dry-run\n" +
			"  diskfit drain node-a --release --timeout 20m",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.target, err = parseTarget(args[0]); err != nil {
				return err
			}
			if o.timeout <= 0 {
				return fmt.Errorf("--timeout must be positive: drain waits for each replica before the next")
			}
			c, err := d.clients()
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), c, streams.Out)
		},
	}
	cmd.Flags().BoolVar(&o.release, "release", false, "release the claims that asked for it, one replica at a time")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "change nothing; print what would be done")
	cmd.Flags().StringVar(&o.reason, "reason", "", "why the disk is cordoned, for people (kept when not given)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 10*time.Minute, "how long to wait for each released replica to run again")
	return cmd
}

// drainClaim is a claim on a drained disk, with the pods on its node and
// on no node that use it, and the StatefulSet that owns them.
type drainClaim struct {
	diskClaim
	pods []v1.Pod
	// statefulSet is the name of the StatefulSet that owns the claim's
	// pods, empty when none does.
	statefulSet string
	// owner describes the pods' controller, "-" when they have none.
	owner string
}

// podNames is the names of the claim's pods, joined by commas.
func (d drainClaim) podNames() string { return podNames(d.pods) }

// released says which pods releasing the claim evicts, those on the
// node, joined by commas, and which pods stay: those on no node yet, which
// their StatefulSet gives a new claim.
func (d drainClaim) released() (evicted, staying string) {
	var on, off []string
	for _, p := range d.pods {
		if p.Spec.NodeName == "" {
			off = append(off, p.Name)
		} else {
			on = append(on, p.Name)
		}
	}
	switch {
	case len(off) == 0:
	case d.statefulSet != "":
		staying = fmt.Sprintf(" Pod %s, on no node yet, stays: its StatefulSet gives it a new claim.", strings.Join(off, ","))
	default:
		staying = fmt.Sprintf(" Pod %s, on no node yet, stays, waiting for a claim of that name: no StatefulSet makes one.", strings.Join(off, ","))
	}
	return strings.Join(on, ","), staying
}

// drainReplica is the claims released together: those of one pod. Deleting
// one deletes the pod, so its other claims on the disk go with it rather
// than keep the new pod on the drained node.
type drainReplica struct {
	claims []drainClaim
}

func (r drainReplica) name() string {
	first := r.claims[0]
	if pods := first.podNames(); pods != "" {
		return first.PVC.Namespace + "/" + pods
	}
	return "claim " + first.key()
}

func (o *drainOptions) run(ctx context.Context, c *Clients, out io.Writer) error {
	t := o.target
	dn, err := t.getDiskNode(ctx, c)
	if err != nil {
		return err
	}
	if o.dryRun {
		verb := "Would cordon"
		if !applyUnschedulable(dn.Spec.DeepCopy(), t.disk, true, o.reason) {
			verb = "Already cordoned:"
		}
		fmt.Fprintf(out, "%s %s (dry run: nothing is changed).\n", verb, t)
	} else if _, err := setUnschedulable(ctx, c, t, true, o.reason, out); err != nil {
		return err
	}
	claims, err := o.claims(ctx, c)
	if err != nil {
		return err
	}
	if len(claims) == 0 {
		fmt.Fprintf(out, "No claims on %s.\n", t)
		return nil
	}
	fmt.Fprintf(out, "\nClaims on %s:\n", t)
	if err := printDrainClaims(out, claims); err != nil {
		return err
	}
	var replicas []drainReplica
	var staying []string
	for _, cl := range claims {
		if !cl.release {
			staying = append(staying, cl.key())
			continue
		}
		replicas = addToReplica(replicas, cl)
	}
	if !o.release {
		o.advise(out, len(claims), len(replicas) > 0)
		return nil
	}
	fmt.Fprintln(out)
	var kept []drainClaim
	for i, r := range replicas {
		if o.dryRun {
			o.describeRelease(out, r)
			continue
		}
		released, err := o.releaseReplica(ctx, c, out, r)
		kept = append(kept, released...)
		if err != nil {
			var next []string
			for _, r := range replicas[i+1:] {
				next = append(next, r.name())
			}
			printKept(out, kept)
			if len(next) > 0 {
				return fmt.Errorf("%w; not released: %s (run drain again once it runs)", err, strings.Join(next, ", "))
			}
			return err
		}
	}
	if len(replicas) == 0 {
		fmt.Fprintln(out, "No claim on it asked to be released: nothing to release.")
	}
	printKept(out, kept)
	if len(staying) > 0 {
		fmt.Fprintf(out, "Staying (not opted in, %s is not %s): %s\n", diskfit.OnDiskLossAnnotation, diskfit.OnDiskLossRelease, strings.Join(staying, ", "))
	}
	if !o.dryRun {
		fmt.Fprintf(out, "The disks stay cordoned; diskfit uncordon %s puts them back into service.\n", t.arg())
	}
	return nil
}

// claims lists the claims on the drained disks, with their pods.
func (o *drainOptions) claims(ctx context.Context, c *Clients) ([]drainClaim, error) {
	on, err := claimsOn(ctx, c, o.target.has)
	if err != nil {
		return nil, err
	}
	out := make([]drainClaim, 0, len(on))
	for _, cl := range on {
		// The pods on no node are listed too, to wait for their replica;
		// a release does not delete them.
		pods, err := lifecycle.PodsUsing(ctx, c.Kube, cl.PVC, cl.loc.Node, "")
		if err != nil {
			return nil, err
		}
		slices.SortFunc(pods, func(a, b v1.Pod) int { return cmp.Compare(a.Name, b.Name) })
		d := drainClaim{diskClaim: cl, pods: pods, owner: "-"}
		for _, p := range pods {
			if ref := metav1.GetControllerOf(&p); ref != nil {
				d.owner = ref.Kind + " " + ref.Name
				if ref.Kind == "StatefulSet" {
					d.statefulSet = ref.Name
				}
				break
			}
		}
		out = append(out, d)
	}
	return out, nil
}

// addToReplica adds cl to the replica of its pods, or to a new one.
func addToReplica(replicas []drainReplica, cl drainClaim) []drainReplica {
	if pods := cl.podNames(); pods != "" {
		for i := range replicas {
			if r := &replicas[i]; r.claims[0].PVC.Namespace == cl.PVC.Namespace && r.claims[0].podNames() == pods {
				r.claims = append(r.claims, cl)
				return replicas
			}
		}
	}
	return append(replicas, drainReplica{claims: []drainClaim{cl}})
}

func printDrainClaims(out io.Writer, claims []drainClaim) error {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "CLAIM\tDISK\tPV\tPODS\tOWNER\tON DISK LOSS")
	for _, cl := range claims {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", cl.key(), cl.loc.Disk, cl.PV.Name, cmp.Or(cl.podNames(), "-"), cl.owner, cl.onDiskLoss())
	}
	return flushTrimmed(w, &buf, out)
}

// advise says what an admin can do about the claims that stay.
func (o *drainOptions) advise(out io.Writer, n int, anyRelease bool) {
	t := o.target
	fmt.Fprintf(out, "\n%d claim(s) stay on %s; no new volume is placed there.\n", n, t)
	fmt.Fprintln(out, "To move them off:")
	if anyRelease {
		fmt.Fprintf(out, "  - diskfit drain %s --release releases those marked %s: each claim is deleted and its pod evicted, one replica\n"+
			"    at a time, so that its StatefulSet recreates them on another disk; the old PV is kept (reclaim policy Retain).\n",
			t.arg(), diskfit.OnDiskLossRelease)
	}
	fmt.Fprintf(out, "  - mark a claim first (kubectl annotate pvc -n NAMESPACE NAME %s=%s, or the parameter on its StorageClass)\n"+
		"    and run diskfit drain %s --release;\n", diskfit.OnDiskLossAnnotation, diskfit.OnDiskLossRelease, t.arg())
	fmt.Fprintln(out, "  - or move the data yourself: copy it to a new claim, then delete the old claim and its pod.")
}

// describeRelease says what releaseReplica would do.
func (o *drainOptions) describeRelease(out io.Writer, r drainReplica) {
	for _, cl := range r.claims {
		evicted, staying := cl.released()
		if evicted != "" {
			evicted = " and evict pod " + evicted
		}
		fmt.Fprintf(out, "Would release claim %s: set PV %s to reclaim policy Retain, delete the claim%s.%s\n", cl.key(), cl.PV.Name, evicted, staying)
	}
	if sts := r.claims[0].statefulSet; sts != "" {
		fmt.Fprintf(out, "  Then wait up to %s for StatefulSet %s to run %s again with a new bound claim.\n", o.timeout, sts, r.name())
	} else {
		fmt.Fprintf(out, "  %s: no wait.\n", r.noStatefulSet())
	}
}

// noStatefulSet says why nothing recreates a replica no StatefulSet owns.
func (r drainReplica) noStatefulSet() string {
	if r.claims[0].podNames() == "" {
		return "No pod on its node uses it"
	}
	return "No StatefulSet owns " + r.name()
}

// releaseReplica releases the replica's claims and waits for its
// StatefulSet to run it again. It returns the claims it released.
//
// Its pods are evicted, not deleted, so that their PodDisruptionBudget
// has its say: drain waits until the budget allows the eviction (a dry
// run, which changes nothing) before it touches the replica, then makes
// the PVs Retain, deletes the claims and evicts the pods. An eviction the
// budget refuses in between (another drain, or kubectl drain, took the
// disruption) is asked again up to the timeout: the pod keeps running on
// its volume meanwhile, its claim being deleted, and a drain run again
// finishes the release.
func (o *drainOptions) releaseReplica(ctx context.Context, c *Clients, out io.Writer, r drainReplica) ([]drainClaim, error) {
	if err := o.waitForTheOthers(ctx, c, out, r); err != nil {
		return nil, err
	}
	if err := o.waitForTheBudget(ctx, c, out, r); err != nil {
		return nil, err
	}
	var released []drainClaim
	for _, cl := range r.claims {
		// The claim was listed before earlier replicas' waits: it is
		// released as it is now, if it still asks for it.
		now, err := lifecycle.StillReleasedOnDiskLoss(ctx, c.Kube, cl.Claim)
		if err == nil {
			err = lifecycle.DeleteClaimKeepingData(ctx, c.Kube, now)
		}
		if err != nil {
			err = fmt.Errorf("releasing claim %s: %w", cl.key(), err)
			if len(released) > 0 {
				err = fmt.Errorf("%w; claim %s deleted already, its pods running on: run drain --release again to finish", err, claimKeys(released))
			}
			return released, err
		}
		released = append(released, cl)
	}
	if err := o.evict(ctx, c, r); err != nil {
		return released, err
	}
	for _, cl := range released {
		evicted, staying := cl.released()
		if evicted != "" {
			evicted = ", pod " + evicted + " evicted"
		}
		fmt.Fprintf(out, "Released claim %s: PV %s kept (reclaim policy Retain), claim deleted%s.%s\n", cl.key(), cl.PV.Name, evicted, staying)
	}
	sts := r.claims[0].statefulSet
	if sts == "" {
		fmt.Fprintf(out, "  %s: not waiting.\n", r.noStatefulSet())
		return released, nil
	}
	fmt.Fprintf(out, "  Waiting up to %s for StatefulSet %s to run %s again with a new bound claim...\n", o.timeout, sts, r.name())
	var state []string
	err := wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, false, func(ctx context.Context) (bool, error) {
		state = replicaState(ctx, c, r)
		return len(state) == 0, nil
	})
	if ctx.Err() != nil {
		return released, fmt.Errorf("interrupted while waiting for replica %s of StatefulSet %s: %w", r.name(), sts, ctx.Err())
	}
	if err != nil {
		return released, fmt.Errorf("replica %s of StatefulSet %s is not back after %s: %s", r.name(), sts, o.timeout, strings.Join(state, ", "))
	}
	fmt.Fprintf(out, "  %s is running again.\n", r.name())
	return released, nil
}

// waitForTheBudget waits, up to the timeout, until the API server would
// evict every pod of r on its node now (lifecycle.CheckEviction): their
// PodDisruptionBudget allows it. Nothing of r is changed before.
func (o *drainOptions) waitForTheBudget(ctx context.Context, c *Clients, out io.Writer, r drainReplica) error {
	refusal := func(ctx context.Context) error {
		for _, p := range r.podsOnNode() {
			if err := lifecycle.CheckEviction(ctx, c.Kube, &p); err != nil {
				return err
			}
		}
		return nil
	}
	refused := refusal(ctx)
	if refused == nil || !apierrors.IsTooManyRequests(refused) {
		return notReleased(r, refused)
	}
	fmt.Fprintf(out, "  Waiting up to %s for the PodDisruptionBudget of %s to allow its eviction: %v...\n", o.timeout, r.name(), refused)
	err := wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, false, func(ctx context.Context) (bool, error) {
		refused = refusal(ctx)
		return refused == nil, ignoreTooManyRequests(refused)
	})
	if err != nil && ctx.Err() == nil && refused != nil {
		err = refused
	}
	return notReleased(r, err)
}

// notReleased says that r was not released, because of err, and in what
// state it is left: as it was, or with its claims being deleted by a
// release begun before (the pods still run on their volumes).
func notReleased(r drainReplica, err error) error {
	if err == nil {
		return nil
	}
	var begun []drainClaim
	for _, cl := range r.claims {
		if cl.PVC.DeletionTimestamp != nil {
			begun = append(begun, cl)
		}
	}
	state := "nothing of it changed"
	if len(begun) > 0 {
		state = fmt.Sprintf("claim %s being deleted since a release begun before, its pods running on", claimKeys(begun))
	}
	advice := "run drain again"
	if apierrors.IsTooManyRequests(err) {
		advice += " once its PodDisruptionBudget allows a disruption"
	}
	return fmt.Errorf("%s not released (%s): %w; %s", r.name(), state, err, advice)
}

// evict evicts r's pods on its node once its claims are deleted, asking
// again while a PodDisruptionBudget refuses, up to the timeout. The pods
// no StatefulSet makes again go first and the replica's own last: its
// eviction is the one that takes the replica down, and a pod refused after
// it would keep the claim (PVC protection), so that the new replica could
// never be scheduled. Each dry run passed, but dry runs are not counted:
// a budget that allows one disruption refuses the second pod. A pod is
// evicted only once every pod before it is.
func (o *drainOptions) evict(ctx context.Context, c *Clients, r drainReplica) error {
	var pods []v1.Pod
	for _, cl := range r.claims {
		got, err := lifecycle.PodsOfReleasedClaim(ctx, c.Kube, cl.PVC, cl.loc.Node)
		if err != nil {
			return o.notEvicted(r, nil, pods, err)
		}
		for _, p := range got {
			if !slices.ContainsFunc(pods, func(q v1.Pod) bool { return q.UID == p.UID }) {
				pods = append(pods, p)
			}
		}
	}
	slices.SortStableFunc(pods, func(a, b v1.Pod) int { return cmp.Compare(madeAgain(a), madeAgain(b)) })
	for i, p := range pods {
		var refused error
		err := wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, true, func(ctx context.Context) (bool, error) {
			refused = lifecycle.EvictPod(ctx, c.Kube, &p)
			return refused == nil, ignoreTooManyRequests(refused)
		})
		if err != nil {
			if ctx.Err() == nil && refused != nil {
				err = refused
			}
			return o.notEvicted(r, pods[:i], pods[i:], err)
		}
	}
	return nil
}

// madeAgain is 1 for a pod a StatefulSet makes again, 0 for others.
func madeAgain(p v1.Pod) int {
	if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "StatefulSet" {
		return 1
	}
	return 0
}

// notEvicted says that r's claims are deleted but its pods left not
// evicted because of err, and which were.
func (o *drainOptions) notEvicted(r drainReplica, evicted, left []v1.Pod, err error) error {
	var done string
	if len(evicted) > 0 {
		done = ", pod " + podNames(evicted) + " evicted"
	}
	stay := "its pods keep"
	if len(left) > 0 {
		stay = "pod " + podNames(left) + " keeps"
	}
	return fmt.Errorf("claim %s deleted, its PV kept (reclaim policy Retain)%s, but pod %s was not evicted: %w; "+
		"%s running on the volume until evicted: run drain --release again to finish",
		claimKeys(r.claims), done, cmp.Or(podNames(left[:min(1, len(left))]), "-"), err, stay)
}

// podNames is the names of pods, joined by commas.
func podNames(pods []v1.Pod) string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return strings.Join(names, ",")
}

// claimKeys is the namespaced names of claims, joined by commas.
func claimKeys(claims []drainClaim) string {
	keys := make([]string, len(claims))
	for i, cl := range claims {
		keys[i] = cl.key()
	}
	return strings.Join(keys, ", ")
}

// ignoreTooManyRequests is err, or nil for a refusal to try again later.
func ignoreTooManyRequests(err error) error {
	if apierrors.IsTooManyRequests(err) {
		return nil
	}
	return err
}

// podsOnNode is r's pods on their claims' node: those a release evicts.
func (r drainReplica) podsOnNode() []v1.Pod {
	var pods []v1.Pod
	for _, cl := range r.claims {
		for _, p := range cl.pods {
			if p.Spec.NodeName != "" && !slices.ContainsFunc(pods, func(q v1.Pod) bool { return q.UID == p.UID }) {
				pods = append(pods, p)
			}
		}
	}
	return pods
}

// waitForTheOthers waits, up to the timeout, until every other replica of
// r's StatefulSet is up (podUp), so that releasing r never takes a second
// replica down at once: one that crash-loops or is Pending, or a replica
// this drain, or one interrupted before it, released and that is not back
// yet. A replica no StatefulSet owns waits for nothing.
func (o *drainOptions) waitForTheOthers(ctx context.Context, c *Clients, out io.Writer, r drainReplica) error {
	set, err := statefulSetOf(ctx, c, r)
	if err != nil || set == nil {
		return err
	}
	down, err := othersDown(ctx, c, set, r)
	if err != nil || len(down) == 0 {
		return err
	}
	fmt.Fprintf(out, "  Waiting up to %s for the other replicas of StatefulSet %s before releasing %s: %s...\n", o.timeout, set.Name, r.name(), strings.Join(down, ", "))
	err = wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, false, func(ctx context.Context) (bool, error) {
		down, err = othersDown(ctx, c, set, r)
		return err == nil && len(down) == 0, err
	})
	if err != nil {
		return fmt.Errorf("%s not released: StatefulSet %s has other replicas down (%s); releasing it now would take one more down: "+
			"run drain again once they run: %w", r.name(), set.Name, strings.Join(down, ", "), err)
	}
	return nil
}

// statefulSetOf returns the StatefulSet r is a replica of, nil for none:
// the one that owns its pods or, for a replica without pods (its pod
// deleted a moment ago), the one whose claim template, name and ordinal
// (below spec.replicas) make its claim's name. A set gone makes no pods
// again: nil.
func statefulSetOf(ctx context.Context, c *Clients, r drainReplica) (*appsv1.StatefulSet, error) {
	first := r.claims[0]
	ns := first.PVC.Namespace
	if name := first.statefulSet; name != "" {
		set, err := c.Kube.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading StatefulSet %s/%s: %w", ns, name, err)
		}
		return set, nil
	}
	if first.podNames() != "" {
		return nil, nil
	}
	sets, err := c.Kube.AppsV1().StatefulSets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the StatefulSets of %s: %w", ns, err)
	}
	for i := range sets.Items {
		set := &sets.Items[i]
		for _, tmpl := range set.Spec.VolumeClaimTemplates {
			rest, ok := strings.CutPrefix(first.PVC.Name, tmpl.Name+"-"+set.Name+"-")
			ordinal, err := strconv.Atoi(rest)
			if ok && err == nil && ordinal >= 0 && set.Spec.Replicas != nil && ordinal < int(*set.Spec.Replicas) {
				return set, nil
			}
		}
	}
	return nil, nil
}

// othersDown says which replicas of set, other than r, are not up: its
// pods that are not, and how many it lacks of spec.replicas besides r's.
func othersDown(ctx context.Context, c *Clients, set *appsv1.StatefulSet, r drainReplica) ([]string, error) {
	mine := map[string]bool{}
	for _, cl := range r.claims {
		for _, p := range cl.pods {
			mine[p.Name] = true
		}
	}
	pods, err := c.Kube.CoreV1().Pods(set.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of StatefulSet %s/%s: %w", set.Namespace, set.Name, err)
	}
	var down []string
	others := 0
	for _, p := range pods.Items {
		ref := metav1.GetControllerOf(&p)
		if ref == nil || ref.UID != set.UID || mine[p.Name] {
			continue
		}
		others++
		if why := podUp(&p); why != "" {
			down = append(down, "pod "+p.Name+" is "+why)
		}
	}
	// r is one replica, with or without its pod.
	if set.Spec.Replicas != nil && int32(others) < *set.Spec.Replicas-1 {
		down = append(down, fmt.Sprintf("StatefulSet %s has %d of its %d pods", set.Name, others+len(mine), *set.Spec.Replicas))
	}
	slices.Sort(down)
	return down, nil
}

// podUp returns why pod p is not up (Running, Ready and not being
// deleted), or "" when it is.
func podUp(p *v1.Pod) string {
	switch {
	case p.DeletionTimestamp != nil:
		return "being deleted"
	case p.Status.Phase != v1.PodRunning:
		return string(cmp.Or(p.Status.Phase, "new"))
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady && c.Status == v1.ConditionTrue {
			return ""
		}
	}
	return "not Ready"
}

// replicaState says what is missing for the replica to be back: its pods,
// recreated (another UID; a pod that was on no node stays) and up (podUp),
// and its claims, recreated and Bound. It is empty when nothing is.
func replicaState(ctx context.Context, c *Clients, r drainReplica) []string {
	var missing []string
	seen := map[string]bool{}
	for _, cl := range r.claims {
		for _, p := range cl.pods {
			if seen[p.Name] {
				continue
			}
			seen[p.Name] = true
			got, err := c.Kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			s := recreated("pod", p.Name, p.UID, got, err)
			if p.Spec.NodeName == "" && err == nil {
				// A pod on no node is not deleted (it never ran on the
				// volume): its StatefulSet gives it the new claim.
				s = ""
			}
			if s == "" {
				if why := podUp(got); why != "" {
					s = "pod " + p.Name + " is " + why
				}
			}
			if s != "" {
				missing = append(missing, s)
			}
		}
		got, err := c.Kube.CoreV1().PersistentVolumeClaims(cl.PVC.Namespace).Get(ctx, cl.PVC.Name, metav1.GetOptions{})
		if s := recreated("claim", cl.PVC.Name, cl.PVC.UID, got, err); s != "" {
			missing = append(missing, s)
		} else if got.Status.Phase != v1.ClaimBound {
			missing = append(missing, fmt.Sprintf("claim %s is %s", cl.PVC.Name, cmp.Or(got.Status.Phase, "new")))
		}
	}
	return missing
}

// recreated says why the object read as got (or err) is not yet the new
// one that replaces the object of UID old: empty when it is.
func recreated(kind, name string, old types.UID, got metav1.Object, err error) string {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("%s %s is not recreated yet", kind, name)
	case err != nil:
		return fmt.Sprintf("%s %s cannot be read: %v", kind, name, err)
	case got.GetUID() == old:
		return fmt.Sprintf("%s %s is still the old one", kind, name)
	}
	return ""
}

// printKept lists the PVs released claims left behind with their data.
func printKept(out io.Writer, kept []drainClaim) {
	if len(kept) == 0 {
		return
	}
	fmt.Fprintln(out, "\nKept with their data (reclaim policy Retain):")
	for _, cl := range kept {
		fmt.Fprintf(out, "  PV %s on %s/%s, was claim %s\n", cl.PV.Name, cl.loc.Node, cl.loc.Disk, cl.key())
	}
	fmt.Fprintln(out, "Once a PV's data is not needed, let Kubernetes delete it and its volume:")
	fmt.Fprintln(out, `  kubectl patch pv NAME -p '{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}'`)
}
