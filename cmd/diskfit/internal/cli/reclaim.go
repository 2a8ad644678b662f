package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/apis/diskfit/v1alpha1"
)

// reclaimOptions are diskfit reclaim's flags and arguments.
type reclaimOptions struct {
	node, handle  string
	dryRun, force bool
	timeout       time.Duration
}

// The diskfit driver never deletes a volume that once had a PV on its own.
// reclaim deletes one through the path Kubernetes itself deletes volumes
// by: it makes a PV for the volume with reclaim policy Delete, bound to a
// claim that does not exist. The PV controller marks it Released, and the
// external-provisioner of the volume's node calls DeleteVolume and then
// deletes the PV, with every check the driver makes for any DeleteVolume
// (a volume still attached on its node is refused). Whoever runs it needs
// to create PersistentVolumes: a cluster admin.
func newReclaimCommand(streams genericiooptions.IOStreams, d deps) *cobra.Command {
	o := &reclaimOptions{}
	cmd := &cobra.Command{
		Use:   "reclaim NODE VOLUME",
		Short: "Delete a volume that no PersistentVolume refers to any more, and its data",
		Long: "reclaim deletes, data and all, a volume that the diskfit driver of NODE keeps " +
			"although no PersistentVolume refers to it (its PV was deleted with reclaim " +
			"policy Retain, or lost). diskfit status lists such volumes; VOLUME is the " +
			"volume handle it shows. reclaim makes a PV for the volume with reclaim " +
			"policy Delete bound to a claim that does not exist, so Kubernetes deletes it " +
			"the usual way (the node's external-provisioner calls DeleteVolume and " +
			"removes the PV), and waits for that; a volume not deleted within --timeout " +
			"(the node's driver refused: it is still staged, a snapshot depends on it, a PV " +
			"still refers to it) is kept and its PV taken back, so no deletion stays pending. It refuses a volume that a PV refers to " +
			"or that NODE's DiskNode does not list without one, and, unless --force, a volume " +
			"the claim it was made for still waits for (its PV may not have been saved yet, " +
			"or the claim is bound to it under a PV that is gone). It needs the rights to read claims and " +
			"create PersistentVolumes.",
		Example: "  diskfit reclaim node-a nvme0:pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f\n" +
			"  diskfit reclaim node-a nvme0:pvc-3f0c2a4e-8f0b-4c2e-9d59-1f2b3c4d5e6f --dry-run",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.node, o.handle = args[0], args[1]
			c, err := d.clients()
			if err != nil {
				return err
			}
			return o.run(cmd.Context(), c, streams)
		},
	}
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "print the PV reclaim would create and create nothing")
	cmd.Flags().BoolVar(&o.force, "force", false, "reclaim the volume even though the claim it was made for still waits for it")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "how long to wait for the volume to be deleted before calling the deletion off (the volume is kept); 0 does not wait, and the deletion stays pending until it succeeds")
	return cmd
}

func (o *reclaimOptions) run(ctx context.Context, c *Clients, streams genericiooptions.IOStreams) error {
	dn, err := c.DiskFit.DiskfitV1alpha1().DiskNodes().Get(ctx, o.node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading DiskNode %s: %w", o.node, err)
	}
	vol, ok := findWithoutPV(dn, o.handle)
	if !ok {
		return fmt.Errorf("node %s does not report volume %s without a PersistentVolume (diskfit status %s lists those it does)", o.node, o.handle, o.node)
	}
	// The DiskNode may be a few seconds old: a PV made since then wins.
	pvs, err := c.Kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	for _, pv := range pvs.Items {
		if diskfit.PVRefersTo(&pv, o.node, o.handle) {
			return fmt.Errorf("PersistentVolume %s refers to volume %s: delete it (with reclaim policy Delete) instead", pv.Name, o.handle)
		}
	}
	if vol.Claim != "" && !o.force {
		if err := claimDoesNotWait(ctx, c, o.node, vol, pvs.Items); err != nil {
			return err
		}
	}
	pv := reclaimPV(o.node, vol)
	if o.dryRun {
		return printEncoded(streams.Out, "yaml", pv)
	}
	if _, err := c.Kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating PersistentVolume %s: %w", pv.Name, err)
	}
	fmt.Fprintf(streams.Out, "Created PersistentVolume %s (reclaim policy Delete, bound to no claim) for volume %s on node %s.\n", pv.Name, o.handle, o.node)
	if o.timeout <= 0 {
		return nil
	}
	var last *v1.PersistentVolume
	err = wait.PollUntilContextTimeout(ctx, time.Second, o.timeout, true, func(ctx context.Context) (bool, error) {
		got, err := c.Kube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		last = got
		return false, nil
	})
	if err != nil {
		return o.takeBack(ctx, c, pv.Name, last)
	}
	fmt.Fprintf(streams.Out, "Deleted volume %s on node %s.\n", o.handle, o.node)
	return nil
}

