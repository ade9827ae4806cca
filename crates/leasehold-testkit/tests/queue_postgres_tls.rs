//! The queue on a PostgreSQL server that requires TLS (the test kit's own CA and certificates,
//! `pg_hba.conf` refusing plain TCP): the whole queue suite over `sslmode=verify-full`, then each
//! `sslmode`, a CA or a name the client must refuse, a client certificate, SCRAM with channel
//! binding, and a connection made again over TLS.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use leasehold::queue::{open_queue, NewTask, QueueBackend};
use leasehold::Error;
use leasehold_testkit::servers::{pg_roles, shared_postgres, shared_postgres_tls, test_certs};
use std::sync::Arc;

leasehold_testkit::queue_tests!(leasehold_testkit::servers::shared_postgres_tls().fresh_db());

/// A fresh database on the TLS server: its name and `postgres://USER@HOST:PORT/NAME` without any
/// parameter.
fn fresh(user: &str, host: &str) -> (String, String) {
    let server = shared_postgres_tls();
    let url = server.fresh_db();
    let name = url
        .split('?')
        .next()
        .and_then(|p| p.rsplit('/').next())
        .unwrap()
        .to_owned();
    let base = format!("postgres://{user}@{host}:{}/{name}", server.port);
    (name, base)
}

/// The test kit's CA, as a URL parameter.
fn our_ca() -> String {
    format!(
        "sslrootcert={}",
        shared_postgres_tls().cert("ca.crt").display()
    )
}

