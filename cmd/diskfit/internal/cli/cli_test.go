package cli

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	kubefake "k8s.io/client-go/kubernetes/fake"

	dffake "github.com/diskfit/diskfit/apis/client/clientset/versioned/fake"
)

// testNow is the clock of every test: fixtures are placed relative to it.
var testNow = time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)

// runCommand runs the diskfit root command with args against fake
// clientsets holding objs (DiskNodes go to the diskfit clientset, the rest
// to the Kubernetes one) and returns stdout, stderr and the error.
func runCommand(t *testing.T, namespace string, kubeObjs, diskfitObjs []runtime.Object, args ...string) (string, string, error) {
	t.Helper()
	return runCommandWithInput(t, "", namespace, kubeObjs, diskfitObjs, args...)
}

// runCommandWithInput is runCommand with stdin.
func runCommandWithInput(t *testing.T, stdin, namespace string, kubeObjs, diskfitObjs []runtime.Object, args ...string) (string, string, error) {
	t.Helper()
	clients := &Clients{
		Kube:      kubefake.NewClientset(kubeObjs...),
		DiskFit:   dffake.NewSimpleClientset(diskfitObjs...),
		Namespace: namespace,
	}
	return runWith(clients, stdin, args...)
}

// runWith runs the diskfit root command with args against clients, which
// a test can look at afterwards, and returns stdout, stderr and the error.
func runWith(clients *Clients, stdin string, args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	cmd := newRootCommand(genericiooptions.IOStreams{In: bytes.NewBufferString(stdin), Out: &out, ErrOut: &errOut}, deps{
		clients: func() (*Clients, error) { return clients, nil },
		now:     func() time.Time { return testNow },
		poll:    time.Millisecond,
	})
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// checkResult compares a command's stdout and error with the wanted ones;
// when an error is wanted, only the error is compared.
func checkResult(t *testing.T, out string, err error, wantOut, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || err.Error() != wantErr {
			t.Fatalf("error = %v, want %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
	if diff := cmp.Diff(wantOut, out); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
}
