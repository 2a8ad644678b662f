// Package fakelvm is a fake lvm2 for tests: an lvm.Runner that keeps one
// volume group, vg0, in memory and answers vgs, lvs, lvcreate, lvchange,
// lvextend, lvremove and the LV copy (dd) like lvm2 does, so the LVM
// backend's command building and report parsing run against realistic
// output. The project's test machines have no device-mapper, so real lvm2
// cannot activate a logical volume there; TestLVMReal runs it where it can.
package fakelvm

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
)

// Name is the volume group's name.
const Name = "vg0"

// VG is the volume group. Its fields may be read and changed between
// commands; Run serialises the commands, as lvm2's own locks do, so two
// backends may run them at once on one VG.
type VG struct {
	Size, Free int64
	LVs        map[string]*LV
	// Calls is every command run, "name arg arg ...".
	Calls []string
	// Fail makes every command of that name fail with the error.
	Fail map[string]error

	mu sync.Mutex
	// before is called with every command's name before it runs, outside
	// the lock (Hold).
	before func(name string)
}

// LV is one logical volume.
type LV struct {
	Size int64
	Tags []string
}

// New returns an empty volume group of size bytes.
func New(size int64) *VG {
	return &VG{Size: size, Free: size, LVs: map[string]*LV{}, Fail: map[string]error{}}
}

// Hold makes the first command called name that runs from now on wait,
// before it runs, until resume is called; paused is closed once it waits.
// A test holds an operation there (its lvcreate, its copy) while other
// commands run.
func (f *VG) Hold(name string) (paused <-chan struct{}, resume func()) {
	p, r := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before = func(command string) {
		if command == name {
			once.Do(func() {
				close(p)
				<-r
			})
		}
	}
	return p, sync.OnceFunc(func() { close(r) })
}

// Run implements lvm.Runner.
func (f *VG) Run(_ context.Context, name string, args ...string) (string, error) {
	f.mu.Lock()
	before := f.before
	f.mu.Unlock()
	if before != nil {
		before(name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Calls = append(f.Calls, name+" "+strings.Join(args, " "))
	if err := f.Fail[name]; err != nil {
		return "", err
	}
	flag := func(n string) string {
		for i, a := range args {
			if a == n && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	size := func() int64 {
		var n int64
		fmt.Sscanf(strings.TrimSuffix(flag("--size"), "b"), "%d", &n)
		return n
	}
	last := args[len(args)-1]
	lvName := last[strings.Index(last, "/")+1:]
	lv := f.LVs[lvName]
	switch name {
	case "vgs":
		if last != Name {
			//lint:ignore ST1005 lvm2's own message, which the backend parses
			return "", fmt.Errorf("Volume group %q not found", last)
		}
		return fmt.Sprintf(`{"report":[{"vg":[{"vg_name":%q,"vg_size":"%d","vg_free":"%d"}]}]}`, Name, f.Size, f.Free), nil
	case "lvs":
		var rows []string
		for n, lv := range f.LVs {
			rows = append(rows, fmt.Sprintf(`{"lv_name":%q,"lv_size":"%d","lv_tags":%q,"lv_time":"2026-11-29 23:40:01 +0000"}`, n, lv.Size, strings.Join(lv.Tags, ",")))
		}
		return `{"report":[{"lv":[` + strings.Join(rows, ",") + `]}]}`, nil
	case "lvcreate":
		if size() > f.Free {
			//lint:ignore ST1005 lvm2's own message, which the backend parses
			return "", fmt.Errorf("lvcreate: exit status 5: Volume group %q has insufficient free space (1 extents): 25 required.", Name)
		}
		lv := &LV{Size: size()}
		for i, a := range args {
			if a == "--addtag" {
				lv.Tags = append(lv.Tags, args[i+1])
			}
		}
		f.LVs[flag("--name")] = lv
		f.Free -= lv.Size
	case "dd":
		// The copy from one LV to another: both must exist.
		for _, a := range args {
			op, dev, _ := strings.Cut(a, "=")
			if (op == "if" || op == "of") && f.LVs[path.Base(dev)] == nil {
				return "", fmt.Errorf("dd: failed to open '%s': No such file or directory", dev)
			}
		}
	case "lvchange", "lvextend", "lvremove":
		if lv == nil {
			return "", fmt.Errorf("%s: exit status 5: Failed to find logical volume \"%s/%s\"", name, Name, lvName)
		}
		switch name {
		case "lvchange":
			for i := 0; i+1 < len(args); i++ {
				switch args[i] {
				case "--deltag":
					lv.Tags = slices.DeleteFunc(lv.Tags, func(tag string) bool { return tag == args[i+1] })
				case "--addtag":
					lv.Tags = append(lv.Tags, args[i+1])
				}
			}
		case "lvextend":
			if size()-lv.Size > f.Free {
				//lint:ignore ST1005 lvm2's own message, which the backend parses
				return "", fmt.Errorf("Insufficient free space: 100 extents needed, but only 1 available")
			}
			f.Free -= size() - lv.Size
			lv.Size = size()
		case "lvremove":
			f.Free += lv.Size
			delete(f.LVs, lvName)
		}
	}
	return "", nil
}
