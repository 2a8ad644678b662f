// Package chart renders diskfit's Helm chart (manifests/helm/diskfit) with
// Helm's own Go packages, the way `helm install` does before it talks to
// the cluster: the chart loader, the dependency conditions (the snapshot
// subchart), the values schema, the kubeVersion constraint, the template
// engine and the install order. Its tests compare the result with the
// kustomize overlays; tests against an API server render with Render too.
package chart

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"runtime"

	"helm.sh/helm/v4/pkg/chart/common"
	commonutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	"helm.sh/helm/v4/pkg/engine"
	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

const (
	// ReleaseName is the name of the release Render renders.
	ReleaseName = "diskfit"
	// Namespace is the release's namespace, the one the README installs
	// into. The chart's objects name their own namespaces (diskfit-system,
	// kube-system for a few), whatever the release's.
	Namespace = "diskfit-system"
	// KubeVersion is the Kubernetes version Render checks the chart's
	// kubeVersion constraint against: the version diskfit is built for.
	KubeVersion = "v1.37.2"
)

// Dir returns the chart's directory, manifests/helm/diskfit in the
// repository this package is part of.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "manifests", "helm", "diskfit")
}

// Render renders the chart for the release ReleaseName in Namespace, values
// over its values.yaml (nested maps, as a values file or --set gives them;
// nil for the defaults). It returns the CRDs of the chart and of its
// enabled subcharts (crds/, which Helm applies before anything else, as
// they are written) first, then the templates' objects in Helm's install
// order. A value the schema or a template refuses is an error that says
// why.
func Render(values map[string]any) ([]*unstructured.Unstructured, error) {
	return RenderFor(KubeVersion, values)
}

// RenderFor is Render for a cluster of the given Kubernetes version.
func RenderFor(kubeVersion string, values map[string]any) ([]*unstructured.Unstructured, error) {
	ch, err := loader.Load(Dir())
	if err != nil {
		return nil, fmt.Errorf("loading the chart: %w", err)
	}
	// Helm's packages may write into the maps they are given (helm lint's
	// do): the caller's values stay as they were.
	values = copyValues(values)
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	if c := ch.Metadata.KubeVersion; c != "" && !chartutil.IsCompatibleRange(c, kv.String()) {
		return nil, fmt.Errorf("the chart requires kubeVersion %s, which Kubernetes %s is not", c, kubeVersion)
	}
	// Drops the subcharts whose condition is false, as helm install does
	// before it installs CRDs.
	if err := chartutil.ProcessDependencies(ch, values); err != nil {
		return nil, fmt.Errorf("chart dependencies: %w", err)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	top, err := commonutil.ToRenderValues(ch, values, common.ReleaseOptions{
		Name: ReleaseName, Namespace: Namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	files, err := new(engine.Engine).RenderWithContext(context.Background(), ch, top)
	if err != nil {
		return nil, err
	}
	for name := range files {
		if path.Base(name) == "NOTES.txt" {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	if len(hooks) > 0 {
		return nil, fmt.Errorf("the chart has hooks (%s), which a release applies outside its manifest", hooks[0].Path)
	}
	var objs []*unstructured.Unstructured
	for _, crd := range ch.CRDObjects() {
		o, err := decode(crd.Filename, crd.File.Data)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	for _, m := range manifests {
		o, err := decode(m.Name, []byte(m.Content))
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// copyValues copies the maps and lists of values, nil to an empty map.
func copyValues(values map[string]any) map[string]any {
	c := make(map[string]any, len(values))
	for k, v := range values {
		c[k] = copyValue(v)
	}
	return c
}

func copyValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return copyValues(v)
	case []any:
		c := make([]any, len(v))
		for i, e := range v {
			c[i] = copyValue(e)
		}
		return c
	}
	return v
}

// decode reads the objects of a YAML stream, strictly (a key written twice
// is an error), as the API server's JSON: integers are int64.
func decode(name string, data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if string(js) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if u.GetName() == "" {
			return nil, fmt.Errorf("%s: a %s without a name", name, u.GetKind())
		}
		objs = append(objs, u)
	}
}
