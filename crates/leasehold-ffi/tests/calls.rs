//! The C entry points called from Rust: what the C program does not show (waits ended from
//! another thread, timeouts, the local layer on `memory://`; must-stop before lost when Redis
//! stops answering).

use leasehold::*;
use std::ffi::{c_char, CStr, CString};
use std::ptr::null_mut;

/// A pointer that may cross threads (the handles are thread-safe).
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: the handles it carries are documented thread-safe.
unsafe impl<T> Send for Shared<T> {}

fn c(s: &str) -> CString {
    CString::new(s).unwrap_or_else(|e| panic!("{e}"))
}

/// `status`, failing the test with the error's message unless it is `want`.
fn expect(status: lh_status, err: *mut lh_error, want: lh_status) {
    if status != want {
        // SAFETY: `err` is NULL or the error the call made.
        let message = unsafe { CStr::from_ptr(lh_error_message(err)) };
        panic!("expected {want:?}, got {status:?}: {message:?}");
    }
    // SAFETY: as above, freed once.
    unsafe { lh_error_free(err) };
}

fn connect(local_layer: bool) -> *mut lh_locks {
    connect_to("memory://", local_layer)
}

fn connect_to(url: &str, local_layer: bool) -> *mut lh_locks {
    let url = c(url);
    let mut err = null_mut();
    let (mut opts, mut locks) = (null_mut(), null_mut());
    // SAFETY: out-pointers to locals; the options are freed once.
    unsafe {
        expect(
            lh_connect_options_new(&mut opts, &mut err),
            err,
            lh_status::LH_OK,
        );
        let st = lh_connect_options_set_local_layer(opts, local_layer, &mut err);
        expect(st, err, lh_status::LH_OK);
        let st = lh_locks_connect(url.as_ptr(), opts, std::ptr::null(), &mut locks, &mut err);
        expect(st, err, lh_status::LH_OK);
        lh_connect_options_free(opts);
    }
    locks
}

fn try_acquire(locks: *mut lh_locks, key: &str) -> (lh_status, *mut lh_lease) {
    let (mut err, mut lease) = (null_mut(), null_mut());
    let key = c(key);
    // SAFETY: a live client, out-pointers to locals.
    let st = unsafe {
        lh_lock_try_acquire(
            locks,
            key.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            &mut lease,
            &mut err,
        )
    };
    // SAFETY: freed once.
    unsafe { lh_error_free(err) };
    (st, lease)
}

fn wait_event(
    lease: *mut lh_lease,
    mask: u32,
    timeout_ms: i64,
    cancel: *mut lh_cancel,
) -> (lh_status, u32) {
    let (mut err, mut events) = (null_mut(), 0);
    // SAFETY: a live lease and cancel handle (or NULL), out-pointers to locals.
    let st = unsafe { lh_lease_wait_event(lease, mask, timeout_ms, cancel, &mut events, &mut err) };
    // SAFETY: freed once.
    unsafe { lh_error_free(err) };
    (st, events)
}

