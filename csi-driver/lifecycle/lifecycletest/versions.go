package lifecycletest

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
)

// VersionPatches makes client apply JSON merge patches of resource as an
// API server does, which the fake does not: each write gives the object
// a new resourceVersion, and a patch that names a resourceVersion or UID
// other than the object's is refused with a Conflict.
func VersionPatches(client Client, resource string) {
	tracker := client.Tracker()
	version := 1000
	client.PrependReactor("patch", resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if p.GetPatchType() != types.MergePatchType {
			return false, nil, nil
		}
		gvr := p.GetResource()
		obj, err := tracker.Get(gvr, p.GetNamespace(), p.GetName())
		if err != nil {
			return true, nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		var pre struct {
			Metadata struct {
				UID             types.UID `json:"uid"`
				ResourceVersion string    `json:"resourceVersion"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(p.GetPatch(), &pre); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		if uid := pre.Metadata.UID; uid != "" && uid != m.GetUID() {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), p.GetName(),
				fmt.Errorf("precondition UID %s, object UID %s", uid, m.GetUID()))
		}
		if rv := pre.Metadata.ResourceVersion; rv != "" && rv != m.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), p.GetName(),
				fmt.Errorf("the object has been modified: precondition resourceVersion %s, object resourceVersion %s", rv, m.GetResourceVersion()))
		}
		was, err := json.Marshal(obj)
		if err != nil {
			return true, nil, err
		}
		patched, err := jsonpatch.MergePatch(was, p.GetPatch())
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		// Into a zero object: decoding into a copy would keep the keys
		// the patch removes.
		now := reflect.New(reflect.TypeOf(obj).Elem()).Interface().(runtime.Object)
		if err := json.Unmarshal(patched, now); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		nm, _ := meta.Accessor(now)
		version++
		nm.SetResourceVersion(strconv.Itoa(version))
		if err := tracker.Update(gvr, now, p.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, now, nil
	})
}
