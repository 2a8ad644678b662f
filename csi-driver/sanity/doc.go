// Package sanity runs the kubernetes-csi sanity suite against the real
// diskfit driver on loop-mounted disks; see sanity_test.go.
package sanity
