package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/diskfit/diskfit/apis/client/clientset/versioned"
)

// A node's driver writes only its own node's DiskNode: with node-a's
// driver token (bound to the Node node-a, as a DaemonSet pod's token is
// bound to its pod on that node), rewriting node-a's status passes, and
// node-b's is refused by the manifests' admission policy, as is any write
// with a token of the node ServiceAccount bound to no node.
func TestNodeWritesOnlyItsOwnDiskNode(t *testing.T) {
	needLocal(t)
	ctx := ctxFor(t, 2*time.Minute)
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(localDir, "kubeconfig-diskfit-system-diskfit-csi-node-node-a"))
	if err != nil {
		t.Fatal(err)
	}
	asNodeA, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts("diskfit-system").CreateToken(ctx, "diskfit-csi-node", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unbound := rest.AnonymousClientConfig(restConfig)
	unbound.BearerToken = tr.Status.Token
	asNoNode, err := versioned.NewForConfig(unbound)
	if err != nil {
		t.Fatal(err)
	}
	// rewrite writes a DiskNode's status back as it is: the write, not
	// its content, is what the policy judges.
	rewrite := func(client versioned.Interface, node string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			dn, err := client.DiskfitV1alpha1().DiskNodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = client.DiskfitV1alpha1().DiskNodes().UpdateStatus(context.Background(), dn, metav1.UpdateOptions{})
			return err
		})
	}
	refused := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may write only the DiskNode of the node its token is bound to") {
			t.Errorf("%s: %v, want the admission policy's refusal", what, err)
		}
	}
	if err := rewrite(asNodeA, "node-a"); err != nil {
		t.Errorf("node-a's driver writing node-a's DiskNode: %v", err)
	}
	refused("node-a's driver writing node-b's DiskNode", rewrite(asNodeA, "node-b"))
	refused("a token bound to no node writing node-a's DiskNode", rewrite(asNoNode, "node-a"))
}
