//! The conformance suite against every store (and every way to reach one: `redis://`, `rediss://`
//! with and without a client certificate,
//! `redis+unix://`, `redis+sentinel://` (also with `?replicas=1`), `rediss+sentinel://`,
//! `redis+cluster://` (also with `?replicas=1`)).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::LockStore;
use std::sync::Arc;

mod memory {
    use super::*;
    leasehold_testkit::conformance_tests!(
        Arc::new(leasehold::stores::memory::MemoryStore::new()) as Arc<dyn LockStore>
    );
}

mod record_memory {
    use super::*;
    leasehold_testkit::conformance_tests!(Arc::new(leasehold::adapter::RecordLockStore::new(
        leasehold::stores::memory::RecordMemoryStore::new()
    )) as Arc<dyn LockStore>);
}

mod file {
    use super::*;
    fn store() -> Arc<dyn LockStore> {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        Arc::new(
            leasehold::stores::file::FileStore::open(dir, Default::default()).expect("file store"),
        )
    }
    leasehold_testkit::conformance_tests!(store());
}

mod redis {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::servers::shared_redis();
        leasehold::open_store(&server.url())
            .await
            .expect("redis store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redis_mtls {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::servers::shared_redis_mtls();
        leasehold::open_store(&server.url())
            .await
            .expect("rediss store with a client certificate")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redis_unix {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::servers::shared_redis();
        leasehold::open_store(&server.unix_url())
            .await
            .expect("redis+unix store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redis_sentinel {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let set = leasehold_testkit::servers::shared_sentinels();
        leasehold::open_store(&set.url())
            .await
            .expect("redis+sentinel store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

/// Behind Sentinel with every grant and renewal acknowledged by the replica (`?replicas=1`).
mod redis_sentinel_replicas {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let set = leasehold_testkit::servers::shared_sentinels();
        leasehold::open_store(&set.url_with("replicas=1"))
            .await
            .expect("redis+sentinel store with replicas=1")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redis_sentinel_tls {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let set = leasehold_testkit::servers::shared_tls_sentinels();
        leasehold::open_store(&set.url())
            .await
            .expect("rediss+sentinel store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redis_cluster {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let cluster = leasehold_testkit::servers::shared_redis_cluster();
        leasehold::open_store(&cluster.url())
            .await
            .expect("redis+cluster store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

/// A cluster with every grant and renewal acknowledged by its primary's replica (`?replicas=1`).
mod redis_cluster_replicas {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let cluster = leasehold_testkit::servers::shared_redis_cluster();
        leasehold::open_store(&format!("{}?replicas=1", cluster.url()))
            .await
            .expect("redis+cluster store with replicas=1")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redlock3 {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let nodes = &leasehold_testkit::servers::shared_redis_nodes()[..3];
        leasehold::open_store(&leasehold_testkit::servers::redlock_url(nodes))
            .await
            .expect("redlock store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod redlock5 {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let nodes = leasehold_testkit::servers::shared_redis_nodes();
        leasehold::open_store(&leasehold_testkit::servers::redlock_url(nodes))
            .await
            .expect("redlock store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod rediss {
    use super::*;
    fn server() -> &'static leasehold_testkit::servers::RedisServer {
        static S: std::sync::OnceLock<leasehold_testkit::servers::RedisServer> =
            std::sync::OnceLock::new();
        S.get_or_init(leasehold_testkit::servers::RedisServer::start_tls)
    }
    async fn store() -> Arc<dyn LockStore> {
        leasehold::open_store(&server().url())
            .await
            .expect("rediss store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod k8s {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::servers::shared_apiserver();
        leasehold::open_store(&format!("{}&prefix=conf-", server.store_url("conformance")))
            .await
            .expect("k8s store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

/// PostgreSQL (`postgres://`): one database of the shared server, its lease table created by the
/// first store opened.
mod postgres {
    use super::*;
    fn url() -> &'static str {
        static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        URL.get_or_init(|| leasehold_testkit::servers::shared_postgres().fresh_db())
    }
    async fn store() -> Arc<dyn LockStore> {
        leasehold::open_store(url()).await.expect("postgres store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

/// PostgreSQL over TLS (`?sslmode=verify-full`, the test kit's CA), on a server that refuses
/// plain connections.
mod postgres_tls {
    use super::*;
    fn url() -> &'static str {
        static URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        URL.get_or_init(|| leasehold_testkit::servers::shared_postgres_tls().fresh_db())
    }
    async fn store() -> Arc<dyn LockStore> {
        leasehold::open_store(url())
            .await
            .expect("postgres store over TLS")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod gcs {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::gcs_server::shared_gcs();
        leasehold::open_store(&server.store_url("conformance"))
            .await
            .expect("gcs store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod etcd {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::etcd_cluster::shared_etcd();
        leasehold::open_store(&leasehold_testkit::etcd_cluster::store_url(server))
            .await
            .expect("etcd store")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod etcd3 {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let cluster = leasehold_testkit::etcd_cluster::shared_etcd_cluster();
        leasehold::open_store(&cluster.url())
            .await
            .expect("etcd store on 3 members")
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod s3 {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        // Behind the serialising proxy, as the S3 torture runs (see shared_serialised_moto).
        let server = leasehold_testkit::s3_server::shared_serialised_moto();
        let store = server.store("conformance", "locks");
        Arc::new(leasehold::adapter::RecordLockStore::new(store))
    }
    leasehold_testkit::conformance_tests!(store().await);
}

mod azure {
    use super::*;
    async fn store() -> Arc<dyn LockStore> {
        let server = leasehold_testkit::azure_server::shared_azurite();
        let store = server.store("conformance", "locks").await;
        Arc::new(leasehold::adapter::RecordLockStore::new(store))
    }
    leasehold_testkit::conformance_tests!(store().await);
}
