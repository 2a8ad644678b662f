package backend

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/diskfit/diskfit/csi-driver/lvm"
)

// LV tags record everything the backend needs to rebuild its view, so the
// volume group itself is the database.
const (
	// tagDisk, a tag of the volume group itself (vg_tags), holds the name
	// of the disk whose volumes the group keeps (claimVG). Disk names are
	// [a-z0-9._-], characters lvm2 takes in a tag as they are.
	tagDisk     = tagPrefix + "disk="
	tagPrefix   = "diskfit."
	tagName     = tagPrefix + "name="
	tagPVC      = tagPrefix + "pvc="
	tagState    = tagPrefix + "state="
	tagSource   = tagPrefix + "source="
	tagSnapshot = tagPrefix + "snapshot"
	// tagSize holds a snapshot's size: its source's when it was taken,
	// what a restore gets. The LV's own size is its copy-on-write area
	// (cowSize), larger. A snapshot without the tag was made with an
	// area of its source's size, which is then its size (decodeLVs).
	tagSize = tagPrefix + "size="
	// tagContent holds a volume's Content; an LV without it was made
	// before the tag existed (ContentUnknown).
	tagContent = tagPrefix + "content="
	// tagNeverReferenced and tagUnreferencedSince (Unix seconds) hold Refs.
	tagNeverReferenced   = tagPrefix + "never-referenced"
	tagUnreferencedSince = tagPrefix + "unreferenced-since="
	// tagSourceSnapshot and tagSourceVolume hold the key of a restore's
	// snapshot or a clone's volume (Volume.SourceSnapshot, SourceVolume;
	// tagSource is a snapshot's), which a repeated CreateVolume of its
	// name must give again (sourceTags). A key is made of [a-z0-9_-]
	// (ValidKey), characters lvm2 allows in tags as they are, and the
	// longest makes a tag of 124 characters; lvm2 allows 1024.
	//
	// A volume's LV without either is a volume made from nothing, or a
	// copy made before the tags existed: both read as having no source.
	// Such a copy was returned long ago and its claim bound; a repeat of
	// its CreateVolume now, with its source, is unlikely, and is answered
	// AlreadyExists as it was when the copy was made (its claim stays
	// pending, the copy is kept), while a request of its name without a
	// source gets it.
	tagSourceSnapshot = tagPrefix + "source-snapshot="
	tagSourceVolume   = tagPrefix + "source-volume="
	// tagFor holds the VolumeSnapshotContent a snapshot was made for
	// (Snapshot.For): a DNS subdomain name, characters lvm2 takes as they
	// are.
	tagFor       = tagPrefix + "for="
	volumePrefix = "v-"
	snapPrefix   = "s-"
	// wipePrefix names an LV that is deleted and waits to be wiped
	// (lvm_wipe.go); it keeps its tags.
	wipePrefix = "w-"
)

// lv is one logical volume as lvs reports it, tags decoded.
type lv struct {
	name string
	// size is a volume's size, or a snapshot's: its size tag (sizeTag),
	// else its area's. area is the LV's own size, a snapshot's
	// copy-on-write area.
	size, area int64
	sizeTag    bool
	csiName    string
	pvc        string
	source     string
	state      State
	snapshot   bool
	createdAt  time.Time
	content    Content
	refs       Refs
	// origin is the LV a snapshot is of, "" once split off or for a volume.
	origin string
	// open is an LV whose device something holds open (lvm.LV.Open).
	open bool
	// sourceSnapshot and sourceVolume are a copy's source (tagSourceSnapshot).
	sourceSnapshot, sourceVolume string
	// madeFor is a snapshot's tagFor.
	madeFor string
}

// decodeLVs keeps diskfit's LVs of an lvs report (those with a name tag),
// tags decoded, so other LVs sharing the group are left alone.
//
// A snapshot without a size tag was made with an area of its origin's
// size, but lvm2 may have enlarged the area since (dmeventd's
// snapshot_autoextend_threshold, an lvextend by hand): its size is its
// area's only up to its origin's.
func decodeLVs(raws []lvm.LV) ([]lv, error) {
	var lvs []lv
	sizes := make(map[string]int64, len(raws))
	for _, raw := range raws {
		sizes[raw.Name] = raw.SizeBytes
		v, ours, err := decodeLV(raw)
		if err != nil {
			return nil, err
		}
		if ours {
			lvs = append(lvs, v)
		}
	}
	for i, v := range lvs {
		if origin, ok := sizes[v.origin]; ok && v.snapshot && !v.sizeTag {
			lvs[i].size = min(v.area, origin)
		}
	}
	return lvs, nil
}

