package cluster

const gi = int64(1) << 30

// DefaultNodes is the cluster the demo and the e2e suite use: three nodes
// with uneven disks, so that free space per node and per disk tell
// different stories.
func DefaultNodes() []NodeSpec {
	return []NodeSpec{
		{Name: "node-a", Disks: []DiskSpec{
			{Name: "nvme0", SizeBytes: 3 * gi, FS: "xfs", DeviceClass: "nvme"},
			{Name: "nvme1", SizeBytes: 3 * gi, FS: "xfs", DeviceClass: "nvme"},
		}},
		{Name: "node-b", Disks: []DiskSpec{
			{Name: "ssd0", SizeBytes: 8 * gi, FS: "xfs", DeviceClass: "ssd"},
			{Name: "hdd0", SizeBytes: 4 * gi, FS: "ext4", DeviceClass: "hdd"},
		}},
		{Name: "node-c", Disks: []DiskSpec{
			{Name: "ssd0", SizeBytes: 2 * gi, FS: "xfs", DeviceClass: "ssd"},
			{Name: "ssd1", SizeBytes: 2 * gi, FS: "xfs", DeviceClass: "ssd"},
			{Name: "ssd2", SizeBytes: 2 * gi, FS: "xfs", DeviceClass: "ssd"},
		}},
	}
}
