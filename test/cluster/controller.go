package cluster

import (
	"time"
)

// Grace times of the local cluster's diskfit-controller: short, so tests
// see a lost node's or failed disk's claims released within a minute.
const (
	NodeLossGrace    = 30 * time.Second
	DiskFailureGrace = 30 * time.Second
)

// startController runs diskfit-controller with its manifests'
// ServiceAccount and a leader election Lease, as its Deployment does.
// Supervised: like a Deployment's pod, it comes back when it exits.
func (c *Cluster) startController() error {
	bin, err := c.binary("diskfit-controller")
	if err != nil {
		return err
	}
	c.controller, err = startSupervised("diskfit-controller", c.LogDir, bin, []string{
		"--kubeconfig=" + c.controllerKubeconfig,
		"--namespace=diskfit-system",
		"--health-address=",
		"--node-loss-grace=" + NodeLossGrace.String(),
		// The drivers refresh their DiskNodes every 5 s here: a Node
		// deleted is taken for gone once its driver is silent this long.
		"--disknode-max-age=30s",
		"--disk-failure-grace=" + DiskFailureGrace.String(),
		"--interval=5s",
		"-v=2",
	}, nil)
	return err
}
