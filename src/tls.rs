//! TLS set-up for the Kubernetes client.
//!
//! kube-rs uses rustls with the `ring` provider, and the cloud SDKs (AWS, GCP) enable rustls's
//! `aws-lc-rs` provider in the same build. With two providers compiled in, rustls refuses to pick
//! one and every client build panics, so the binary (and tests) choose one explicitly, once.

/// Makes `ring` the process-wide rustls provider unless one is already installed. Idempotent.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing it is fine: one provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn installs_a_provider_once_and_again_without_harm() {
        super::install_crypto_provider();
        super::install_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