#[test]
fn an_event_wait_times_out_with_no_event_and_ends_on_a_cancel_or_a_release_from_another_thread() {
    let locks = connect(true);
    let (st, lease) = try_acquire(locks, "events");
    assert_eq!(st, lh_status::LH_OK);
    let all = LH_EVENT_LOST | LH_EVENT_MUST_STOP | LH_EVENT_HANDOFF_REQUESTED;
    assert_eq!(wait_event(lease, all, 0, null_mut()), (lh_status::LH_OK, 0));
    assert_eq!(
        wait_event(lease, all, 20, null_mut()),
        (lh_status::LH_OK, 0)
    );

    // A wait without a limit, ended by a cancel fired on this thread.
    let (mut cancel, mut err) = (null_mut(), null_mut());
    // SAFETY: out-pointers to locals.
    expect(
        unsafe { lh_cancel_new(&mut cancel, &mut err) },
        err,
        lh_status::LH_OK,
    );
    let (l, k) = (Shared(lease), Shared(cancel));
    let waiting = std::thread::spawn(move || {
        let (l, k) = (l, k);
        wait_event(l.0, all, -1, k.0)
    });
    // SAFETY: a live cancel handle.
    unsafe { lh_cancel_fire(cancel) };
    assert_eq!(waiting.join().ok(), Some((lh_status::LH_CANCELLED, 0)));
    // SAFETY: no running call uses it any more.
    unsafe { lh_cancel_free(cancel) };

    // A wait for loss only, ended by the release.
    let l = Shared(lease);
    let waiting = std::thread::spawn(move || {
        let l = l;
        wait_event(l.0, LH_EVENT_LOST, -1, null_mut())
    });
    let mut outcome = lh_release_outcome::LH_RELEASE_LOST;
    // SAFETY: a live lease, out-pointers to locals.
    let st = unsafe { lh_lease_release(lease, std::ptr::null(), &mut outcome, &mut err) };
    expect(st, err, lh_status::LH_OK);
    assert_eq!(outcome, lh_release_outcome::LH_RELEASE_DONE);
    assert_eq!(
        waiting.join().ok(),
        Some((lh_status::LH_OK, LH_EVENT_RELEASED))
    );
    // SAFETY: freed once, no call running on them.
    unsafe {
        lh_lease_free(lease);
        lh_locks_free(locks);
    }
}

#[test]
fn a_cancelled_acquisition_leaves_nothing_queued_in_the_local_layer() {
    let locks = connect(true);
    let (_, held) = try_acquire(locks, "local");
    assert!(!held.is_null());
    let (mut cancel, mut err) = (null_mut(), null_mut());
    // SAFETY: out-pointers to locals.
    expect(
        unsafe { lh_cancel_new(&mut cancel, &mut err) },
        err,
        lh_status::LH_OK,
    );
    let (l, k) = (Shared(locks), Shared(cancel));
    let (started, starting) = std::sync::mpsc::channel();
    let waiting = std::thread::spawn(move || {
        let (l, k) = (l, k);
        let (mut err, mut lease) = (null_mut(), null_mut::<lh_lease>());
        let _ = started.send(());
        // SAFETY: live handles, out-pointers to locals.
        let st = unsafe {
            lh_lock_acquire(
                l.0,
                c"local".as_ptr(),
                std::ptr::null(),
                k.0,
                &mut lease,
                &mut err,
            )
        };
        // SAFETY: freed once.
        unsafe { lh_error_free(err) };
        (st, lease.is_null())
    });
    // Fired as the waiter starts, or while it waits in the local layer: either way nothing is
    // left behind.
    let _ = starting.recv();
    // SAFETY: a live cancel handle.
    unsafe { lh_cancel_fire(cancel) };
    assert_eq!(waiting.join().ok(), Some((lh_status::LH_CANCELLED, true)));
    // SAFETY: live handles; freed once.
    unsafe {
        let st = lh_lease_release(held, std::ptr::null(), null_mut(), &mut err);
        expect(st, err, lh_status::LH_OK);
        lh_lease_free(held);
        lh_cancel_free(cancel);
    }
    // Nobody is left queued for the key: it is free at once.
    let (st, next) = try_acquire(locks, "local");
    assert_eq!(st, lh_status::LH_OK);
    // SAFETY: freed once (released in the background).
    unsafe {
        lh_lease_free(next);
        lh_locks_free(locks);
    }
}

