//! `libleasehold`: the C ABI of leasehold, a sibling of the Python binding over the same library.
//!
//! The header is `include/leasehold.h`, generated from these sources by cbindgen (the `header`
//! test fails when it drifts, and says how to regenerate it); the user documentation is
//! `docs/src/c.md`.
//!
//! How it is built:
//! - **Opaque handles** (`lh_locks`, `lh_lease`, `lh_cancel`, `lh_error`, the options): Rust
//!   values boxed and handed out as pointers; the header declares them as incomplete structs.
//! - **Every call returns an [`lh_status`]** and, on failure, an `lh_error` (code, message, and
//!   the holder and time waited of a timeout) through its `err` out-pointer.
//! - **No panic crosses the boundary**: each entry point runs inside [`boundary::call`] (or
//!   [`boundary::value`] for the getters), which turns a panic into `LH_PANIC`.
//! - **One tokio runtime per process**, multi-threaded, made on first use (`runtime.rs`). A
//!   blocking call runs its future with `block_on` on the caller's thread; an `lh_cancel` fired
//!   from any thread ends it (`cancel.rs`).
//! - Modules by concern: `status.rs` the codes and `lh_error`, `boundary.rs` the panic boundary
//!   and pointer checks, `options.rs` the option handles, `locks.rs` connecting and acquiring,
//!   `lease.rs` the held lease and its events.

// The C names (`lh_locks`, `LH_OK`) are the API.
#![allow(non_camel_case_types)]

mod boundary;
mod cancel;
mod lease;
mod locks;
mod options;
mod runtime;
mod status;

pub use cancel::{lh_cancel, lh_cancel_fire, lh_cancel_free, lh_cancel_is_fired, lh_cancel_new};
pub use lease::{
    lh_lease, lh_lease_fence, lh_lease_free, lh_lease_handoff_waiter, lh_lease_holder,
    lh_lease_is_current, lh_lease_key, lh_lease_lost_reason, lh_lease_record_json,
    lh_lease_release, lh_lease_stop_by_ns, lh_lease_token, lh_lease_valid_until_ns,
    lh_lease_wait_event, lh_release_outcome, LH_EVENT_HANDOFF_REQUESTED, LH_EVENT_LOST,
    LH_EVENT_MUST_STOP, LH_EVENT_RELEASED,
};
pub use locks::{
    lh_lock_acquire, lh_lock_try_acquire, lh_locks, lh_locks_connect, lh_locks_force_release,
    lh_locks_free, lh_locks_holder, lh_locks_inspect, lh_locks_store, lh_rwlock_acquire,
    lh_rwlock_try_acquire, lh_semaphore_acquire, lh_semaphore_try_acquire, LH_RW_READ, LH_RW_WRITE,
};
pub use options::{
    lh_connect_options, lh_connect_options_free, lh_connect_options_new,
    lh_connect_options_set_holder, lh_connect_options_set_local_layer, lh_lock_options,
    lh_lock_options_add_label, lh_lock_options_free, lh_lock_options_new,
    lh_lock_options_set_auto_renew, lh_lock_options_set_backoff_ms,
    lh_lock_options_set_loss_grace_ms, lh_lock_options_set_register_waiter,
    lh_lock_options_set_renew_every_ms, lh_lock_options_set_ttl_ms,
    lh_lock_options_set_wait_forever, lh_lock_options_set_wait_ms,
    lh_lock_options_set_waiter_ttl_ms,
};
pub use runtime::{lh_monotonic_now_ns, lh_settle};
pub use status::{
    lh_error, lh_error_code, lh_error_free, lh_error_holder, lh_error_key, lh_error_message,
    lh_error_retryable, lh_error_waited_ms, lh_status, lh_status_name, lh_string_free, lh_version,
};

/// The handles documented thread-safe are `Send + Sync` (checked when this crate compiles).
const _: fn() = || {
    fn thread_safe<T: Send + Sync>() {}
    thread_safe::<lh_locks>();
    thread_safe::<lh_lease>();
    thread_safe::<lh_cancel>();
    thread_safe::<lh_error>();
    thread_safe::<lh_lock_options>();
    thread_safe::<lh_connect_options>();
};
