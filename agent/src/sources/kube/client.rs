//! The API server client: from `--kubeconfig`, or the in-cluster service account.

use std::path::Path;

use super::KubeError;

/// A client of the API server named by `kubeconfig` (its current context), or of the cluster the
/// agent runs in (the service account's token and CA, `KUBERNETES_SERVICE_HOST`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                KubeError::Kubeconfig {
                    path: path.to_owned(),
                    source,
                }
            })?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| KubeError::Kubeconfig {
                    path: path.to_owned(),
                    source,
                })?
        }
        None => kube::Config::incluster().map_err(KubeError::InCluster)?,
    };
    let mut config = config;
    // kube retries 429/503/504 itself, up to 15 times with delays growing to minutes: a failing
    // API server would stay invisible that long. The watchers retry with their own backoff
    // instead, and the source reports the failure as staleness at once.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(KubeError::Client)
}
