//go:build tools

// Package karpenter pins Karpenter with its kwok cloud provider (sigs.k8s.io/karpenter/kwok) for
// the side-by-side runs of tests/k8s_peers.rs; scripts/peers.sh builds it as karpenter-kwok.
package karpenter

import _ "sigs.k8s.io/karpenter/kwok"
