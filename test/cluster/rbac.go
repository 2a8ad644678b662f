package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/diskfit/diskfit/test/cluster/controlplane"
)

// The API server authorizes with RBAC, and every diskfit component and
// sidecar runs with a token of the ServiceAccount its manifests give it, so
// the suite proves that the manifests' roles are enough and a missing verb
// shows as "forbidden" in a component's log. Only the kubelets (nodes, not
// diskfit's) and the controllers inside this process keep the admin
// identity.

// rbacManifests hold the ServiceAccounts, roles and bindings, and the
// admission policies that say who may write what; other objects in them
// (the snapshot-controller Deployment) are skipped.
var rbacManifests = []string{
	"base/namespace.yaml",
	"base/node/rbac.yaml",
	"base/controller/rbac.yaml",
	"base/policy/selected-disk.yaml",
	"base/policy/disknode-own-node.yaml",
	"base/policy/volumes-own-node.yaml",
	"base/policy/snapshots-own-node.yaml",
	"base/policy/wait-for-first-consumer.yaml",
	"scheduler/rbac.yaml",
	"snapshot/snapshot-controller.yaml",
	"webhook/rbac.yaml",
	"webhook/policy.yaml",
}

// The ServiceAccounts of the manifests, by component.
var (
	nodeAccount               = serviceAccount{"diskfit-system", "diskfit-csi-node"}
	schedulerAccount          = serviceAccount{"diskfit-system", "diskfit-scheduler"}
	controllerAccount         = serviceAccount{"diskfit-system", "diskfit-controller"}
	snapshotControllerAccount = serviceAccount{"kube-system", "snapshot-controller"}
)

type serviceAccount struct{ namespace, name string }

// applyRBAC creates the namespace, ServiceAccounts, roles and bindings of
// the manifests.
func applyRBAC(ctx context.Context, c *Cluster) error {
	for _, file := range rbacManifests {
		path := filepath.Join(c.opts.RepoRoot, "manifests", file)
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
		for {
			doc, err := reader.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := createRBACObject(ctx, c, obj); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
	}
	return nil
}

func createRBACObject(ctx context.Context, c *Cluster, obj runtime.Object) error {
	var err error
	opts := metav1.CreateOptions{}
	switch o := obj.(type) {
	case *v1.Namespace:
		_, err = c.Client.CoreV1().Namespaces().Create(ctx, o, opts)
	case *v1.ServiceAccount:
		_, err = c.Client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = c.Client.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *rbacv1.Role:
		_, err = c.Client.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.RoleBinding:
		_, err = c.Client.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
	case *admissionv1.ValidatingAdmissionPolicy:
		_, err = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, opts)
	case *admissionv1.ValidatingAdmissionPolicyBinding:
		_, err = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, opts)
	default:
		return nil
	}
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// kubeconfigFor writes a kubeconfig that authenticates as the
// ServiceAccount, with a token that outlives any run, and reaches the API
// server through the cluster's proxy; it returns its path.
func (c *Cluster) kubeconfigFor(ctx context.Context, sa serviceAccount) (string, error) {
	return c.kubeconfigWithToken(ctx, sa, "kubeconfig-"+sa.namespace+"-"+sa.name, nil)
}

// kubeconfigForNode is kubeconfigFor with a token bound to the Node, as a
// DaemonSet pod's token is bound to its pod on that node: it carries the
// node's name, which the manifests' DiskNode policy checks.
func (c *Cluster) kubeconfigForNode(ctx context.Context, sa serviceAccount, node string) (string, error) {
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	ref := &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID}
	return c.kubeconfigWithToken(ctx, sa, "kubeconfig-"+sa.namespace+"-"+sa.name+"-"+node, ref)
}

func (c *Cluster) kubeconfigWithToken(ctx context.Context, sa serviceAccount, file string, bound *authenticationv1.BoundObjectReference) (string, error) {
	path := filepath.Join(c.Dir, file)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(sa.namespace).CreateToken(ctx, sa.name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](7 * 24 * 3600), BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for ServiceAccount %s/%s: %w", sa.namespace, sa.name, err)
	}
	config := rest.AnonymousClientConfig(c.Config)
	config.BearerToken = tr.Status.Token
	// Through the proxy, so that tests can cut the components off.
	config.Host = "https://" + c.proxy.Addr()
	return path, controlplane.WriteKubeconfig(config, path)
}
