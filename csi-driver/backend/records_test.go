package backend

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/diskfit/diskfit/csi-driver/fault"
)

// TestRecordWaitsForWhatItVouchesFor: a record replaces the old one only
// once every file it vouches for is synced. When one cannot be synced,
// the old record stays, the error says so, and no temporary file is left.
func TestRecordWaitsForWhatItVouchesFor(t *testing.T) {
	f := &File{}
	dir := t.TempDir()
	path := filepath.Join(dir, "v"+metaSuffix)
	if err := f.writeJSONAtomic(path, "old", true, fault.Step{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.Create(filepath.Join(dir, "v"+dataSuffix))
	if err != nil {
		t.Fatal(err)
	}
	data.Close() // a closed file cannot be synced

	if err := f.writeJSONAtomic(path, "new", true, fault.Step{}, data); err == nil {
		t.Error("the record was written although its data file could not be synced")
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != `"old"` {
		t.Errorf("record %q, %v after the failed sync; want the old one", got, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Errorf("files %v, want only the record and the data file", entries)
	}

	if data, err = os.OpenFile(data.Name(), os.O_WRONLY, 0); err != nil {
		t.Fatal(err)
	}
	defer data.Close()
	if err := f.writeJSONAtomic(path, "new", true, fault.Step{}, data); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != `"new"` {
		t.Errorf("record %q, %v; want the new one", got, err)
	}
}
