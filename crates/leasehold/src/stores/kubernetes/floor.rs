//! The Kubernetes store's floor ([`crate::floor`]): a raw Lease create (its spec naming a holder
//! for [`TTL`], as any client's Lease does) and a delete on its resourceVersion, through the
//! store's own client, bounded by its timeout. No annotations, no label, no remembered version:
//! the least two API requests a lock on Leases sends.

use super::KubernetesStore;
use crate::error::Result;
use crate::floor::{Floor, Taken, TTL};
use crate::key::Key;
use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{DeleteParams, PostParams, Preconditions};
use parking_lot::Mutex;
use std::collections::HashMap;

/// The raw floor of one Kubernetes store: a store of its own over the same client (its own
/// cache of Leases stays empty).
#[derive(Debug)]
pub(super) struct KubernetesFloor(KubernetesStore);

impl KubernetesFloor {
    pub(super) fn new(store: &KubernetesStore) -> Self {
        KubernetesFloor(KubernetesStore {
            api: store.api.clone(),
            namespace: store.namespace.clone(),
            naming: store.naming.clone(),
            describe: store.describe.clone(),
            timeout: store.timeout,
            seen: Mutex::new(HashMap::new()),
        })
    }
}

#[async_trait]
impl Floor for KubernetesFloor {
    fn describe(&self) -> String {
        "create a Lease, delete it (on its resourceVersion)".into()
    }

    async fn take(&self, key: &Key) -> Result<Option<Taken>> {
        let s = &self.0;
        let name = s.lease_name(key);
        let now = MicroTime(k8s_openapi::chrono::Utc::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(s.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(crate::holder::new_token()),
                lease_duration_seconds: Some(TTL.as_secs() as i32),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        };
        let created = s
            .call(
                "create",
                &name,
                s.api.create(&PostParams::default(), &lease),
            )
            .await?;
        Ok(created
            .ok()
            .map(|l| Taken::new(l.metadata.resource_version.unwrap_or_default())))
    }

    async fn release(&self, key: &Key, taken: Taken) -> Result<()> {
        let s = &self.0;
        let name = s.lease_name(key);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(taken.as_str().to_owned()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        // Gone or changed (404, 409): nothing of the floor's to release.
        let _gone = s.call("delete", &name, s.api.delete(&name, &dp)).await?;
        Ok(())
    }
}
