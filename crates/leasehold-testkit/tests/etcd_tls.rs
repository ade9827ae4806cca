//! The etcd store over TLS with a client certificate, and with etcd's user/password auth: real
//! members, errors that say which.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold_testkit::etcd_cluster::{etcdctl, EtcdTlsServer};
use leasehold_testkit::servers::EtcdServer;
use std::sync::Arc;

/// Over TLS with the CA and a client certificate, leases work (exclusion, a waiter's handoff);
/// without the client certificate, or trusting another CA, connecting fails with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_with_a_client_certificate() {
    let server = EtcdTlsServer::start();
    let store = leasehold::open_store(&server.url())
        .await
        .expect("etcd over TLS");
    assert!(store.describe().contains("(TLS)"), "{}", store.describe());
    leasehold_testkit::suite::exclusion(store.clone()).await;
    leasehold_testkit::suite::waiter_handoff(Arc::clone(&store)).await;
    let ca = server.certs().join("ca.crt");
    let no_cert = format!(
        "etcd://127.0.0.1:{}?ca={}&timeout=1s",
        server.port,
        ca.display()
    );
    let err = leasehold::open_store(&no_cert)
        .await
        .expect_err("no client certificate");
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", server.port)),
        "{err}"
    );
    let other = leasehold_testkit::servers::test_certs();
    let wrong_ca = server.url().replace(
        &ca.display().to_string(),
        &other.path().join("ca.crt").display().to_string(),
    );
    assert!(leasehold::open_store(&format!("{wrong_ca}&timeout=1s"))
        .await
        .is_err());
    let missing = server.url().replace("ca.crt", "nope.crt");
    let err = leasehold::open_store(&missing)
        .await
        .expect_err("no CA file");
    assert!(err.to_string().contains("nope.crt"), "{err}");
}

/// With etcd's authentication on, the right password works; a wrong one fails at once with a
/// non-retryable error saying "authentication failed" that does not show the password.
#[tokio::test]
async fn user_and_password() {
    let server = EtcdServer::start();
    let port = server.port;
    etcdctl(port, &["user", "add", "root:r00tpw", "--interactive=false"]).expect("user add root");
    etcdctl(
        port,
        &["user", "add", "locker:s3cret", "--interactive=false"],
    )
    .expect("user add");
    etcdctl(port, &["role", "add", "leasehold"]).expect("role add");
    etcdctl(
        port,
        &[
            "role",
            "grant-permission",
            "leasehold",
            "--prefix=true",
            "readwrite",
            "leasehold/",
        ],
    )
    .expect("grant");
    etcdctl(port, &["user", "grant-role", "locker", "leasehold"]).expect("grant-role");
    etcdctl(port, &["auth", "enable"]).expect("auth enable");
    let l =
        leasehold_testkit::connect_as(&format!("etcd://locker:s3cret@127.0.0.1:{port}"), "a").await;
    leasehold_testkit::taken_and_released(&l).await;
    let err = leasehold::open_store(&format!("etcd://locker:wrong-pw@127.0.0.1:{port}"))
        .await
        .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("authentication failed"), "{msg}");
    assert!(!err.is_retryable(), "{msg}");
    assert!(!msg.contains("wrong-pw"), "{msg}");
    // A user without permission on the prefix: a non-retryable error saying so.
    etcdctl(
        port,
        &[
            "--user",
            "root:r00tpw",
            "user",
            "add",
            "nobody:pw",
            "--interactive=false",
        ],
    )
    .expect("user add nobody");
    let err = leasehold::open_store(&format!("etcd://nobody:pw@127.0.0.1:{port}"))
        .await
        .expect_err("no permission");
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert!(!err.is_retryable(), "{err}");
}
