//! `leasehold-apiserver`: a small Kubernetes-API-compatible server for tests.
//!
//! It serves `coordination.k8s.io/v1` Leases over plain HTTP without authentication, backed by a
//! real etcd the way kube-apiserver uses it:
//! - objects are JSON under `/registry/leases/<namespace>/<name>`;
//! - `metadata.resourceVersion` is the etcd modification revision;
//! - create is a transaction on create-revision 0 (`409 AlreadyExists` otherwise);
//! - update (`PUT`), merge `PATCH` and `DELETE` are transactions on the modification revision: the
//!   given `resourceVersion` (or `preconditions.resourceVersion`) must match (`409 Conflict`), an
//!   update without one is unconditional;
//! - `?watch=1` streams an etcd watch as `{"type":…,"object":…}` lines.
//!
//! Besides the API it answers `GET /debug/requests` with the number of Lease requests served (by
//! verb) and the most requests ever in flight at once for one Lease, and `DELETE /debug/requests`
//! resets those counters.
//!
//! `--deny VERB` (repeatable: get, list, watch, create, update, patch, delete) answers that verb on
//! Leases with `403 Forbidden` as RBAC does without a rule granting it, to test how clients report
//! a missing permission.
//!
//! Usage: `leasehold-apiserver --listen 127.0.0.1:PORT --etcd http://127.0.0.1:PORT [--deny VERB]…`.

mod api;

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: leasehold-apiserver --listen 127.0.0.1:PORT --etcd http://127.0.0.1:PORT [--deny VERB]...");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut listen = None;
    let mut etcd = None;
    let mut deny = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next(),
            "--etcd" => etcd = args.next(),
            "--deny" => match args.next() {
                Some(v) => deny.push(v),
                None => return usage(),
            },
            "-h" | "--help" => {
                usage();
                return ExitCode::SUCCESS;
            }
            _ => return usage(),
        }
    }
    let (Some(listen), Some(etcd)) = (listen, etcd) else {
        return usage();
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leasehold-apiserver: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(api::serve(&listen, &etcd, deny)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasehold-apiserver: {e}");
            ExitCode::FAILURE
        }
    }
}
