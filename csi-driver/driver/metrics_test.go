package driver

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskfit/diskfit/apis/diskfit"
	"github.com/diskfit/diskfit/csi-driver/internal/testdisk"
)

// scrape reads /metrics at addr into "name{label="value",...}" -> value,
// labels sorted by name; a histogram gives its name_count.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	samples := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetGauge() != nil:
				samples[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				samples[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				samples[name+"_count{"+strings.Join(labels, ",")+"}"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return samples
}

func diskSeries(name, disk, class string) string {
	return fmt.Sprintf(`%s{device_class=%q,disk=%q,node=%q}`, name, class, disk, testNode)
}

// TestDiskMetrics scrapes the driver's /metrics: the per-disk gauges carry
// the numbers of the DiskNode status published at the same refresh, follow
// a new volume and a disk that is unmounted, and the orphan counter exists
// for both kinds from the start. csi_plugin_operations_seconds is served
// from the same registry.
func TestDiskMetrics(t *testing.T) {
	e := newEnv(t, []testDisk{{name: "one", class: "ssd", fsType: "xfs", size: 2 * gi}, {name: "two", class: "hdd", fsType: "xfs", size: gi}}, nil)
	cfg := e.d.cfg
	cfg.Endpoint = "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	cfg.MetricsAddress = freePort(t)
	cfg.StatusInterval = 100 * time.Millisecond
	ctx := runDriver(t, e, e.ctx, cfg)
	conn := dial(t, cfg.Endpoint)

	req := createReq("pvc-metrics", 400*mi)
	req.Parameters = e.addPVC(t, "pvc-metrics", map[string]string{diskfit.SelectedNodeAnnotation: testNode, diskfit.SelectedDiskAnnotation: "one"})
	if err := invoke(ctx, conn, req); err != nil {
		t.Fatal(err)
	}
	// The gauges and the DiskNode come from the same observation; poll
	// until one refresh is seen by both reads.
	var samples map[string]float64
	if err := waitFor(ctx, func() (bool, error) {
		dn, err := e.diskfit.DiskfitV1alpha1().DiskNodes().Get(ctx, testNode, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		samples = scrape(t, cfg.MetricsAddress)
		for _, dk := range dn.Status.Disks {
			healthy := 0.0
			if dk.Healthy {
				healthy = 1
			}
			if samples[diskSeries("diskfit_disk_capacity_bytes", dk.Name, dk.DeviceClass)] != float64(dk.CapacityBytes) ||
				samples[diskSeries("diskfit_disk_free_bytes", dk.Name, dk.DeviceClass)] != float64(dk.FreeBytes) ||
				samples[diskSeries("diskfit_disk_volumes", dk.Name, dk.DeviceClass)] != float64(dk.VolumeCount) ||
				samples[diskSeries("diskfit_disk_healthy", dk.Name, dk.DeviceClass)] != healthy {
				return false, nil
			}
		}
		return dn.Status.Disk("one").VolumeCount == 1, nil
	}); err != nil {
		t.Fatalf("the gauges never matched the DiskNode with the new volume: %v", samples)
	}
	if free, capacity := samples[diskSeries("diskfit_disk_free_bytes", "one", "ssd")], samples[diskSeries("diskfit_disk_capacity_bytes", "one", "ssd")]; capacity-free < float64(400*mi) {
		t.Errorf("disk one: capacity %v and free %v bytes do not account for the 400 MiB volume", capacity, free)
	}
	for _, kind := range []string{"volume", "snapshot"} {
		if v, ok := samples[fmt.Sprintf(`diskfit_orphans_removed_total{kind=%q}`, kind)]; !ok || v != 0 {
			t.Errorf("diskfit_orphans_removed_total{kind=%q} = %v, %v; want 0", kind, v, ok)
		}
	}
	if samples[`csi_plugin_operations_seconds_count{driver_name="`+diskfit.DriverName+`",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"}`] != 1 {
		t.Error("csi_plugin_operations_seconds is not served with the disk metrics")
	}

	// Lazily: the driver serving the disk keeps it busy.
	testdisk.Run(t, "umount", "--lazy", e.paths["two"])
	if err := waitFor(ctx, func() (bool, error) {
		samples = scrape(t, cfg.MetricsAddress)
		return samples[diskSeries("diskfit_disk_healthy", "two", "hdd")] == 0, nil
	}); err != nil {
		t.Errorf("diskfit_disk_healthy of the unmounted disk: %v", samples[diskSeries("diskfit_disk_healthy", "two", "hdd")])
	}
	if samples[diskSeries("diskfit_disk_healthy", "one", "ssd")] != 1 {
		t.Errorf("diskfit_disk_healthy of the mounted disk: %v", samples[diskSeries("diskfit_disk_healthy", "one", "ssd")])
	}
}