/// A queue works over `url`: a task goes in and is counted.
async fn works(url: &str) -> Arc<dyn QueueBackend> {
    let q = open_queue(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let before = q.status().await.unwrap().pending.normal;
    q.enqueue(&NewTask::new("k", "a")).await.unwrap();
    assert_eq!(
        q.status().await.unwrap().pending.normal,
        before + 1,
        "{url}"
    );
    q
}

/// `url` is refused at once, with a non-retryable error whose text has `needle`.
async fn refused(url: &str, needle: &str) -> Error {
    match open_queue(url).await {
        Ok(_) => panic!("{url}: connected"),
        Err(e) => {
            assert!(!e.is_retryable(), "{url}: retryable: {e}");
            assert!(
                e.to_string().to_lowercase().contains(needle),
                "{url}: {e:?} does not name {needle:?}"
            );
            e
        }
    }
}

/// The number of the database's client connections, and whether all of them use TLS, as the
/// server sees them.
fn encrypted(db: &str) -> (String, String) {
    let out = shared_postgres_tls()
        .psql(
            db,
            "SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) \
             WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
        )
        .unwrap();
    let (n, all) = out.split_once('|').unwrap();
    (n.to_owned(), all.to_owned())
}

/// Every `sslmode` that allows TLS connects encrypted (the default, `prefer`, included); a
/// `disable`d one is refused by the server's `pg_hba.conf`, non-retryably, naming it.
#[tokio::test]
async fn modes_that_allow_tls_connect_encrypted_and_disable_is_refused() {
    let (db, base) = fresh("postgres", "127.0.0.1");
    let ca = our_ca();
    let mut open = vec![];
    for query in [
        String::new(),
        "?sslmode=prefer".into(),
        "?sslmode=require".into(),
        format!("?sslmode=require&{ca}"),
        format!("?sslmode=verify-ca&{ca}"),
        format!("?sslmode=verify-full&{ca}&timeout=5s"),
    ] {
        let q = open_queue(&format!("{base}{query}"))
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        q.enqueue(&NewTask::new("k", "a")).await.unwrap();
        open.push(q);
    }
    assert_eq!(
        encrypted(&db),
        ("6".into(), "t".into()),
        "six queues, all on TLS"
    );
    refused(&format!("{base}?sslmode=disable"), "pg_hba.conf").await;
}

/// A server certificate from a CA the URL does not trust is refused under `verify-full`,
/// `verify-ca` and `require` with that CA, and by the system's trust store; `prefer` and
/// `require` without a CA do not check it (libpq's rules).
#[tokio::test]
async fn a_certificate_of_another_ca_is_refused_where_the_mode_checks_it() {
    let (_db, base) = fresh("postgres", "127.0.0.1");
    let other = test_certs();
    let theirs = format!("sslrootcert={}", other.path().join("ca.crt").display());
    for mode in ["verify-full", "verify-ca", "require"] {
        refused(&format!("{base}?sslmode={mode}&{theirs}"), "certificate").await;
    }
    works(&format!("{base}?sslmode=require")).await;
    works(&format!("{base}?{theirs}")).await; // prefer, which never checks
                                              // The system's trust store (named, or by default) does not have the test kit's CA either.
    for query in [
        "sslmode=verify-full&sslrootcert=system",
        "sslmode=verify-ca",
    ] {
        refused(&format!("{base}?{query}"), "certificate").await;
    }
}

/// `verify-full` checks that the certificate names the host of the URL; `verify-ca` does not.
/// The server's certificate names 127.0.0.1 and `localhost`; `hostaddr` reaches it under
/// another name.
#[tokio::test]
async fn verify_full_checks_the_host_name_and_verify_ca_does_not() {
    let (_db, base) = fresh("postgres", "db.example.com");
    let ca = our_ca();
    let e = refused(
        &format!("{base}?hostaddr=127.0.0.1&sslmode=verify-full&{ca}"),
        "not valid for name",
    )
    .await;
    assert!(e.to_string().contains("db.example.com"), "{e}");
    works(&format!("{base}?hostaddr=127.0.0.1&sslmode=verify-ca&{ca}")).await;
    let (_db, base) = fresh("postgres", "localhost");
    works(&format!("{base}?sslmode=verify-full&{ca}")).await;
}

/// A role that logs in by certificate (`hostssl … cert`): its certificate and key get it in;
/// none, or another subject's, is refused by the server, non-retryably.
#[tokio::test]
async fn a_client_certificate_logs_in() {
    let server = shared_postgres_tls();
    let (_db, base) = fresh(pg_roles::CERT, "127.0.0.1");
    let ca = our_ca();
    let pair = |name: &str| {
        format!(
            "sslcert={}&sslkey={}",
            server.cert(&format!("{name}.crt")).display(),
            server.cert(&format!("{name}.key")).display()
        )
    };
    works(&format!(
        "{base}?sslmode=verify-full&{ca}&{}",
        pair(pg_roles::CERT)
    ))
    .await;
    refused(&format!("{base}?sslmode=verify-full&{ca}"), "certificate").await;
    refused(
        &format!("{base}?sslmode=verify-full&{ca}&{}", pair("client")),
        "certificate authentication failed",
    )
    .await;
}

/// SCRAM over TLS binds the password exchange to the server's certificate
/// (`SCRAM-SHA-256-PLUS`, `tls-server-end-point`): `channel_binding=require` gets in; a wrong
/// password is refused non-retryably, the password not shown.
#[tokio::test]
async fn scram_with_channel_binding() {
    let user = format!("{}:{}", pg_roles::SCRAM, pg_roles::SCRAM_PASSWORD);
    let (_db, base) = fresh(&user, "127.0.0.1");
    let ca = our_ca();
    works(&format!(
        "{base}?sslmode=verify-full&{ca}&channel_binding=require"
    ))
    .await;
    let (_db, wrong) = fresh(&format!("{}:not-it", pg_roles::SCRAM), "127.0.0.1");
    let e = refused(&format!("{wrong}?sslmode=verify-full&{ca}"), "password").await;
    assert!(!e.to_string().contains("not-it"), "{e}");
}

/// The server ends the queue's TLS connection: the next calls connect again, over TLS.
#[tokio::test]
async fn a_connection_the_server_ended_is_made_again_over_tls() {
    let server = shared_postgres_tls();
    let (db, base) = fresh("postgres", "127.0.0.1");
    let q = works(&format!("{base}?sslmode=verify-full&{}", our_ca())).await;
    let ended = server.psql(
        &db,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert_eq!(ended.as_deref(), Some("1"));
    if let Err(e) = q.enqueue(&NewTask::new("k", "b")).await {
        assert!(e.is_retryable(), "{e}");
    }
    q.enqueue(&NewTask::new("k", "c")).await.unwrap();
    assert_eq!(encrypted(&db), ("1".into(), "t".into()));
}

/// A server without TLS: `require` and up are refused at once, non-retryably; `prefer` (the
/// default) connects in plain.
#[tokio::test]
async fn a_server_without_tls_is_refused_from_require_up() {
    let url = shared_postgres().fresh_db();
    for mode in ["require", "verify-ca", "verify-full"] {
        refused(&format!("{url}?sslmode={mode}"), "does not support tls").await;
    }
    works(&url).await;
    works(&format!("{url}?sslmode=prefer")).await;
}

/// Bad TLS parameters and files are refused before connecting, as bad URLs or unreadable files,
/// naming what is wrong.
#[tokio::test]
async fn bad_tls_parameters_are_refused_before_connecting() {
    let (_db, base) = fresh("postgres", "127.0.0.1");
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, b"\x00\xffnot pem").unwrap();
    let cases = [
        ("sslmode=verify".to_owned(), "sslmode"),
        ("sslrootcert=".into(), "sslrootcert"),
        ("sslnegotiation=direct".into(), "sslnegotiation"),
        ("sslpassword=x".into(), "sslpassword"),
        ("sslcrl=/tmp/x.crl".into(), "sslcrl"),
        (
            format!("sslmode=verify-full&sslrootcert={}", garbage.display()),
            "garbage.pem",
        ),
        (
            format!(
                "sslmode=verify-full&sslrootcert={}/nope.pem",
                dir.path().display()
            ),
            "nope.pem",
        ),
        (format!("sslkey={}", garbage.display()), "go together"),
        (
            format!("sslcert={0}&sslkey={0}", garbage.display()),
            "garbage.pem",
        ),
    ];
    for (query, needle) in cases {
        let url = format!("{base}?{query}");
        match open_queue(&url).await {
            Ok(_) => panic!("{query}: opened"),
            Err(e) => {
                assert!(
                    matches!(e, Error::InvalidUrl { .. } | Error::Io { .. }),
                    "{query}: {e:?}"
                );
                assert!(!e.is_retryable(), "{query}: {e}");
                assert!(e.to_string().contains(needle), "{query}: {e}");
            }
        }
    }
}

/// Over the server's Unix socket, which PostgreSQL never offers TLS on: the default (`prefer`)
/// connects in plain; `require` is refused at once, non-retryably.
#[tokio::test]
async fn a_unix_socket_connects_in_plain_under_prefer_only() {
    let server = shared_postgres_tls();
    let (db, _) = fresh("postgres", "127.0.0.1");
    let base = format!(
        "postgres://postgres@/{db}?host={}&port={}",
        server.socket_dir().display(),
        server.port
    );
    works(&base).await;
    assert_eq!(
        encrypted(&db),
        ("1".into(), "f".into()),
        "one queue, in plain"
    );
    refused(&format!("{base}&sslmode=require"), "does not support tls").await;
}
