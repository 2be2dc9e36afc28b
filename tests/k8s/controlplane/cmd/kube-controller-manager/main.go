// kube-controller-manager as k8s.io/kubernetes/cmd/kube-controller-manager builds it. The tests
// run only the controllers they need (resourceclaim, replicaset, ...), chosen with --controllers.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