// takeBack takes back the PV reclaim made, once the volume was not deleted
// in time: its reclaim policy set to Retain, then the PV deleted. Left in
// place, the provisioner would go on retrying DeleteVolume and succeed
// whenever the cause goes away, maybe after an admin gave the volume a PV
// again to keep its data. It returns the error to report, with the PV's
// last warning as the reason.
func (o *reclaimOptions) takeBack(ctx context.Context, c *Clients, name string, last *v1.PersistentVolume) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	why := lastWarning(ctx, c, name)
	if why == "" && last != nil {
		why = "PersistentVolume " + name + " is " + string(last.Status.Phase)
	}
	notDeleted := fmt.Sprintf("volume %s on node %s was not deleted within %s (%s)", o.handle, o.node, o.timeout, why)
	patch := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
	_, err := c.Kube.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err == nil {
		err = c.Kube.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		// Deleted in the meantime, volume and all.
		return nil
	case err != nil:
		return fmt.Errorf("%s, and taking back PersistentVolume %s failed: %w; its deletion is still pending: to keep the volume, "+
			"kubectl patch pv %s -p '{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Retain\"}}' and kubectl delete pv %s", notDeleted, name, err, name, name)
	}
	return fmt.Errorf("%s; the volume is kept, its deletion called off (PersistentVolume %s deleted with reclaim policy Retain): run reclaim again once that is fixed", notDeleted, name)
}

// lastWarning returns the newest warning event about PV name, or "" when
// there is none or it cannot be read. Events of cluster-scoped objects are
// in the default namespace.
func lastWarning(ctx context.Context, c *Clients, name string) string {
	e, err := latestEvent(ctx, c, metav1.NamespaceDefault, "PersistentVolume", name, ",type=Warning", func(e *v1.Event) bool {
		return e.Type == v1.EventTypeWarning
	})
	if err != nil || e == nil {
		return ""
	}
	return e.Reason + ": " + e.Message
}

// claimDoesNotWait refuses a volume that the claim it was made for still
// waits for (diskfit.ClaimWaitsFor), as the driver's orphan sweep keeps
// it: a PV saved later would point at nothing.
func claimDoesNotWait(ctx context.Context, c *Clients, node string, vol v1alpha1.VolumeWithoutPV, pvs []v1.PersistentVolume) error {
	namespace, name, _ := strings.Cut(vol.Claim, "/")
	claim, err := c.Kube.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading claim %s, which volume %s was made for: %w", vol.Claim, vol.VolumeHandle, err)
	}
	waits, pvOfName := diskfit.ClaimWaitsFor(claim, vol.VolumeHandle, node)
	// A PV of the bound name that exists refers to another node's volume
	// (one referring to this one was refused above).
	if waits && pvOfName && slices.ContainsFunc(pvs, func(pv v1.PersistentVolume) bool { return pv.Name == claim.Spec.VolumeName }) {
		waits = false
	}
	if !waits {
		return nil
	}
	why := "its PersistentVolume may not have been saved yet"
	if pvOfName {
		why = "it is bound to it under PersistentVolume " + claim.Spec.VolumeName + ", which is gone; re-create that PV to give the claim its data back"
	}
	return fmt.Errorf("claim %s still waits for volume %s (%s): delete the claim first, or use --force to delete the volume and its data anyway", vol.Claim, vol.VolumeHandle, why)
}

// findWithoutPV returns the DiskNode's entry for a volume without a PV.
func findWithoutPV(dn *v1alpha1.DiskNode, handle string) (v1alpha1.VolumeWithoutPV, bool) {
	for _, d := range dn.Status.Disks {
		for _, v := range d.WithoutPV {
			if v.VolumeHandle == handle {
				return v, true
			}
		}
	}
	return v1alpha1.VolumeWithoutPV{}, false
}

// reclaimPV is a PV for vol on node that Kubernetes deletes with the
// volume: reclaim policy Delete, the provisioned-by annotation that makes
// the node's external-provisioner take it, node affinity to the node (a
// provisioner in --node-deployment mode deletes only its node's volumes),
// and a claim reference with a UID that no claim has, which the PV
// controller reads as a claim deleted: the PV is Released at once.
func reclaimPV(node string, vol v1alpha1.VolumeWithoutPV) *v1.PersistentVolume {
	sum := sha256.Sum256([]byte(node + "/" + vol.VolumeHandle))
	name := "diskfit-reclaim-" + hex.EncodeToString(sum[:8])
	size := max(vol.SizeBytes, 1)
	return &v1.PersistentVolume{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{provisionedByAnnotation: diskfit.DriverName, reclaimOfAnnotation: vol.VolumeHandle},
		},
		Spec: v1.PersistentVolumeSpec{
			Capacity:                      v1.ResourceList{v1.ResourceStorage: *resource.NewQuantity(size, resource.BinarySI)},
			AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: diskfit.DriverName, VolumeHandle: vol.VolumeHandle,
			}},
			ClaimRef: &v1.ObjectReference{
				APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: metav1.NamespaceDefault, Name: name,
				UID: types.UID(uuid.NewUUID()),
			},
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: diskfit.TopologyKey, Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
}

const (
	// provisionedByAnnotation names the provisioner that deletes a PV.
	provisionedByAnnotation = "pv.kubernetes.io/provisioned-by"
	// reclaimOfAnnotation marks PVs made by diskfit reclaim.
	reclaimOfAnnotation = "diskfit.io/reclaim-of"
)
