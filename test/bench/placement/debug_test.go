package main

import (
	"testing"
	"time"
)

func TestDebugSmall(t *testing.T) {
	all := time.Now()
	defer func() { t.Log(time.Since(all)) }()
	for k := 0; k < 100; k++ {
		in := Generate(InputConfig{Nodes: 3, MinDisks: 2, MaxDisks: 3, MaxUsed: 0.5, Load: 1.3, Seed: 1*1_000_003 + uint64(k), DiskSizes: smallDiskSizes, ClaimSizes: smallClaimSizes})
		start := time.Now()
		opt, ok := Exact(in)
		if d := time.Since(start); d > 100*time.Millisecond || !ok { t.Log(k, len(in.Pods), opt/gi, ok, d) }
	}
}
