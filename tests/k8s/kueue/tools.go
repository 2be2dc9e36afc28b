//go:build tools

// Package kueue pins Kueue (sigs.k8s.io/kueue) for the end-to-end test of ProvisioningRequests
// with Kueue's admission check (tests/k8s_kueue.rs); scripts/kueue.sh builds its manager.
package kueue

import _ "sigs.k8s.io/kueue/pkg/controller/admissionchecks/provisioning"
