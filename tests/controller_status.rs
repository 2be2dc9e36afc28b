//! Status events and ConfigMaps against the fake Kubernetes API server (to come).