// decodeLV reads the tags of one LV; ok is false when it has no name tag.
func decodeLV(raw lvm.LV) (_ lv, ok bool, _ error) {
	v := lv{name: raw.Name, size: raw.SizeBytes, area: raw.SizeBytes, createdAt: raw.Time, origin: raw.Origin, open: raw.Open}
	for _, tag := range raw.Tags {
		switch {
		case strings.HasPrefix(tag, tagName):
			name, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tag, tagName))
			if err != nil {
				return lv{}, false, fmt.Errorf("decoding name tag of %s: %w", raw.Name, err)
			}
			v.csiName, ok = string(name), true
		case strings.HasPrefix(tag, tagPVC):
			v.pvc = strings.TrimPrefix(tag, tagPVC)
		case strings.HasPrefix(tag, tagState):
			v.state = State(strings.TrimPrefix(tag, tagState))
		case strings.HasPrefix(tag, tagSource):
			v.source = strings.TrimPrefix(tag, tagSource)
		case strings.HasPrefix(tag, tagSourceSnapshot):
			v.sourceSnapshot = strings.TrimPrefix(tag, tagSourceSnapshot)
		case strings.HasPrefix(tag, tagSourceVolume):
			v.sourceVolume = strings.TrimPrefix(tag, tagSourceVolume)
		case strings.HasPrefix(tag, tagFor):
			v.madeFor = strings.TrimPrefix(tag, tagFor)
		case tag == tagSnapshot:
			v.snapshot = true
		case strings.HasPrefix(tag, tagSize):
			size, err := strconv.ParseInt(strings.TrimPrefix(tag, tagSize), 10, 64)
			if err != nil {
				return lv{}, false, fmt.Errorf("decoding size tag of %s: %w", raw.Name, err)
			}
			v.size, v.sizeTag = size, true
		case strings.HasPrefix(tag, tagContent):
			v.content = Content(strings.TrimPrefix(tag, tagContent))
		case tag == tagNeverReferenced:
			v.refs.NeverReferenced = true
		case strings.HasPrefix(tag, tagUnreferencedSince):
			if sec, err := strconv.ParseInt(strings.TrimPrefix(tag, tagUnreferencedSince), 10, 64); err == nil {
				v.refs.UnreferencedSince = time.Unix(sec, 0).UTC()
			}
		}
	}
	return v, ok, nil
}

// sourceTags are the tags that record the source of a volume made as req
// asks: none for a volume made from nothing.
func sourceTags(req CreateRequest) []string {
	switch {
	case req.FromSnapshot != "":
		return []string{tagSourceSnapshot + req.FromSnapshot}
	case req.FromVolume != "":
		return []string{tagSourceVolume + req.FromVolume}
	}
	return nil
}

// createArgs builds the lvcreate command line for a volume or snapshot of
// size bytes. A snapshot is a thick LVM snapshot of its source with room
// for the whole source to change (cowSize). content is the volume's
// Content, for a snapshot its origin's when taken. tags are more tags the LV is
// made with (a copy's sourceTags): lvcreate adds them with the others,
// so no LV is left without them.
func (l *LVM) createArgs(lvName, csiName, pvc, source string, size int64, snapshot bool, content Content, tags ...string) []string {
	lvSize := roundExtent(size)
	if snapshot {
		lvSize = cowSize(size)
	}
	args := []string{"--yes", "--name", lvName, "--size", strconv.FormatInt(lvSize, 10) + "b",
		"--addtag", tagName + base64.RawURLEncoding.EncodeToString([]byte(csiName)),
		"--addtag", tagState + string(StateCreating), "--addtag", tagNeverReferenced}
	if content != ContentUnknown {
		args = append(args, "--addtag", tagContent+string(content))
	}
	if pvc != "" {
		args = append(args, "--addtag", tagPVC+pvc)
	}
	if source != "" {
		args = append(args, "--addtag", tagSource+source)
	}
	for _, tag := range tags {
		args = append(args, "--addtag", tag)
	}
	if snapshot {
		return append(args, "--addtag", tagSnapshot, "--addtag", tagSize+strconv.FormatInt(roundExtent(size), 10),
			"--chunksize", strconv.Itoa(snapshotChunk>>10)+"k", "--snapshot", l.vg+"/"+volumePrefix+source)
	}
	return append(args, l.vg)
}

// volume and snapshot describe a decoded LV as the Backend interface does.
func (l *LVM) volume(v *lv, key string) *Volume {
	vol := &Volume{Key: key, Name: v.csiName, SizeBytes: v.size, State: v.state, CreatedAt: v.createdAt, Content: v.content, Refs: v.refs,
		SourceSnapshot: v.sourceSnapshot, SourceVolume: v.sourceVolume}
	vol.PVCNamespace, vol.PVCName, _ = strings.Cut(v.pvc, "/")
	return vol
}

func snapshot(v *lv, key string) *Snapshot {
	return &Snapshot{Key: key, Name: v.csiName, SourceVolume: v.source, SizeBytes: v.size, State: v.state, CreatedAt: v.createdAt, For: v.madeFor, Refs: v.refs}
}