#[test]
fn strings_handed_out_are_the_callers_and_static_ones_are_not() {
    // SAFETY: static strings.
    let name = unsafe { CStr::from_ptr(lh_status_name(lh_status::LH_CANCELLED as u32)) };
    assert_eq!(name.to_str().ok(), Some("LH_CANCELLED"));
    // SAFETY: as above.
    let version = unsafe { CStr::from_ptr(lh_version()) };
    assert_eq!(version.to_str().ok(), Some(env!("CARGO_PKG_VERSION")));
    let locks = connect(false);
    let (_, lease) = try_acquire(locks, "json");
    let (mut json, mut err): (*mut c_char, _) = (null_mut(), null_mut());
    // SAFETY: live handles, out-pointers to locals; each string freed once.
    unsafe {
        expect(
            lh_lease_record_json(lease, &mut json, &mut err),
            err,
            lh_status::LH_OK,
        );
        assert!(CStr::from_ptr(json)
            .to_string_lossy()
            .contains("\"key\":\"json\""));
        lh_string_free(json);
        let st = lh_locks_inspect(
            locks,
            c"json".as_ptr(),
            std::ptr::null(),
            &mut json,
            &mut err,
        );
        expect(st, err, lh_status::LH_OK);
        assert!(!json.is_null());
        lh_string_free(json);
        assert_eq!(
            CStr::from_ptr(lh_lease_key(lease)).to_str().ok(),
            Some("json")
        );
        // A lease outlives its client.
        lh_locks_free(locks);
        assert!(lh_lease_is_current(lease));
        let st = lh_lease_release(lease, std::ptr::null(), null_mut(), &mut err);
        expect(st, err, lh_status::LH_OK);
        lh_lease_free(lease);
    }
}

#[test]
fn must_stop_comes_at_the_stop_by_deadline_then_lost_at_valid_until_when_the_store_is_cut_off() {
    let redis = leasehold_testkit::servers::shared_redis();
    let proxy = leasehold_testkit::proxy::TcpProxy::start(redis.port);
    let locks = connect_to(&format!("redis://127.0.0.1:{}/0", proxy.port), true);
    let key = c(&format!("{}cut", leasehold_testkit::prefix("c/")));
    let (mut err, mut opts, mut lease) = (null_mut(), null_mut(), null_mut());
    // SAFETY: live handles, out-pointers to locals.
    unsafe {
        expect(
            lh_lock_options_new(&mut opts, &mut err),
            err,
            lh_status::LH_OK,
        );
        expect(
            lh_lock_options_set_ttl_ms(opts, 1500, &mut err),
            err,
            lh_status::LH_OK,
        );
        let st = lh_lock_options_set_renew_every_ms(opts, 100, &mut err);
        expect(st, err, lh_status::LH_OK);
        let st = lh_lock_acquire(
            locks,
            key.as_ptr(),
            opts,
            std::ptr::null(),
            &mut lease,
            &mut err,
        );
        expect(st, err, lh_status::LH_OK);
    }
    proxy.pause(); // renewals get no answer
    let stop = LH_EVENT_MUST_STOP | LH_EVENT_LOST;
    assert_eq!(
        wait_event(lease, stop, 10_000, null_mut()),
        (lh_status::LH_OK, LH_EVENT_MUST_STOP)
    );
    // SAFETY: a live lease.
    let (now, stop_by, valid_until) = unsafe {
        (
            lh_monotonic_now_ns(),
            lh_lease_stop_by_ns(lease),
            lh_lease_valid_until_ns(lease),
        )
    };
    assert!(
        stop_by <= now && now < valid_until,
        "{stop_by} ≤ {now} < {valid_until}"
    );
    // SAFETY: a live lease.
    assert!(
        unsafe { lh_lease_is_current(lease) },
        "still ours until valid_until"
    );
    // Waiting for loss alone: it comes at valid_until, with must-stop still due.
    let (st, _) = wait_event(lease, LH_EVENT_LOST, 10_000, null_mut());
    assert_eq!(st, lh_status::LH_OK);
    let (st, events) = wait_event(lease, stop, 0, null_mut());
    assert_eq!(
        (st, events),
        (lh_status::LH_OK, LH_EVENT_LOST | LH_EVENT_MUST_STOP)
    );
    assert!(lh_monotonic_now_ns() >= valid_until);
    proxy.resume();
    // SAFETY: live handles; each freed once.
    unsafe {
        let st = lh_lease_release(lease, std::ptr::null(), null_mut(), &mut err);
        expect(st, err, lh_status::LH_LOST);
        lh_lease_free(lease);
        lh_lock_options_free(opts);
        lh_locks_free(locks);
    }
}
